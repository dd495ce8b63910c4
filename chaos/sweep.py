"""``python -m chaos.sweep``: many seeded chaos runs, a few at a time, and one table of verdicts.

    python -m chaos.sweep --seeds 1000-1019 --nodes 5 --time-limit-s 240 --nemesis all --parallel 2
    python -m chaos.sweep --seeds 90413,90413,90413 --out DIR

Each run is ``python -m chaos`` in its own process with its own output directory
(``DIR/seed-<seed>-<n>``); the table (``DIR/sweep.md``, also printed) gives per run
the seed, client operations, the checkers' verdicts and, for an invalid run, what
its summary says. A seed may repeat: runs depend on timing, so one seed is worth
several runs. Exit status 0 when every run is valid, 1 otherwise.

Must not import: any rcq module (it runs the harness as a user would).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKERS = ("total_queue", "atomicity", "aborted_return", "convergence", "membership", "liveness")


def parse_seeds(text: str) -> list[int]:
    """'1-3,7,7' -> [1, 2, 3, 7, 7]."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        first, dash, last = part.partition("-")
        if dash:
            if int(last) < int(first):
                raise ValueError(f"empty seed range {part}")
            seeds.extend(range(int(first), int(last) + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise ValueError("no seeds")
    return seeds


def run_one(seed: int, out: Path, chaos_args: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    with (out.parent / f"{out.name}.log").open("w") as log:
        done = subprocess.run([sys.executable, "-m", "chaos", "--seed", str(seed), "--out", str(out), "--quiet",
                               *chaos_args], stdout=log, stderr=subprocess.STDOUT, check=False)
    row: dict[str, Any] = {"seed": seed, "out": out.name, "exit": done.returncode,
                           "wall_s": round(time.monotonic() - started)}
    results_path = out / "results.json"
    if not results_path.is_file():
        row["verdict"] = "NO RESULT"
        return row
    document = json.loads(results_path.read_text())
    results = document.get("results", {})
    row["verdict"] = "valid" if document.get("valid") else "INVALID"
    row["ops"] = results.get("stats", {}).get("client_ops")
    row["checkers"] = {name: results[name].get("valid") for name in CHECKERS if name in results}
    if not document.get("valid"):
        summary = (out / "summary.txt").read_text() if (out / "summary.txt").is_file() else ""
        row["why"] = [line.strip() for line in summary.splitlines() if line.strip().startswith("INVALID")]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| seed | run dir | client ops | verdict | failed checkers | wall s |", "|---|---|---|---|---|---|"]
    for row in rows:
        failed = ", ".join(name for name, ok in row.get("checkers", {}).items() if not ok) or "-"
        lines.append(f"| {row['seed']} | {row['out']} | {row.get('ops', '-')} | {row['verdict']} | {failed} "
                     f"| {row['wall_s']} |")
    valid = sum(1 for row in rows if row["verdict"] == "valid")
    lines.append(f"\n{valid} of {len(rows)} runs valid.")
    for row in rows:
        for line in row.get("why", []):
            lines.append(f"- seed {row['seed']} ({row['out']}): {line}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", required=True, help="e.g. 1000-1019 or 90413,90413,7")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")
    args, chaos_args = p.parse_known_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.parallel < 1:
        print("error: --parallel must be at least 1", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="rcq-chaos-sweep-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"sweep of {len(seeds)} runs, {args.parallel} at a time, output in {out}", file=sys.stderr, flush=True)
    jobs = [(seed, out / f"seed-{seed}-{n}") for n, seed in enumerate(seeds)]
    rows: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = {pool.submit(run_one, seed, run_out, chaos_args): seed for seed, run_out in jobs}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            rows.append(row)
            print(f"seed {row['seed']}: {row['verdict']} ({row.get('ops', '-')} ops, {row['wall_s']} s)",
                  file=sys.stderr, flush=True)
    order = {run_out.name: n for n, (_seed, run_out) in enumerate(jobs)}
    rows.sort(key=lambda row: order[row["out"]])
    text = table(rows)
    (out / "sweep.md").write_text(text)
    (out / "sweep.json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0 if all(row["verdict"] == "valid" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
