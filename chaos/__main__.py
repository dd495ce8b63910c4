"""``python -m chaos``: one chaos run against a local cluster (default) or docker-compose.

    python -m chaos --nodes 5 --time-limit-s 600 --nemesis all --seed 42 --out DIR
    python -m chaos --nemesis kill,pause,partition --time-limit-s 60
    python -m chaos --target docker      # docker-compose.yml on Docker or Podman; says so plainly if neither runs
    python -m chaos --target docker --engine podman --nemesis kill,pause,partition,wipe --seed 7 --time-limit-s 60
    python -m chaos --nemesis power      # power failures: each data directory on its own powerfs mount
    python -m chaos --partitions 3 --nemesis kill,kill-partition-process   # queues over p0, p1, p2
    python -m chaos --partitions 3 --spread-queues 2 --nemesis kill,pause-partition-process   # and s0, s1 over all

``--target docker`` runs docker-compose.yml's 3 nodes as a compose project and
injects faults with the engine's CLI (kill, pause, whole-node network partitions,
wipe, snapshot; see chaos.docker_cluster). ``--engine`` (default auto) picks Docker only when
``docker version`` reaches an engine and ``docker compose version`` answers, else Podman with
podman-compose (cluster.engine). No proxy there, so one-way, client-partition,
delay and loss are refused there, as are membership (its nodes advertise host ports the leader
cannot probe from its container), --node-override and --nodes other than 3.

``--nemesis membership`` (local target) removes a voting member through the leader, the leader
itself sometimes, and re-adds it when the fault stops, its data kept or wiped (chaos.membership);
the run ends with every node a voting member, which the ``membership`` checker holds it to.

``--nemesis upgrade`` (local target) restarts nodes into the previous release of rcq, taken from the
repository's history at the start (a shallow clone has none: the run refuses, exit status 2), and
back; the nodes hold the cluster at feature level 1 meanwhile.

``--power-fs`` (implied by ``--nemesis power`` or ``disk-stall``; local target only) puts each
node's data directory on its own powerfs mount (chaos.powerfs, FUSE): a disk that keeps writes
not made durable in memory, so the ``power`` nemesis can drop them, and whose syncs the
``disk-stall`` nemesis can make hang. With it, ``all`` includes both; without it, neither. It
needs FUSE (/dev/fuse, libfuse3, mfusepy); the run refuses to start, saying why, when FUSE cannot
work here.

Exit status: 0 valid, 1 invalid (lost, duplicated, unexpected items, divergence...),
2 the run could not be made (no container engine, bad arguments).

Must not import: any rcq module but rcq.client, rcq.errors and rcq.testing's cluster harness
(chaos.powerfs says why FUSE cannot work).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from chaos.docker_cluster import COMPOSE_NODES, DockerError
from chaos.nemesis import DOCKER_KINDS, KINDS, NEEDS_PARTITIONS, NEEDS_POWER_FS, check_target, parse_kinds
from chaos.powerfs import fuse_unavailable_reason
from chaos.runner import Progress, RunConfig, run
from cluster.engine import ENGINES, EngineUnavailable, choose_engine
from rcq.local.releases import ReleaseUnavailable


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    p.add_argument("--time-limit-s", type=float, default=60.0, help="workload + nemesis duration (default 60)")
    p.add_argument("--nemesis", default="kill,pause,partition",
                   help=f"comma-separated faults from {', '.join(KINDS)}; 'all' or 'none' (default kill,pause,partition; "
                        f"with --target docker: {', '.join(DOCKER_KINDS)}, and 'all' means those)")
    p.add_argument("--seed", type=int, default=None, help="reproduce a run (default: random, printed)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")
    p.add_argument("--workers", type=int, default=6, help="concurrent client workers (default 6)")
    p.add_argument("--queues", type=int, default=3, help="queues the workload uses (default 3)")
    p.add_argument("--target", choices=("local", "docker"), default="local",
                   help="local processes (default) or the docker-compose cluster")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="with --target docker: docker (an engine and its compose plugin), podman (with podman-compose), "
                        "or auto (default): docker when both answer, else podman")
    p.add_argument("--node-override", action="append", default=[], metavar="FIELD=JSON",
                   help="extra NodeConfig field for every node, e.g. unsafe_memory_journal=true")
    p.add_argument("--log-level", default="INFO", help="the nodes' log level (local target only)")
    p.add_argument("--power-fs", action="store_true",
                   help="each node's data directory on its own powerfs mount, a disk that drops unsynced "
                        "writes on a power cut and whose syncs can stall (FUSE; local target only; implied by "
                        "--nemesis power or disk-stall; with it, 'all' includes both)")
    p.add_argument("--partitions", type=int, default=1,
                   help="partitions p0 ... p{N-1} (docs/partitions.md; local target): the queues are placed over them "
                        "and the partition nemeses can run (kill-, pause-partition-process, move-leaders, "
                        "partition-lifecycle; default 1: p0 alone)")
    p.add_argument("--spread-queues", type=int, default=0, metavar="N",
                   help="N spread queues more (s0 ...), each with a fragment in every partition (docs/partitions.md, "
                        "'Spread queues'; needs --partitions 2 or more), moves between them, and the starvation probe "
                        "(default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        kinds = parse_kinds(args.nemesis, power_fs=args.power_fs,
                            all_kinds=DOCKER_KINDS if args.target == "docker" else None)
        asked_all = "all" in (k.strip() for k in args.nemesis.split(","))  # maybe with more (all,backup)
        check_target(kinds, args.target)
        if args.partitions < 1:
            raise ValueError("--partitions counts p0: at least 1")
        if args.spread_queues < 0 or (args.spread_queues and args.partitions < 2):
            raise ValueError("--spread-queues needs --partitions 2 or more (and is not negative)")
        if args.partitions > 1 and args.target != "local":
            raise ValueError("--partitions needs --target local (each node's partition ports)")
        needing = [k for k in kinds if k in NEEDS_PARTITIONS]
        if needing and args.partitions < 2 and not asked_all:
            raise ValueError(f"nemesis {', '.join(needing)} needs --partitions 2 or more")
        if args.partitions > 1 and "upgrade" in kinds:
            if not asked_all:
                raise ValueError("--partitions and nemesis upgrade exclude each other: partitions need feature level "
                                 "4, and the previous release holds the cluster at level 1")
            kinds = [k for k in kinds if k != "upgrade"]  # all, with partitions: every kind that can run
        overrides = {}
        for item in args.node_override:
            field, _, text = item.partition("=")
            overrides[field] = json.loads(text)
        if args.target == "docker":
            if args.nodes != COMPOSE_NODES:
                raise ValueError(f"--target docker runs docker-compose.yml's {COMPOSE_NODES} nodes; "
                                 f"--nodes {args.nodes} needs --target local")
            if overrides:
                raise ValueError("--node-override needs --target local: docker-compose.yml fixes the nodes' configuration")
            if args.power_fs:
                raise ValueError("--power-fs needs --target local: each node's data directory becomes a FUSE mount")
        elif args.power_fs or any(k in NEEDS_POWER_FS for k in kinds):
            reason = fuse_unavailable_reason()
            if reason is not None:
                raise ValueError(f"--power-fs / --nemesis power or disk-stall cannot work here: {reason}")
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.target == "docker":
        try:
            engine = choose_engine(args.engine)
        except EngineUnavailable as exc:
            print(f"{exc}\nThe docker target needs Docker with its compose plugin, or Podman with podman-compose "
                  "(docs/deploy.md); use --target local (the default) here.", file=sys.stderr)
            return 2
        print(f"engine: {engine.version}", file=sys.stderr)
        if args.log_level.upper() != "INFO":
            print("note: --log-level is ignored with --target docker (the compose nodes log at INFO)", file=sys.stderr)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix=f"rcq-chaos-{seed}-"))
    config = RunConfig(nodes=args.nodes, time_limit_s=args.time_limit_s, nemesis=kinds, seed=seed, out=out,
                       workers=args.workers, queues=args.queues, node_overrides=overrides, log_level=args.log_level,
                       target=args.target, power_fs=args.power_fs, engine=args.engine, partitions=args.partitions,
                       spread_queues=args.spread_queues)
    print(f"chaos run: seed {seed}, output in {out}", file=sys.stderr, flush=True)
    try:
        document = run(config, Progress(quiet=args.quiet))
    except DockerError as exc:  # the compose project could not be run or driven as needed
        print(f"error: {args.engine if args.engine != 'auto' else 'container engine'}: {exc}", file=sys.stderr)
        return 2
    except ReleaseUnavailable as exc:  # --nemesis upgrade without the previous release in the history
        print(f"error: the upgrade nemesis needs the previous release of rcq: {exc}", file=sys.stderr)
        return 2
    print(f"results: {out / 'results.json'}\nsummary: {out / 'summary.txt'}\ntimeline: {out / 'timeline.png'}")
    return 0 if document["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
