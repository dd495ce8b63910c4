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
   could not restart one from what its disk kept): then every later wait looks once;
4. drain every queue completely, dead-letter queues included (poison is
   rejected out of workload queues, never committed);
5. wait for quiet and record every node's state digest, the leader's view of the
   voting members (on a target that can change membership), the leader samples,
   the transactions still open and every queue's replicated counters
   (checker inputs);
6. run the checkers and write ``history.jsonl``, ``results.json``,
   ``summary.txt`` and ``timeline.png`` into the output directory.

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

from chaos.checkers import check
from chaos.cluster import ChaosCluster, previous_release
from chaos.docker_cluster import DockerCluster
from chaos.executor import RETRY_TIMEOUT_S, OpenTransactions, error_name, make_client
from chaos.generator import Generator, Topology, queue_names
from chaos.history import CHECKER_INPUT_PROCESS, HistoryWriter, read_history
from chaos.intruder import (
    GUEST_QUEUE,
    INTRUDER_GRANTS,
    INTRUDER_PRINCIPAL,
    IntruderGenerator,
    run_intruder,
)
from chaos.membership import FINAL_VIEW_TIMEOUT_S, final_view
from chaos.nemesis import Nemesis
from chaos.report import summary_text, write_results
from chaos.target import ChaosTarget, membership_control, token_issuer
from chaos.workload import configure_queues, drain, run_worker

LEADER_SAMPLE_EVERY_S = 0.25
PROGRESS_EVERY_S = 5.0
DRAIN_PROCESS = 100_000
SETUP_PROCESS = 100_001
INTRUDER_PROCESS = 100_002
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
    # Each node's data directory on its own powerfs mount (local target; implied by the power nemesis).
    power_fs: bool = False
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
    power_fs = config.power_fs or "power" in config.nemesis
    if config.target == "docker":
        if power_fs:
            raise ValueError("powerfs and the power nemesis need the local target (each node's data directory a FUSE mount)")
        if config.node_overrides:
            raise ValueError("the docker target runs docker-compose.yml's node configuration: no node overrides")
        docker = DockerCluster(config.nodes, base_dir, project=f"rcq-chaos-{config.seed}")
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
                         power_fs=power_fs, previous_release=release)
    progress(f"starting {config.nodes} nodes in {local.base_dir}"
             + (", each data directory on its own powerfs mount" if power_fs else ""))
    return local


