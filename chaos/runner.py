"""One chaos run, phase by phase, and its report.

1. start the cluster under test, a :class:`chaos.target.ChaosTarget`: real
   processes with every link through the proxy (chaos.cluster), or, with
   ``target="docker"``, docker-compose.yml's project (chaos.docker_cluster);
   and wait for a leader. With the ``upgrade`` nemesis, the previous release of rcq is first
   taken from the repository's history (into ``previous-release/`` of the output; no history:
   the run stops at once, saying so) and every node holds the feature level
   (``feature_level_auto`` false), as a node of the previous release may return at any time;
2. configure the queues (chaos.generator.Topology: q0 plain with its own
   max_items, the others with dead-letter queues, delivery limits and
   priorities), then run the workload and the nemesis together for the time limit, sampling who
   leads (for the liveness checker) and printing progress; an intruder with a token of its own
   (chaos.intruder.Intruder) tries what it may not do meanwhile — on the local target, which can
   issue tokens; on docker the history says it was skipped and why;
3. heal everything (stop faults, heal links, resume and restart nodes) and wait
   for a leader and for every node to catch up — unless every node has exited (a heal that
   could not restart one from what its disk kept): then every later wait looks once. With the
   ``backup`` nemesis and no backup restored under the faults, one more is taken, restored and
   checked now (chaos.backups, ``after_heal``). With spread
   queues, the starvation probe then runs (chaos.starvation: one consumer alone drains every
   fragment of a spread queue);
4. drain every queue completely, dead-letter queues included (poison is
   rejected out of workload queues, never committed);
5. wait for quiet and record every node's state digest, the leader's view of the
   voting members (on a target that can change membership), the leader samples,
   the transactions still open and every queue's replicated counters
   (checker inputs: chaos.checker_inputs);
6. run the checkers and write ``history.jsonl``, ``results.json``,
   ``summary.txt`` (chaos.checkers.report) and ``timeline.png`` (chaos.timeline) into the output
   directory.

Must not import: any rcq module but rcq.client and rcq.errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.checker_inputs import record_final_state, record_queue_stats, sample_leaders
from chaos.checkers import check
from chaos.checkers.report import summary_text, write_results
from chaos.cluster import ChaosCluster, previous_release
from chaos.docker_cluster import DockerCluster
from chaos.executor import RETRY_TIMEOUT_S, OpenTransactions
from chaos.generator import Generator, Topology, queue_names
from chaos.history import CHECKER_INPUT_PROCESS, HistoryWriter, read_history
from chaos.intruder import (
    GUEST_QUEUE,
    INTRUDER_GRANTS,
    INTRUDER_PRINCIPAL,
    IntruderGenerator,
    run_intruder,
)
from chaos.nemesis import NEEDS_POWER_FS, Nemesis
from chaos.starvation import BOUND_S as STARVATION_BOUND_S
from chaos.starvation import probe_starvation
from chaos.target import ChaosTarget, token_issuer
from chaos.timeline import plot_timeline
from chaos.workload import configure_queues, drain, run_worker

PROGRESS_EVERY_S = 5.0
DRAIN_PROCESS = 100_000
SETUP_PROCESS = 100_001
INTRUDER_PROCESS = 100_002
STARVATION_PROCESS = 100_003
STOP_GRACE_S = 45.0  # workers finish their current op (each bounded by OP_TIMEOUT_S)

HEAL_ERROR_CHARS_MAX = 4000  # a node's log tail rides along; enough to see why it did not start


@dataclasses.dataclass
class RunConfig:
    nodes: int = 3
    time_limit_s: float = 60.0
    nemesis: list[str] = dataclasses.field(default_factory=lambda: ["kill", "pause", "partition"])
    seed: int = 0
    out: Path = Path("chaos-run")
    workers: int = 6
    queues: int = 3
    node_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    recovery_timeout_s: float = 60.0
    drain_timeout_s: float = 120.0
    convergence_timeout_s: float = 60.0
    log_level: str = "INFO"
    target: str = "local"  # or "docker": docker-compose.yml's 3 nodes (chaos.docker_cluster)
    engine: str = "auto"  # with target "docker": auto, docker or podman (cluster.engine)
    # Each node's data directory on its own powerfs mount (local target; implied by the power nemesis).
    power_fs: bool = False
    # Partitions p0 ... p{partitions-1} (docs/partitions.md; local target): the queues are placed over
    # them, and the kill-partition-process nemesis can run.
    partitions: int = 1
    # Spread queues s0 ... (docs/partitions.md, "Spread queues"; partitions > 1): each over every
    # partition, beside the queues placed in one; and the starvation probe (chaos.starvation).
    spread_queues: int = 0
    # A callback between phase 2 and the heal; tests use it to crash nodes on purpose.
    before_heal: Callable[[ChaosTarget], None] | None = None


class Progress:
    def __init__(self, stream: Any = sys.stderr, quiet: bool = False) -> None:
        self.start = time.monotonic()
        self.stream = stream
        self.quiet = quiet

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.start:7.1f}s] {message}", file=self.stream, flush=True)


def run(config: RunConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run it all; returns the results document (also written to ``config.out``)."""
    progress = progress or Progress()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timings: dict[str, float] = {}
    history = HistoryWriter(out / "history.jsonl")
    history_start = time.monotonic()  # within microseconds of the writer's own start

    def now_s() -> float:
        return time.monotonic() - history_start
    cluster: ChaosTarget | None = None
    extra: dict[str, Any] = {}
    try:
        cluster = open_target(config, out / "cluster", progress)
        cluster.start()
        leader = cluster.wait_for_leader(config.recovery_timeout_s)
        if config.partitions > 1:
            assert isinstance(cluster, ChaosCluster)
            cluster.ensure_partitions(config.partitions)
            progress(f"partitions p0 ... p{config.partitions - 1} led")
        progress(f"leader: node-{leader}; workload {config.workers} workers x {config.time_limit_s:.0f} s, "
                 f"nemesis {','.join(config.nemesis) or 'none'}, seed {config.seed}")
        timings["start_s"] = time.monotonic() - started
        extra = asyncio.run(_main_phases(config, cluster, history, progress, timings, now_s))
    finally:
        history.close()
        if cluster is not None:
            cluster.close()
    timings["total_before_check_s"] = time.monotonic() - started
    return _report(config, out, extra, timings, progress)


