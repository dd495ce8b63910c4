"""``python -m chaos``: one chaos run against a local cluster (default) or docker-compose.

    python -m chaos --nodes 5 --time-limit-s 600 --nemesis all --seed 42 --out DIR
    python -m chaos --nemesis kill,pause,partition --time-limit-s 60
    python -m chaos --target docker      # needs a Docker engine; says so plainly if there is none

Exit status: 0 valid, 1 invalid (lost, duplicated, unexpected items, divergence...),
2 the run could not be made (no Docker engine, bad arguments).

Must not import: any rcq module but rcq.client and rcq.errors.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from chaos.nemesis import KINDS, parse_kinds
from chaos.runner import RunConfig, run

DOCKER_INFO_TIMEOUT_S = 20.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    p.add_argument("--time-limit-s", type=float, default=60.0, help="workload + nemesis duration (default 60)")
    p.add_argument("--nemesis", default="kill,pause,partition",
                   help=f"comma-separated faults from {', '.join(KINDS)}; 'all' or 'none' (default kill,pause,partition)")
    p.add_argument("--seed", type=int, default=None, help="reproduce a run (default: random, printed)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")
    p.add_argument("--workers", type=int, default=6, help="concurrent client workers (default 6)")
    p.add_argument("--queues", type=int, default=3, help="queues the workload uses (default 3)")
    p.add_argument("--target", choices=("local", "docker"), default="local",
                   help="local processes (default) or the docker-compose cluster")
    p.add_argument("--node-override", action="append", default=[], metavar="FIELD=JSON",
                   help="extra NodeConfig field for every node, e.g. unsafe_memory_journal=true")
    p.add_argument("--log-level", default="INFO", help="the nodes' log level")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def docker_engine_error() -> str | None:
    """None when a Docker engine answers; otherwise why not, in plain words."""
    if shutil.which("docker") is None:
        return "no Docker engine: the docker command is not installed"
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=DOCKER_INFO_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine: `docker info` failed: {exc}"
    if done.returncode != 0:
        return f"no Docker engine: `docker info` failed: {(done.stderr or done.stdout).strip()[:300]}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        kinds = parse_kinds(args.nemesis)
        overrides = {}
        for item in args.node_override:
            field, _, text = item.partition("=")
            overrides[field] = json.loads(text)
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.target == "docker":
        error = docker_engine_error()
        if error is not None:
            print(f"{error}\nThe docker target needs one (docker compose up, docker kill / pause / network "
                  "disconnect); use --target local (the default) here.", file=sys.stderr)
            return 2
        print("a Docker engine answers, but this harness drives docker-compose clusters only through "
              "`docker compose up -d` + the local checks; run docker-compose.yml and point clients at it. "
              "The fault-injecting docker mode is not implemented: use --target local.", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix=f"rcq-chaos-{seed}-"))
    config = RunConfig(nodes=args.nodes, time_limit_s=args.time_limit_s, nemesis=kinds, seed=seed, out=out,
                       workers=args.workers, queues=args.queues, node_overrides=overrides, log_level=args.log_level)
    print(f"chaos run: seed {seed}, output in {out}", file=sys.stderr, flush=True)
    from chaos.runner import Progress

    document = run(config, Progress(quiet=args.quiet))
    print(f"results: {out / 'results.json'}\nsummary: {out / 'summary.txt'}\ntimeline: {out / 'timeline.png'}")
    return 0 if document["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
