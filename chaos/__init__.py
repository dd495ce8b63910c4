"""chaos: a Jepsen-style harness that tries hard to make rcq lose, duplicate or invent items.

Run it as ``python -m chaos --nodes 5 --time-limit-s 600 --nemesis all --seed 42 --out DIR``.
The parts: ``target`` (what a cluster under test must offer), ``cluster`` (rcq's cluster
harness with every link through ``netproxy``, the fault-injecting TCP proxy),
``docker_cluster`` (the same protocol on docker-compose), ``nemesis`` (faults; ``faults``
makes them, ``membership`` the membership changes through the admin API),
``workload`` (the workers; ``generator`` draws their seeded ops, ``executor`` runs each as a
client and says ok, fail or info), ``history`` (the JSONL record), ``checkers`` (verdicts,
and ``checkers.report`` their summary), ``runner`` (phases; ``checker_inputs`` what it records
besides the ops, ``timeline`` its picture), ``sweep`` (many seeds, one table).

A black box: nothing here imports rcq but rcq.client, rcq.errors and the cluster harness of
rcq.testing (real node processes, their polls and waits). ``powerfs`` (a disk that loses what
was not synced, for the power nemesis) is the harness's own. Run from a checkout: the
package is not in rcq's wheel.
"""