def open_target(config: RunConfig, base_dir: Path, progress: Progress) -> ChaosTarget:
    """The cluster under test, not started yet (its logs go under ``base_dir``)."""
    power_fs = config.power_fs or any(k in NEEDS_POWER_FS for k in config.nemesis)  # power, disk-stall
    if config.partitions > 1 and "upgrade" in config.nemesis:
        raise ValueError("partitions and the upgrade nemesis exclude each other: partitions need feature level 4, "
                         "and the previous release holds the cluster at level 1")
    if config.spread_queues and config.partitions < 2:
        raise ValueError("spread queues need two partitions or more (--partitions)")
    if config.target == "docker":
        if power_fs:
            raise ValueError("powerfs and the power nemesis need the local target (each node's data directory a FUSE mount)")
        if config.node_overrides:
            raise ValueError("the docker target runs docker-compose.yml's node configuration: no node overrides")
        if config.partitions > 1:
            raise ValueError("partitions need the local target (each node's partition ports)")
        docker = DockerCluster(config.nodes, base_dir, project=f"rcq-chaos-{config.seed}", engine=config.engine)
        progress(f"starting compose project {docker.project} ({config.nodes} nodes); logs in {docker.base_dir}")
        return docker
    if config.target != "local":
        raise ValueError(f"unknown target {config.target!r}: local or docker")
    overrides, release = dict(config.node_overrides), None
    if "upgrade" in config.nemesis:
        release_dir = base_dir.parent / "previous-release"
        shutil.rmtree(release_dir, ignore_errors=True)  # one of an earlier run into the same directory
        release = previous_release(release_dir)
        progress(f"previous release {release.name} ({release.commit[:12]}) made runnable for the upgrade nemesis")
        overrides.setdefault("feature_level_auto", False)  # level 1 while an old node may return
    local = ChaosCluster(config.nodes, config.seed, base_dir, overrides, config.log_level,
                         power_fs=power_fs, previous_release=release, partitions=config.partitions)
    progress(f"starting {config.nodes} nodes in {local.base_dir}"
             + (", each data directory on its own powerfs mount" if power_fs else ""))
    return local