async def _main_phases(config: RunConfig, cluster: ChaosTarget, history: HistoryWriter,
                       progress: Progress, timings: dict[str, float], now_s: Callable[[], float]) -> dict[str, Any]:
    queues = queue_names(config.queues)
    topology = Topology.of(queues)  # q0 plain; the others with dead-letter queues, delivery limits, priorities
    urls = cluster.client_urls
    token = cluster.token  # the workload's clients use the cluster's admin token, as the harness does
    counts: dict[str, int] = {}
    nemesis = Nemesis(cluster, history, config.seed, config.nemesis, progress)
    leaders: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampling = asyncio.Event()

    def completed(f: str, type_: str) -> None:
        counts[type_] = counts.get(type_, 0) + 1

    await configure_queues(history, urls, topology, SETUP_PROCESS, token=token)
    intruder_token = await _intruder_token(cluster, history, progress)
    sampler = asyncio.create_task(_sample_leaders(cluster, now_s, leaders, sampling))
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

    if config.before_heal is not None:
        await asyncio.to_thread(config.before_heal, cluster)
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

    def within(timeout_s: float) -> float:
        return 0.0 if nobody_left else timeout_s
    try:
        leader = await asyncio.to_thread(cluster.wait_for_leader, within(config.recovery_timeout_s))
        recovery["leader_after_heal_s"] = round(time.monotonic() - t0, 3)
        await asyncio.to_thread(cluster.wait_for_applied, config.recovery_timeout_s)
        recovery["caught_up_after_heal_s"] = round(time.monotonic() - t0, 3)
        progress(f"recovered: leader node-{leader} after {recovery['leader_after_heal_s']} s, "
                 f"all caught up after {recovery['caught_up_after_heal_s']} s")
    except TimeoutError as exc:
        recovery["error"] = str(exc)
        progress(f"NOT recovered: {exc}")
    timings["recovery_s"] = time.monotonic() - t0

    progress(f"draining {len(topology.all_queues)} queues")
    t0 = time.monotonic()
    drained = await drain(history, urls, topology.all_queues, DRAIN_PROCESS, within(config.drain_timeout_s),
                          token=token, topology=topology)
    timings["drain_s"] = time.monotonic() - t0
    progress(f"drain {'complete' if drained['complete'] else 'INCOMPLETE'}: {drained['drained']}")

    t0 = time.monotonic()
    retry_timeout_s = within(RETRY_TIMEOUT_S)
    await _record_open_transactions(urls, token, history, retry_timeout_s)
    digests, agreed = await asyncio.to_thread(_final_digests, cluster, within(config.convergence_timeout_s))
    if not agreed:
        progress(f"nodes did not converge: {digests}")
    history.info(CHECKER_INPUT_PROCESS, "digests", digests)
    control = membership_control(cluster)
    if control is not None:  # the membership checker: every node a voting member at the end
        members = await asyncio.to_thread(final_view, cluster, control, within(FINAL_VIEW_TIMEOUT_S))
        if members.get("error"):
            progress(f"members not read: {members['error']}")
        history.info(CHECKER_INPUT_PROCESS, "members", members)
    sampling.set()
    await sampler
    history.info(CHECKER_INPUT_PROCESS, "leaders", leaders)
    await _record_queue_stats(history, urls, topology.all_queues, token, retry_timeout_s)
    timings["convergence_s"] = time.monotonic() - t0
    links = cluster.link_faults()
    return {"recovery": recovery, "drain": drained, "fault_windows": nemesis.windows,
            "proxy": links.stats() if links is not None else {"target": cluster.target},
            "unexpected_exits": dict(cluster.unexpected_exits()), "logs": [str(p) for p in cluster.log_paths()]}


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


def _final_digests(cluster: ChaosTarget, timeout_s: float) -> tuple[dict[str, str | None], bool]:
    """Every node's ``"<digest>@<applied_index>"`` (None: no answer), the convergence checker's
    input, and whether they all agreed within ``timeout_s`` (if not: as they are then)."""
    try:
        agreed = cluster.wait_for_convergence(timeout_s, indices=range(len(cluster.nodes)))
    except TimeoutError:
        answers = cluster.digests()
        return {node.node_id: f"{answers[i]['digest']}@{answers[i]['applied_index']}" if i in answers else None
                for i, node in enumerate(cluster.nodes)}, False
    return dict.fromkeys((node.node_id for node in cluster.nodes), f"{agreed['digest']}@{agreed['applied_index']}"), True


async def _sample_leaders(cluster: ChaosTarget, now_s: Callable[[], float], leaders: list[dict[str, Any]],
                          stop: asyncio.Event) -> None:
    """Every node that says it is a serving leader, with its term, at every sample (so the
    checker sees when a leader is there again after a fault, not only when one changes).
    Times are the history's."""
    while not stop.is_set():
        views = await asyncio.to_thread(cluster.statuses)
        now = round(now_s(), 6)
        for i, view in sorted(views.items()):
            if view.get("role") == "leader" and view.get("serving"):
                leaders.append({"time_s": now, "node": cluster.nodes[i].node_id, "term": int(view.get("term") or 0)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), LEADER_SAMPLE_EVERY_S)


async def _report_progress(stop: asyncio.Event, counts: dict[str, int], nemesis: Nemesis, progress: Progress) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S)
        active = ", ".join(f.f for _, f in nemesis.active) or "none"
        progress(f"ops ok {counts.get('ok', 0)} fail {counts.get('fail', 0)} info {counts.get('info', 0)}; "
                 f"faults active: {active}")


