"""A queue spread over several partitions, read and administered as one at a node's own port
(docs/partitions.md, "Spread queues").

A spread queue has one **fragment** in each partition it is placed in: a queue of the same name in
that partition's state, with the same settings. p0's directory lists its partitions. A request
about the whole queue at a node's own port (p0's process) is answered here from every fragment:

* count and stats: each fragment asked (p0's read here, the others at their partition's leader),
  the figures summed, each fragment's under ``by_partition``; a partition that did not answer is
  named in ``unanswered`` (its fragment is missing from the sums). Like a plain queue's count, the
  sum is approximate, and it is not one point in time: each fragment is read when it is asked;
* configure: every fragment gets the same settings but for ``max_items`` and ``max_bytes``,
  which hold for the whole queue: each fragment holds its share (:func:`fragment_settings`; the
  shares add up to the queue's limit, and a limit below one per fragment is refused), and reads
  show the queue's limit in ``settings``, each fragment's share under ``by_partition``. The
  partitions are configured first and p0's fragment last;
* purge: every fragment purged, ``removed`` summed; a redrive: every fragment redriven
  (``max_items`` each), ``redriven`` summed;
* delete: every fragment deleted, the partitions first, then p0 forgets the placement.

**One-request verbs** at a node's own port (p0's leader: a follower forwards the request there)
go to one fragment: an enqueue to its ``partition_key``'s (:func:`rcq.names.fragment_for`), else
its idempotency key's (a retry reaches the fragment that remembers the key), else the next in
turn, moving on to the next while a fragment is full (``queue_full``: nothing was enqueued; a
keyed enqueue does not move: its retry must find the fragment that remembers it); a dequeue or
receive takes from the first fragment that has items, each tried in turn without waiting,
then, while its ``wait_ms`` lasts, each waited on for WAIT_SLICE_MS at most, so a long poll
finds an item in any fragment within a slice per fragment. The answer names the ``partition``
it came from; a receive's transaction lives there. ``/v1/execute`` on queues that share several
partitions runs in one of them the same way (:func:`execute`).

A partition process knows only its own fragment and answers for it alone, as for any queue.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rcq.errors import CommitOutcomeUnknown, InvalidRequest, Unavailable
from rcq.names import P0, fragment_for
from rcq.server.http.handlers import CONFIG
from rcq.server.http.models import QueueSettingsRequest
from rcq.server.http.partition_asker import FORWARD_TIMEOUT_S, LEADER_ASKER
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
WAIT_SLICE_MS = 1_000  # a long poll over fragments waits this long on one before it moves on
# How long a read, or a keyless one-request verb that may go elsewhere, waits for a fragment's
# partition to have a leader before it answers without it (a read) or moves on (the verb).
FRAGMENT_LEADER_WAIT_S = 2.0
TURNS_REMEMBERED_MAX = 10_000  # spread queues whose next fragment a node remembers


def spread_over(app: web.Application, queue: str) -> list[str] | None:
    """The partitions ``queue`` is spread over, when it is spread and this is a node's own port;
    None otherwise (a plain queue, or a partition process: it answers for its fragment)."""
    if app[CONFIG].partition_name is not None:
        return None
    placed = app[PARTITION_DIRECTORY].placed(queue)
    return placed if len(placed) > 1 else None


async def each_fragment(request: web.Request, partitions: list[str], method: str, path: str,
                        local: Local, body: dict[str, Any] | None = None, *,
                        leader_wait_s: float = FORWARD_TIMEOUT_S) -> dict[str, tuple[int, dict[str, Any]]]:
    """``method path`` at every fragment's partition (p0's by ``local``), the partitions at once:
    partition -> (status, answer; 503 for one without a leader within ``leader_wait_s``). p0's
    goes last, after the others answered."""
    app = request.app
    headers = credentials(request)

    async def at(partition: str) -> tuple[int, dict[str, Any]]:
        return await at_partition_leader(app, partition, lambda leader: app[LEADER_ASKER].call(
            method, f"{leader}{path}", headers, body, timeout_s=leader_wait_s), leader_wait_s)

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
        by_partition[partition].update(_shares(answer))
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
    body["settings"] = {**body["settings"], **_whole_limits([answers[p][1] for p in by_partition], len(partitions)),
                        "partitions": partitions}
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
    body = {**first, "queue": queue, "by_partition": {p: {**answers[p][1], **_shares(answers[p][1])} for p in partitions}}
    for key in summed:
        body[key] = sum(int(answers[p][1].get(key) or 0) for p in partitions)
    if isinstance(body.get("settings"), dict):
        body["settings"] = {**body["settings"], **_whole_limits([answers[p][1] for p in partitions], len(partitions)),
                            "partitions": partitions}
    return 200, body


# ------------------------------------------------------------------ limits
SPLIT_LIMITS = ("max_items", "max_bytes")  # settings that hold for the whole queue, split over its fragments


def fragment_settings(queue: str, settings: QueueSettingsRequest, partitions: list[str]
                      ) -> dict[str, QueueSettingsRequest]:
    """Each fragment's settings: the queue's, but ``max_items`` and ``max_bytes`` split into
    shares that add up to them (the first fragments in placement order take the remainder).
    InvalidRequest when a limit is below one per fragment: a fragment could hold nothing."""
    shares: dict[str, list[int | None]] = {}
    for name in SPLIT_LIMITS:
        limit = getattr(settings, name)
        if limit is not None and limit < len(partitions):
            raise InvalidRequest(
                f"{name} {limit} of queue {queue!r} is below one per fragment: it is spread over "
                f"{len(partitions)} partitions, each fragment holds its share of the limit (docs/partitions.md)",
                details={"queue": queue, name: limit, "partitions": partitions})
        base, extra = divmod(limit, len(partitions)) if limit is not None else (0, 0)
        shares[name] = [None if limit is None else base + (1 if i < extra else 0) for i in range(len(partitions))]
    return {p: settings.model_copy(update={name: shares[name][i] for name in SPLIT_LIMITS})
            for i, p in enumerate(partitions)}


def _shares(answer: dict[str, Any]) -> dict[str, Any]:
    """A fragment's share of the queue's split limits, from its answer's settings."""
    settings = answer.get("settings")
    if not isinstance(settings, dict):
        return {}
    return {"share": {name: settings.get(name) for name in SPLIT_LIMITS}}