async def _main_phases(config: RunConfig, cluster: ChaosTarget, history: HistoryWriter,
                       progress: Progress, timings: dict[str, float], now_s: Callable[[], float]) -> dict[str, Any]:
    """Phases 2 to 5: the workload and the nemesis, the heal, the drain, the checker inputs."""
    # q0 plain; the others with dead-letter queues, delivery limits, priorities
    topology = Topology.of(queue_names(config.queues), config.partitions, config.spread_queues)
    urls = cluster.client_urls
    token = cluster.token  # the workload's clients use the cluster's admin token, as the harness does
    nemesis = Nemesis(cluster, history, config.seed, config.nemesis, progress)
    leaders: list[dict[str, Any]] = []
    sampling = asyncio.Event()
    await configure_queues(history, urls, topology, SETUP_PROCESS, token=token)
    intruder_token = await _intruder_token(cluster, history, progress)
    sampler = asyncio.create_task(sample_leaders(cluster, now_s, leaders, sampling))
    await _run_workload(config, cluster, history, topology, nemesis, intruder_token, progress, timings)

    if config.before_heal is not None:
        await asyncio.to_thread(config.before_heal, cluster)
    recovery = await _heal(config, cluster, nemesis, progress, timings)
    if nemesis.backups is not None and "error" not in recovery and not recovery.get("every_node_exited"):
        await nemesis.backups.after_heal()  # one checked restore a run, if none was under the faults

    def within(timeout_s: float) -> float:
        return 0.0 if recovery.get("every_node_exited") else timeout_s

    starvation = await probe_starvation(history, urls, topology, STARVATION_PROCESS, now_s, token=token,
                                        bound_s=within(STARVATION_BOUND_S))
    if starvation["ran"]:
        progress("starvation probe: " + "; ".join(
            f"{r['mode']} took {r['taken']} of {r['filled']} in {r['elapsed_s']} s" for r in starvation["rounds"]))
    progress(f"draining {len(topology.all_queues)} queues")
    t0 = time.monotonic()
    drained = await drain(history, urls, topology.all_queues, DRAIN_PROCESS, within(config.drain_timeout_s),
                          token=token, topology=topology)
    timings["drain_s"] = time.monotonic() - t0
    progress(f"drain {'complete' if drained['complete'] else 'INCOMPLETE'}: {drained['drained']}")

    t0 = time.monotonic()
    await record_final_state(cluster, history, within, config.convergence_timeout_s, progress)
    sampling.set()
    await sampler
    history.info(CHECKER_INPUT_PROCESS, "leaders", leaders)
    await record_queue_stats(history, urls, topology.all_queues, token, within(RETRY_TIMEOUT_S))
    timings["convergence_s"] = time.monotonic() - t0
    links = cluster.link_faults()
    return {"recovery": recovery, "drain": drained, "starvation": starvation, "fault_windows": nemesis.windows,
            "proxy": links.stats() if links is not None else {"target": cluster.target},
            "unexpected_exits": dict(cluster.unexpected_exits()), "logs": [str(p) for p in cluster.log_paths()]}


