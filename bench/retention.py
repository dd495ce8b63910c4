"""What forgetting costs a replica over a long run: the outcome and idempotency-key tables.

``python -m bench.retention [--size N] [--rounds R] [--per-round K]`` fills a
:class:`~rcq.server.core.retention.TimedTable` with N entries, then runs R rounds of K writes,
each followed by the expiry of what is past the retention (one forget per write: the steady
state of a busy cluster once the retention has passed), and prints µs per write + forget for
each round, beside a plain ``dict`` that forgets its first key (``next(iter(d))``) the same way:
the table's own order before it kept a deque. A cost that grows from round to round is the
fault this measures: a dict whose first keys are deleted walks over their holes on every
``next(iter())`` until it resizes.

Runs server code in process (the state machine's table), like :mod:`bench.stall`.
Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from rcq.server.core.retention import TimedTable


@dataclass(frozen=True, slots=True)
class _Entry:
    at_ms: int


def _table_rounds(size: int, rounds: int, per_round: int) -> list[float]:
    table: TimedTable[_Entry] = TimedTable(retention_ms=size, retention_min_ms=0, entries_max=2 * size + per_round)
    for at in range(size):
        table.put(str(at), _Entry(at))
    figures, at = [], size
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            table.put(str(at), _Entry(at))
            table.expire(at + 1)
            at += 1
        figures.append((time.perf_counter() - started) / per_round * 1e6)
    return figures


def _dict_rounds(size: int, rounds: int, per_round: int) -> list[float]:
    entries = {str(at): _Entry(at) for at in range(size)}
    figures, at = [], size
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            entries[str(at)] = _Entry(at)
            horizon = at + 1 - size
            while entries:
                key = next(iter(entries))
                if entries[key].at_ms >= horizon:
                    break
                del entries[key]
            at += 1
        figures.append((time.perf_counter() - started) / per_round * 1e6)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=500_000, help="entries in the table (default 500,000)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=20_000, help="writes (and forgets) per round")
    args = parser.parse_args(argv)
    table = _table_rounds(args.size, args.rounds, args.per_round)
    plain = _dict_rounds(args.size, args.rounds, args.per_round)
    print(f"{args.size:,} entries, {args.per_round:,} writes + forgets per round: µs per write + forget")
    print(f"{'round':>5}  {'TimedTable':>10}  {'dict, next(iter())':>18}")
    for number, (mine, theirs) in enumerate(zip(table, plain, strict=True), start=1):
        print(f"{number:>5}  {mine:>10.2f}  {theirs:>18.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
