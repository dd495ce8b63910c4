"""A queue spread over several partitions, read and administered as one at a node's own port
(docs/partitions.md, "Spread queues").

A spread queue has one **fragment** in each partition it is placed in: a queue of the same name in
that partition's state, with the same settings. p0's directory lists its partitions. A request
about the whole queue at a node's own port (p0's process) is answered here from every fragment:

* count and stats: each fragment asked (p0's read here, the others at their partition's leader),
  the figures summed, each fragment's under ``by_partition``; a partition that did not answer is
  named in ``unanswered`` (its fragment is missing from the sums). Like a plain queue's count, the
  sum is approximate, and it is not one point in time: each fragment is read when it is asked;
* configure: every fragment gets the same settings, the partitions first and p0's last;
* purge: every fragment purged, ``removed`` summed;
* delete: every fragment deleted, the partitions first, then p0 forgets the placement.

A partition process knows only its own fragment and answers for it alone, as for any queue.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rcq.names import P0
from rcq.server.http.handlers import CONFIG
from rcq.server.http.partition_asker import LEADER_ASKER
from rcq.server.http.partition_routes import (
    PARTITION_DIRECTORY,
    at_partition_leader,
    credentials,
    forward_configure,
)

# Figures of a queue's count and stats that add up over its fragments.
SUMMED = ("count", "depth", "available", "locked", "delayed", "ready", "bytes", "cost_bytes")
# Per-fragment figures that describe one replica's view, not the queue.
PER_FRAGMENT = ("applied_index", "node_id", "role")

Local = Callable[[], Awaitable[tuple[int, dict[str, Any]]]]


def spread_over(app: web.Application, queue: str) -> list[str] | None:
    """The partitions ``queue`` is spread over, when it is spread and this is a node's own port;
    None otherwise (a plain queue, or a partition process: it answers for its fragment)."""
    if app[CONFIG].partition_name is not None:
        return None
    placed = app[PARTITION_DIRECTORY].placed(queue)
    return placed if len(placed) > 1 else None


async def each_fragment(request: web.Request, partitions: list[str], method: str, path: str,
                        local: Local, body: dict[str, Any] | None = None) -> dict[str, tuple[int, dict[str, Any]]]:
    """``method path`` at every fragment's partition (p0's by ``local``), the partitions at once:
    partition -> (status, answer). p0's goes last, after the others answered."""
    app = request.app
    headers = credentials(request)

    async def at(partition: str) -> tuple[int, dict[str, Any]]:
        return await at_partition_leader(app, partition, lambda leader: app[LEADER_ASKER].call(
            method, f"{leader}{path}", headers, body))

    others = [p for p in partitions if p != P0]
    answers = dict(zip(others, await asyncio.gather(*(at(p) for p in others), return_exceptions=True), strict=True))
    if P0 in partitions:
        answers[P0] = await local()
    return {p: a if isinstance(a, tuple) else (503, {"error": {"code": "unavailable", "message": str(a)}})
            for p, a in answers.items()}


def merged_read(queue: str, partitions: list[str], answers: dict[str, tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """One answer for a count or stats of a spread queue, from its fragments' answers."""
    by_partition: dict[str, dict[str, Any]] = {}
    unanswered: list[str] = []
    for partition in partitions:
        status, answer = answers.get(partition, (503, {}))
        if status != 200:
            unanswered.append(partition)
            continue
        by_partition[partition] = {k: v for k, v in answer.items() if k not in ("queue", "settings", "limits")}
    body: dict[str, Any] = {"queue": queue, "approximate": True, "spread": True}
    first = next((answers[p][1] for p in partitions if p in by_partition), {})
    for key, value in first.items():
        if key not in SUMMED and key not in PER_FRAGMENT and key not in ("queue", "approximate"):
            body[key] = value  # the settings, limits and totals' shape: the same in every fragment
    for key in set().union(*(row.keys() for row in by_partition.values())) if by_partition else ():
        values = [row.get(key) for row in by_partition.values()]
        if key in PER_FRAGMENT:
            body.pop(key, None)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            body[key] = sum(values)
        elif key in SUMMED:
            body[key] = None  # a fragment whose leader did not say (a follower's view)
    body["by_partition"] = by_partition
    body.setdefault("settings", {})
    body["settings"] = {**body["settings"], "partitions": partitions}
    if unanswered:
        body["unanswered"] = unanswered
    return body


def merged_write(queue: str, partitions: list[str], answers: dict[str, tuple[int, dict[str, Any]]],
                 summed: tuple[str, ...] = ()) -> tuple[int, dict[str, Any]]:
    """One answer for a configure, purge or delete of every fragment: the first failure as it was
    (the fragments before it are done: the request may be sent again), else the first fragment's
    answer with ``summed`` added up and ``by_partition``."""
    for partition in partitions:
        status, answer = answers[partition]
        if status >= 300:
            return status, {**answer, "partition": partition}
    first = answers[partitions[0]][1]
    body = {**first, "queue": queue, "by_partition": {p: answers[p][1] for p in partitions}}
    for key in summed:
        body[key] = sum(int(answers[p][1].get(key) or 0) for p in partitions)
    if isinstance(body.get("settings"), dict):
        body["settings"] = {**body["settings"], "partitions": partitions}
    return 200, body


async def configure(request: web.Request, queue: str, partitions: list[str], settings: Any, local: Local
                    ) -> tuple[int, dict[str, Any]]:
    """Create or configure every fragment (each partition's signed as placed by p0)."""
    others = [p for p in partitions if p != P0]
    answers = dict(zip(others, await asyncio.gather(*(forward_configure(request, p, queue, settings)
                                                      for p in others)), strict=True))
    if P0 in partitions:
        answers[P0] = await local()
    return merged_write(queue, partitions, answers)


async def purge(request: web.Request, queue: str, partitions: list[str], local: Local) -> tuple[int, dict[str, Any]]:
    answers = await each_fragment(request, partitions, "POST", f"/v1/queues/{queue}/purge", local, {})
    return merged_write(queue, partitions, answers, summed=("removed",))


async def delete(request: web.Request, queue: str, partitions: list[str], local: Local) -> tuple[int, dict[str, Any]]:
    """Delete every fragment, then forget the placement (p0's own delete forgets it as it applies)."""
    answers = await each_fragment(request, partitions, "DELETE", f"/v1/queues/{queue}", local)
    gone = {p: (200, a) if s == 404 and (a.get("error") or {}).get("code") == "queue_not_found" else (s, a)
            for p, (s, a) in answers.items()}
    status, body = merged_write(queue, partitions, gone, summed=("removed",))
    if status == 200:
        await request.app[PARTITION_DIRECTORY].forget(queue)
    return status, body
