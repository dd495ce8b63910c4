"""What the runner records for the checkers besides the ops (``checker-input`` lines): the leaders
sampled through the run (liveness), and after the drain the transactions still open, every node's
state digest and, in a run with partitions, every partition process's (convergence), the voting
members (membership) and every queue's replicated counters (features).

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from chaos.executor import RETRY_TIMEOUT_S, error_name, make_client
from chaos.faults.processes import partition_processes
from chaos.history import CHECKER_INPUT_PROCESS, HistoryWriter
from chaos.membership import FINAL_VIEW_TIMEOUT_S, final_view
from chaos.target import ChaosTarget, membership_control

LEADER_SAMPLE_EVERY_S = 0.25


async def record_final_state(cluster: ChaosTarget, history: HistoryWriter, within: Callable[[float], float],
                             convergence_timeout_s: float, progress: Callable[[str], None]) -> None:
    """After the drain: the transactions still open, every node's digest, and (on a target that can
    change membership) the leader's view of the voting members. ``within``: each wait's bound
    (0 when every node has exited: each looks once)."""
    urls, token = cluster.client_urls, cluster.token
    await record_open_transactions(urls, token, history, within(RETRY_TIMEOUT_S))
    digests, agreed = await asyncio.to_thread(final_digests, cluster, within(convergence_timeout_s))
    if not agreed:
        progress(f"nodes did not converge: {digests}")
    history.info(CHECKER_INPUT_PROCESS, "digests", digests)
    if partition_processes(cluster) is not None:
        by_partition, agreed = await asyncio.to_thread(final_partition_digests, cluster, within(convergence_timeout_s))
        if not agreed:
            progress(f"partitions did not converge: {by_partition}")
        history.info(CHECKER_INPUT_PROCESS, "partition_digests", by_partition)
    control = membership_control(cluster)
    if control is not None:  # the membership checker: every node a voting member at the end
        members = await asyncio.to_thread(final_view, cluster, control, within(FINAL_VIEW_TIMEOUT_S))
        if members.get("error"):
            progress(f"members not read: {members['error']}")
        history.info(CHECKER_INPUT_PROCESS, "members", members)


def final_digests(cluster: ChaosTarget, timeout_s: float) -> tuple[dict[str, str | None], bool]:
    """Every node's ``"<digest>@<applied_index>"`` (None: no answer), the convergence checker's
    input, and whether they all agreed within ``timeout_s`` (if not: as they are then)."""
    try:
        agreed = cluster.wait_for_convergence(timeout_s, indices=range(len(cluster.nodes)))
    except TimeoutError:
        answers = cluster.digests()
        return {node.node_id: f"{answers[i]['digest']}@{answers[i]['applied_index']}" if i in answers else None
                for i, node in enumerate(cluster.nodes)}, False
    return dict.fromkeys((node.node_id for node in cluster.nodes), f"{agreed['digest']}@{agreed['applied_index']}"), True


def final_partition_digests(cluster: ChaosTarget, timeout_s: float) -> tuple[dict[str, dict[str, str | None]], bool]:
    """Each partition but p0: each member's ``"<digest>@<applied_index>"`` from its partition
    process (None: no answer), polled until each partition's agree or ``timeout_s`` passes; and
    whether they all agreed."""
    # the local target's own polls (a run with partitions has it): chaos.target names neither
    poll_json, listing = getattr(cluster, "poll_json"), getattr(cluster, "partitions")  # noqa: B009
    deadline = time.monotonic() + timeout_s
    seen: dict[str, dict[str, str | None]] = {}
    while True:
        try:
            rows = [row for row in listing() if row["name"] != "p0"]
        except OSError:
            rows = []
        seen = {}
        for row in rows:
            members: dict[str, str | None] = {}
            for node_id, url in zip(row["members"], row.get("urls") or [], strict=False):
                try:
                    answer = poll_json(url + "/v1/cluster/digest", 2.0)
                    members[node_id] = f"{answer['digest']}@{answer['applied_index']}"
                except (OSError, KeyError, ValueError):
                    members[node_id] = None
            seen[row["name"]] = members
        agreed = bool(rows) and all(None not in m.values() and len(set(m.values())) == 1 for m in seen.values())
        if agreed or time.monotonic() >= deadline:
            return seen, agreed
        time.sleep(0.25)


async def sample_leaders(cluster: ChaosTarget, now_s: Callable[[], float], leaders: list[dict[str, Any]],
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


async def record_queue_stats(history: HistoryWriter, urls: list[str], queues: list[str], token: str | None,
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


async def record_open_transactions(urls: list[str], token: str | None, history: HistoryWriter,
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