def _whole_limits(rows: list[dict[str, Any]], fragments: int) -> dict[str, Any]:
    """The queue's split limits: its fragments' shares added up (null when unlimited, or when a
    fragment did not answer: the sum would be short)."""
    whole: dict[str, Any] = {}
    for name in SPLIT_LIMITS:
        values = [(row.get("settings") or {}).get(name) for row in rows]
        known = len(values) == fragments and all(isinstance(v, int) for v in values)
        whole[name] = sum(values) if known else None
    return whole


# --------------------------------------------------------------- one-request verbs
class Turns:
    """Where a node's next one-request verb on each spread queue starts: the fragments in turn."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def order(self, queue: str, partitions: list[str], partition_key: str | None) -> list[str]:
        """The fragments to try, first first: the key's alone, else each in turn from the next."""
        if partition_key is not None:
            return [fragment_for(partition_key, partitions)]
        start = self._next.get(queue, 0) % len(partitions)
        if len(self._next) >= TURNS_REMEMBERED_MAX:
            self._next.clear()
        self._next[queue] = start + 1
        return partitions[start:] + partitions[:start]


SPREAD_TURNS = web.AppKey("spread_turns", Turns)


async def _at(request: web.Request, partition: str, path: str, body: dict[str, Any], local: Local,
              leader_wait_s: float = FORWARD_TIMEOUT_S) -> tuple[int, dict[str, Any]]:
    """POST ``body`` to ``path`` at ``partition``'s leader (p0's: ``local``). A verb that commits is
    sent again only after an answer that says it ran nothing (307, 421, 503: a moved or electing
    leader); sent and unanswered, its outcome is unknown (504 ``commit_outcome_unknown``)."""
    if partition == P0:
        return await local()
    app = request.app
    headers = credentials(request)

    async def once(leader: str) -> tuple[int, dict[str, Any]]:
        answer = await app[LEADER_ASKER].call("POST", f"{leader}{path}", headers, body)
        if answer is None:  # sent, never answered: a 504 is not looked for again (307, 421, 503 ran nothing)
            return 504, CommitOutcomeUnknown(f"partition {partition}'s leader did not answer the {path} it was "
                                             "sent; it may have run", details={"partition": partition}).to_body()
        return answer

    status, answer = await at_partition_leader(app, partition, once, leader_wait_s)
    return status, answer