async def _run_workload(config: RunConfig, cluster: ChaosTarget, history: HistoryWriter, topology: Topology,
                        nemesis: Nemesis, intruder_token: str | None, progress: Progress,
                        timings: dict[str, float]) -> None:
    """Phase 2: the workers, the intruder and the nemesis together until the time limit."""
    urls, token, queues = cluster.client_urls, cluster.token, topology.queues
    counts: dict[str, int] = {}
    stop = asyncio.Event()

    def completed(f: str, type_: str) -> None:
        counts[type_] = counts.get(type_, 0) + 1

    reporter = asyncio.create_task(_report_progress(stop, counts, nemesis, progress))
    t0 = time.monotonic()
    registry = OpenTransactions()  # the workers' open transactions: what the intruder tries to hijack
    workers = [asyncio.create_task(run_worker(history, urls, Generator(config.seed, w, queues, topology=topology),
                                              stop, completed, token=token, registry=registry))
               for w in range(config.workers)]
    if intruder_token is not None:
        workers.append(asyncio.create_task(run_intruder(
            history, urls, IntruderGenerator(config.seed, INTRUDER_PROCESS, queues), registry, stop,
            token=intruder_token, node_urls=cluster.node_urls)))
    nemesis_task = asyncio.create_task(nemesis.run(stop))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), config.time_limit_s)
    stop.set()
    progress("time limit reached: stopping the workload and the nemesis")
    done, pending = await asyncio.wait([*workers, nemesis_task], timeout=STOP_GRACE_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            progress(f"a task failed: {task.exception()!r}")
    timings["workload_s"] = time.monotonic() - t0
    reporter.cancel()


async def _heal(config: RunConfig, cluster: ChaosTarget, nemesis: Nemesis, progress: Progress,
                timings: dict[str, float]) -> dict[str, Any]:
    """Phase 3: every fault stopped, then a leader and every node caught up; what it took."""
    progress("healing: every fault stopped, links healed, nodes resumed and restarted")
    t0 = time.monotonic()
    recovery: dict[str, Any] = {}
    try:
        await nemesis.heal()
    except Exception as exc:
        # A node that cannot restart from what its disk kept is a finding, not a harness failure:
        # the run goes on, and the convergence checker finds its state missing.
        recovery["heal_error"] = f"{type(exc).__name__}: {exc}"[:HEAL_ERROR_CHARS_MAX]
        progress(f"heal could not restart every node: {recovery['heal_error'][:300]}")
    # Nothing restarts a node after the heal: when every node has exited, no wait below can end
    # any other way than by its deadline, so each looks once instead (the same checker inputs).
    nobody_left = "heal_error" in recovery and await asyncio.to_thread(
        every_node_exited, cluster, config.recovery_timeout_s)
    if nobody_left:
        recovery["every_node_exited"] = True
        progress("every node has exited: the waits below look once instead of waiting")
    try:
        leader = await asyncio.to_thread(cluster.wait_for_leader, 0.0 if nobody_left else config.recovery_timeout_s)
        recovery["leader_after_heal_s"] = round(time.monotonic() - t0, 3)
        await asyncio.to_thread(cluster.wait_for_applied, config.recovery_timeout_s)
        recovery["caught_up_after_heal_s"] = round(time.monotonic() - t0, 3)
        progress(f"recovered: leader node-{leader} after {recovery['leader_after_heal_s']} s, "
                 f"all caught up after {recovery['caught_up_after_heal_s']} s")
    except TimeoutError as exc:
        recovery["error"] = str(exc)
        progress(f"NOT recovered: {exc}")
    timings["recovery_s"] = time.monotonic() - t0
    return recovery


async def _intruder_token(cluster: ChaosTarget, history: HistoryWriter, progress: Progress) -> str | None:
    """A token for the intruder (produce and consume ``guest*`` only), recorded as a checker input
    with its grants; None, with the reason recorded, when the target cannot issue one."""
    issuer = token_issuer(cluster)
    if issuer is None:
        reason = f"the {cluster.target} target's nodes accept only its admin token"
        history.info(CHECKER_INPUT_PROCESS, "intruder", {"skipped": reason})
        progress(f"no intruder: {reason}")
        return None
    token = await asyncio.to_thread(issuer.add_token, INTRUDER_PRINCIPAL, list(INTRUDER_GRANTS))
    history.info(CHECKER_INPUT_PROCESS, "intruder", {"principal": INTRUDER_PRINCIPAL, "process": INTRUDER_PROCESS,
                                                     "grants": list(INTRUDER_GRANTS), "guest_queue": GUEST_QUEUE})
    progress(f"intruder: principal {INTRUDER_PRINCIPAL!r} (process {INTRUDER_PROCESS}) may use {GUEST_QUEUE}* only")
    return token


def every_node_exited(cluster: ChaosTarget, timeout_s: float) -> bool:
    """Whether every node's process has exited, once each one still starting has either answered
    HTTP (False at once) or exited too; False when that is not settled within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while running := cluster.running_indices():
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return False
        try:
            cluster.wait_for_http(running, left_s)
        except TimeoutError:
            return False
        except Exception:  # one of them exited while starting (NodeStartError): look again
            continue
        return False
    return True


async def _report_progress(stop: asyncio.Event, counts: dict[str, int], nemesis: Nemesis, progress: Progress) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S)
        active = ", ".join(f.f for _, f in nemesis.active) or "none"
        progress(f"ops ok {counts.get('ok', 0)} fail {counts.get('fail', 0)} info {counts.get('info', 0)}; "
                 f"faults active: {active}")


# ------------------------------------------------------------------- report
def _report(config: RunConfig, out: Path, extra: dict[str, Any], timings: dict[str, float],
            progress: Progress) -> dict[str, Any]:
    t0 = time.monotonic()
    ops = read_history(out / "history.jsonl")
    results = check(ops)
    results["runtime"] = {**extra, "timings_s": {k: round(v, 2) for k, v in timings.items()}}
    timings["check_s"] = time.monotonic() - t0
    parameters = {"target": config.target, "nodes": config.nodes, "time_limit_s": config.time_limit_s,
                  "nemesis": ",".join(config.nemesis),
                  "workers": config.workers, "queues": config.queues}
    if config.node_overrides:
        parameters["node_overrides"] = json.dumps(config.node_overrides, sort_keys=True)
    if config.target == "local" and (config.power_fs or any(k in NEEDS_POWER_FS for k in config.nemesis)):
        parameters["power_fs"] = True
    if config.partitions > 1:
        parameters["partitions"] = config.partitions
    if config.spread_queues:
        parameters["spread_queues"] = config.spread_queues
    write_results(out / "results.json", results, config.seed, **parameters)
    summary = summary_text(results, config.seed, **parameters)
    recovery = extra.get("recovery", {})
    summary += (f"  recovery after heal: {recovery}\n  drain: {extra.get('drain')}\n"
                f"  wall times: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()) + "\n")
    (out / "summary.txt").write_text(summary, encoding="utf-8")
    try:
        plot_timeline(ops, out / "timeline.png", title=f"rcq chaos, seed {config.seed}, {config.nodes} nodes")
    except Exception as exc:  # a missing plot must not hide the verdict
        progress(f"timeline not drawn: {exc!r}")
    progress("\n" + summary)
    return {"valid": bool(results["valid"]), "results": results, "summary": summary, "out": str(out)}
