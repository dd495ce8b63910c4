"""chaos: a Jepsen-style harness that tries hard to make rcq lose, duplicate or invent items.

Run it as ``python -m chaos --nodes 5 --time-limit-s 600 --nemesis all --seed 42 --out DIR``.
The parts: ``netproxy`` (fault-injecting TCP proxy), ``cluster`` (real node processes
wired through it), ``nemesis`` (faults), ``workload`` (seeded client ops),
``history`` (the JSONL record), ``checker``/``checkers`` (verdicts), ``runner`` (phases
and report), ``docker`` target in ``__main__``.

A black box: nothing here imports rcq but rcq.client and rcq.errors.
"""