async def _record_queue_stats(history: HistoryWriter, urls: list[str], queues: list[str], token: str | None,
                              retry_timeout_s: float) -> None:
    """Every queue's replicated counters (dead-lettered, dropped, expired...) after the drain, as a
    checker input: the features checker holds what the history saw die or vanish to them."""
    stats: dict[str, Any] = {}
    async with make_client(urls, token, retry_timeout_s) as client:
        for queue in queues:
            try:
                answer = await client.stats(queue)
            except Exception as exc:  # not measured: the checker says so
                stats[queue] = {"error": error_name(exc)}
                continue
            stats[queue] = {k: v for k, v in answer.items() if k == "count" or k.endswith("_total")}
    history.info(CHECKER_INPUT_PROCESS, "queue-stats", stats)


async def _record_open_transactions(urls: list[str], token: str | None, history: HistoryWriter,
                                    retry_timeout_s: float) -> None:
    """The chaos transactions still open on the leader after the drain: all are past due by now."""
    try:
        async with make_client(urls, token, retry_timeout_s) as client:
            open_now = await client.transactions("chaos")
    except Exception as exc:  # not measured: the checker says so
        history.info(CHECKER_INPUT_PROCESS, "open-transactions-error", {"error": repr(exc)})
        return
    now_ms = time.time() * 1000
    ages = [(now_ms - float(t.get("created_ms") or now_ms)) / 1000 for t in open_now]
    history.info(CHECKER_INPUT_PROCESS, "open-transactions", {
        "count": len(open_now), "oldest_age_s": round(max(ages), 3) if ages else None,
        "deadline_s": max((float(t.get("timeout_s") or 0) for t in open_now), default=None),
        "transactions": open_now[:20]})


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
    if config.target == "local" and (config.power_fs or "power" in config.nemesis):
        parameters["power_fs"] = True
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


# ----------------------------------------------------------------- timeline
FAULT_COLORS = ("#e6550d", "#3182bd", "#31a354", "#756bb1", "#636363", "#fd8d3c", "#9ecae1", "#a1d99b", "#bcbddc")


def plot_timeline(history: list[dict[str, Any]], path: Path, title: str = "rcq chaos") -> Path:
    """Throughput (ok / fail / info per second) and latency of every workload op over time, with
    each fault window shaded in its colour — the way Jepsen draws them. The intruder's ops are
    left out: its refusals are the system working, not failing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from chaos.checkers import fault_windows
    from chaos.checkers.security import is_security_op
    from chaos.history import pair_ops

    pairs = [p for p in pair_ops(history) if p.completion is not None and not is_security_op(p.f)]
    end_s = max((float(op.get("time_s", 0)) for op in history), default=1.0)
    buckets = int(end_s) + 1
    figure, (throughput, latency) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    styles = {"ok": ("#2ca02c", "."), "fail": ("#d62728", "x"), "info": ("#ff7f0e", "^")}
    for type_, (color, marker) in styles.items():
        per_second = [0] * buckets
        times, latencies = [], []
        for pair in pairs:
            if pair.type != type_:
                continue
            done_s = pair.complete_time_s or 0.0
            per_second[min(buckets - 1, int(done_s))] += 1
            times.append(done_s)
            latencies.append(max(pair.latency_s or 0.0, 1e-4))
        throughput.plot(range(buckets), per_second, color=color, label=type_, linewidth=1)
        latency.scatter(times, latencies, s=4, color=color, marker=marker, label=type_, alpha=0.6)
    windows = [w for w in fault_windows(history) if w["f"] != "snapshot"]
    colors: dict[str, str] = {}
    for window in windows:
        color = colors.setdefault(window["f"], FAULT_COLORS[len(colors) % len(FAULT_COLORS)])
        for axis in (throughput, latency):
            axis.axvspan(window["start_s"], window["stop_s"], color=color, alpha=0.15, linewidth=0)
    throughput.set_ylabel("ops completed / s")
    throughput.set_title(title)
    latency.set_yscale("log")
    latency.set_ylabel("latency (s)")
    latency.set_xlabel("time since start (s)")
    handles, labels = throughput.get_legend_handles_labels()
    handles += [Patch(color=c, alpha=0.3) for c in colors.values()]
    labels += list(colors)
    figure.legend(handles, labels, loc="upper right", fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