async def enqueue(request: web.Request, queue: str, partitions: list[str], body: dict[str, Any],
                  local: Local) -> tuple[int, dict[str, Any]]:
    """A one-request enqueue into one fragment: the partition key's, else the idempotency key's (a
    retry must reach the fragment that remembers it), else the next in turn."""
    key = body.get("partition_key") or body.get("idempotency_key")
    order = request.app[SPREAD_TURNS].order(queue, partitions, None) if key is None else [fragment_for(str(key), partitions)]
    for n, partition in enumerate(order, 1):
        try:  # a keyless enqueue with fragments left moves on from one without a leader: nothing ran
            status, answer = await _at(request, partition, f"/v1/queues/{queue}/enqueue", body, local,
                                       FRAGMENT_LEADER_WAIT_S if n < len(order) else FORWARD_TIMEOUT_S)
        except Unavailable:
            if n == len(order):
                raise
            continue
        if status == 200:
            return status, {**answer, "partition": partition}
        if (answer.get("error") or {}).get("code") != "queue_full":
            break  # queue_full: nothing enqueued, the next fragment may have room
    return status, answer


async def take(request: web.Request, queue: str, partitions: list[str], verb: str, body: dict[str, Any],
               local: Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]) -> tuple[int, dict[str, Any]]:
    """A one-request dequeue or receive (``verb``) from the first fragment that has items: each
    in turn without waiting; then, while ``wait_ms`` lasts, each in turn waiting WAIT_SLICE_MS at
    most, so an item in any fragment is found within a slice per fragment. With a partition key,
    its fragment alone (waiting all of ``wait_ms`` there)."""
    wait_ms = _checked_wait(request, int(body.get("wait_ms") or 0))
    order = request.app[SPREAD_TURNS].order(queue, partitions, body.get("partition_key"))
    return await _first_that_takes(request, order, f"/v1/queues/{queue}/{verb}", wait_ms,
                                   lambda wait: {**body, "wait_ms": wait}, local)


def _checked_wait(request: web.Request, wait_ms: int) -> int:
    longest = request.app[CONFIG].dequeue_wait_max_ms
    if wait_ms > longest:  # as a plain queue's dequeue refuses it: each fragment sees only a slice of it
        raise InvalidRequest(f"wait_ms {wait_ms} is over the limit {longest}")
    return wait_ms


async def _first_that_takes(request: web.Request, order: list[str], path: str, wait_ms: int,
                            waiting_for: Callable[[int], dict[str, Any]],
                            local: Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]
                            ) -> tuple[int, dict[str, Any]]:
    """``waiting_for(ms)`` (the request's body, waiting that long) at each of ``order`` until one
    takes items: without waiting first, then in slices while ``wait_ms`` lasts (see :func:`take`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    waiting = False
    while True:
        unavailable: list[Unavailable] = []
        for partition in order:
            left_ms = max(0, int((deadline - loop.time()) * 1000))
            wait_ms = (left_ms if len(order) == 1 else min(left_ms, WAIT_SLICE_MS)) if waiting else 0
            sent = waiting_for(wait_ms)
            try:  # a fragment whose partition has no leader is passed over; all of them: 503
                status, answer = await _at(request, partition, path, sent, functools.partial(local, sent),
                                           FRAGMENT_LEADER_WAIT_S if len(order) > 1 else FORWARD_TIMEOUT_S)
            except Unavailable as exc:
                unavailable.append(exc)
                if len(unavailable) == len(order):
                    raise
                continue
            if status != 200 or _took(answer):
                return status, {**answer, "partition": partition} if status == 200 else answer
            if waiting and loop.time() >= deadline:
                return status, {**answer, "partition": partition}
        if loop.time() >= deadline:
            return status, {**answer, "partition": partition}
        waiting = True


def execute_spread(app: web.Application, queues: list[str]) -> list[str] | None:
    """The partitions a ``/v1/execute`` on ``queues`` may run in, at a node's own port, when several
    hold a fragment of each; None otherwise (one partition or none: the routing decides)."""
    if app[CONFIG].partition_name is not None or not queues:
        return None
    placements = [app[PARTITION_DIRECTORY].placed(queue) for queue in dict.fromkeys(queues)]
    if all(len(placed) <= 1 for placed in placements):
        return None
    common = [p for p in placements[0] if all(p in placed for placed in placements[1:])]
    return common if len(common) > 1 else None


async def execute(request: web.Request, partitions: list[str], body: dict[str, Any],
                  local: Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]) -> tuple[int, dict[str, Any]]:
    """``/v1/execute`` over queues that share several partitions: one transaction, run in one of
    them. With an idempotency key, the key's (a retry reaches the partition that remembers it);
    without one, dequeues alone take from the first partition that has items, as :func:`take`
    (each dequeue waiting in slices: its own ``wait_ms`` at most), and operations that enqueue go
    to the next partition in turn, moving on while one is full or has no leader (nothing ran)."""
    operations = body.get("operations") or []
    queue = str(operations[0].get("queue"))  # whose turn: the first queue's
    key = body.get("idempotency_key")
    order = request.app[SPREAD_TURNS].order(queue, partitions, None) if key is None else [fragment_for(str(key), partitions)]
    if key is None and all(op.get("op") == "dequeue" for op in operations):
        wait_ms = _checked_wait(request, max(int(op.get("wait_ms") or 0) for op in operations))
        return await _first_that_takes(request, order, "/v1/execute", wait_ms, lambda wait: {
            **body, "operations": [{**op, "wait_ms": min(int(op.get("wait_ms") or 0), wait)} for op in operations]},
            local)
    for n, partition in enumerate(order, 1):
        try:
            status, answer = await _at(request, partition, "/v1/execute", body, functools.partial(local, body),
                                       FRAGMENT_LEADER_WAIT_S if n < len(order) else FORWARD_TIMEOUT_S)
        except Unavailable:
            if n == len(order):
                raise
            continue
        if status == 200:
            return status, {**answer, "partition": partition}
        if (answer.get("error") or {}).get("code") != "queue_full":
            break  # queue_full: the transaction ran nothing, the next partition may have room
    return status, answer


def _took(answer: dict[str, Any]) -> bool:
    """Whether a dequeue's answer (its items in ``results``) or a receive's (in ``items``) holds items."""
    return bool(answer.get("items")) or any(row.get("items") for row in answer.get("results") or []
                                            if isinstance(row, dict))


async def configure(request: web.Request, queue: str, partitions: list[str], settings: QueueSettingsRequest,
                    local: Callable[[QueueSettingsRequest], Awaitable[tuple[int, dict[str, Any]]]]
                    ) -> tuple[int, dict[str, Any]]:
    """Create or configure every fragment with its settings (:func:`fragment_settings`), each
    partition's signed as placed by p0, p0's by ``local``."""
    each = fragment_settings(queue, settings, partitions)
    others = [p for p in partitions if p != P0]
    answers = dict(zip(others, await asyncio.gather(*(forward_configure(request, p, queue, each[p])
                                                      for p in others)), strict=True))
    if P0 in partitions:
        answers[P0] = await local(each[P0])
    return merged_write(queue, partitions, answers)


async def purge(request: web.Request, queue: str, partitions: list[str], local: Local) -> tuple[int, dict[str, Any]]:
    answers = await each_fragment(request, partitions, "POST", f"/v1/queues/{queue}/purge", local, {})
    return merged_write(queue, partitions, answers, summed=("removed",))


async def redrive(request: web.Request, queue: str, partitions: list[str], body: dict[str, Any], local: Local
                  ) -> tuple[int, dict[str, Any]]:
    """Every fragment of a spread dead-letter queue redriven (``max_items`` each): its dead items
    go back to their sources' fragments in the same partition; ``redriven`` and ``by_queue`` summed."""
    answers = await each_fragment(request, partitions, "POST", f"/v1/queues/{queue}/redrive", local, body)
    status, merged = merged_write(queue, partitions, answers, summed=("redriven",))
    if status == 200:
        by_queue: dict[str, int] = {}
        for partition in partitions:
            for source, moved in (answers[partition][1].get("by_queue") or {}).items():
                by_queue[source] = by_queue.get(source, 0) + int(moved)
        merged["by_queue"] = by_queue
    return status, merged


async def delete(request: web.Request, queue: str, partitions: list[str], local: Local) -> tuple[int, dict[str, Any]]:
    """Delete every fragment, then forget the placement (p0's own delete forgets it as it applies)."""
    answers = await each_fragment(request, partitions, "DELETE", f"/v1/queues/{queue}", local)
    gone = {p: (200, a) if s == 404 and (a.get("error") or {}).get("code") == "queue_not_found" else (s, a)
            for p, (s, a) in answers.items()}
    status, body = merged_write(queue, partitions, gone, summed=("removed",))
    if status == 200:
        await request.app[PARTITION_DIRECTORY].forget(queue)
    return status, body
