"""The workload: concurrent workers running the generators' ops, the queues' setup before
them and the drain after.

Each worker runs its own :class:`chaos.generator.Generator` (a pure function of the seed and the
worker) through a :class:`chaos.executor.Executor`, writing each op's invoke and completion to
the history. Before the workload, ``configure`` ops give the queues their settings
(:func:`configure_queues`); after it, :func:`drain` empties every queue until nothing can come
back (:func:`empty_for_good`).

Workers reach the cluster as clients do by default, over a session channel (``GET /v1/session``),
except every fourth, which sends one HTTP request per operation (:func:`uses_channel`); the
``client-drop`` nemesis cuts and stalls those connections mid-request.

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from chaos.executor import VANISH_TIMEOUT_S, Executor, OpenTransactions, error_name, make_client
from chaos.generator import LIMITED_QUEUE_ITEMS_MAX, Generator, Spec, Topology
from rcq.client import RcqClient

HTTP_WORKER_EVERY = 4  # every fourth worker sends one HTTP request per operation, the others use a session channel
DRAIN_BATCH = 100


async def configure_limited_queue(history: Any, urls: list[str], queue: str, process: int,
                                  max_items: int = LIMITED_QUEUE_ITEMS_MAX, *, token: str | None = None) -> None:
    """Give ``queue`` its own max_items before the workload starts (retried: the cluster may be electing)."""
    async with make_client(urls, token) as client:
        op = history.invoke(process, "configure", {"queue": queue, "max_items": max_items})
        try:
            await client.configure_queue(queue, max_items=max_items)
        except Exception as exc:
            history.complete(op, "info", {"queue": queue, "max_items": max_items}, error_name(exc))
            raise
        history.complete(op, "ok", {"queue": queue, "max_items": max_items}, None)


async def configure_queues(history: Any, urls: list[str], topology: Topology, process: int, *,
                           token: str | None = None) -> None:
    """Give every queue of ``topology`` its settings before the workload starts: dead-letter queues
    first (a dead_letter_queue setting must name an existing queue), each a ``configure`` op whose
    value is the queue's whole settings (the checkers read them from the history)."""
    async with make_client(urls, token) as client:
        plans = topology.dead_letter_plans + list(topology.plans.values())
        if topology.probe is not None:  # the starvation probe's spread queue (chaos.starvation)
            plans.append(topology.probe)
        for plan in plans:
            value = {"queue": plan.name, **plan.settings()}
            op = history.invoke(process, "configure", value)
            try:
                await client.configure_queue(plan.name, **plan.settings())
            except Exception as exc:
                history.complete(op, "info", value, error_name(exc))
                raise
            history.complete(op, "ok", value, None)


def uses_channel(worker: int) -> bool:
    """Most workers use the session channel, as the client does by default; every fourth stays on HTTP."""
    return worker % HTTP_WORKER_EVERY != HTTP_WORKER_EVERY - 1


async def run_worker(history: Any, urls: list[str], generator: Generator, stop: asyncio.Event,
                     on_complete: Callable[[str, str], None] | None = None, ops_max: int | None = None, *,
                     token: str | None = None, registry: OpenTransactions | None = None) -> int:
    """Invoke the generator's ops one after another until ``stop`` is set; returns how many.
    ``registry``: where the worker lists its open transactions (for the intruder)."""
    done = 0
    async with make_client(urls, token, channel=uses_channel(generator.process)) as client:
        executor = Executor(client, registry, generator.process, generator.topology)
        while not stop.is_set() and (ops_max is None or done < ops_max):
            spec = generator.next()
            op = history.invoke(generator.process, spec.f, spec.value)
            type_, value, error = await executor.run(spec)
            history.complete(op, type_, value, error)
            done += 1
            if on_complete is not None:
                on_complete(spec.f, type_)
    return done


async def drain(history: Any, urls: list[str], queues: list[str], process: int, timeout_s: float,
                quiet_s: float = VANISH_TIMEOUT_S + 1.0, *, token: str | None = None,
                topology: Topology | None = None) -> dict[str, Any]:
    """Dequeue and commit every queue until all are empty and stay so (items of vanished or
    aborted transactions come back on their deadlines; delayed ones when their time comes): until
    the leader proves that nothing can come back (:func:`empty_for_good`), or else the counts stay
    0 for ``quiet_s``. Call it once nothing else uses the queues. With ``topology``, poison is
    rejected out of workload queues (to their dead-letter queues, which ``queues`` should list
    after them) and never committed there. Returns what it saw, and which way it ended (``ended_by``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    drained = {q: 0 for q in queues}
    empty_since: float | None = None
    async with make_client(urls, token) as client:
        executor = Executor(client, topology=topology)
        while loop.time() < deadline:
            got_any = False
            for queue in queues:
                while loop.time() < deadline:
                    spec = Spec("drain", {"queue": queue, "max": DRAIN_BATCH})
                    op = history.invoke(process, "drain", spec.value)
                    type_, value, error = await executor.run(dataclasses.replace(spec, f="dequeue"))
                    history.complete(op, type_, value, error)
                    if type_ == "ok" and not value["values"] and not value.get("rejected"):
                        break
                    if type_ == "ok":
                        drained[queue] += len(value["values"])
                        got_any = True
                    elif type_ != "ok":
                        await asyncio.sleep(0.2)  # back off while the cluster answers badly
            if got_any:
                empty_since = None
                continue
            if await empty_for_good(client, urls, queues, topology):
                return {"complete": True, "drained": drained, "ended_by": "leader"}
            counts = await _counts(client, queues)
            if counts is not None and not any(counts.values()):
                now = loop.time()
                empty_since = empty_since if empty_since is not None else now
                if now - empty_since >= quiet_s:
                    return {"complete": True, "drained": drained, "ended_by": "quiet"}
            else:
                empty_since = None
            await asyncio.sleep(0.25)  # locked items come back on their transactions' deadlines
    return {"complete": False, "drained": drained}


async def _counts(client: RcqClient, queues: list[str]) -> dict[str, int] | None:
    """Each queue's count, a spread queue's summed over its fragments (a row each); None when a
    partition did not answer."""
    try:
        answer = await client.queues()
    except Exception:  # asked again on the next round
        return None
    listed: dict[str, int] = {}
    for row in answer:
        listed[str(row.get("queue"))] = listed.get(str(row.get("queue")), 0) + int(row.get("count", 0))
    return {q: listed.get(q, 0) for q in queues}


async def empty_for_good(client: RcqClient, urls: list[str], queues: list[str], topology: Topology | None = None
                         ) -> bool:
    """:func:`empty_for_partition` for each partition the queues live in (``topology`` None: p0),
    each proved by that partition's leader (its members' URLs from the listing). A spread queue
    lives in each of its partitions: every fragment must be proved empty, each by its own
    partition's leader."""
    groups: dict[str, list[str]] = {}
    for queue in queues:
        for partition in topology.partitions_of(queue) if topology is not None else ("p0",):
            groups.setdefault(partition, []).append(queue)
    urls_of = {"p0": urls}
    if set(groups) != {"p0"}:
        try:
            urls_of.update({row["name"]: list(row.get("urls") or []) for row in await client.partitions()
                            if row["name"] != "p0"})
        except Exception:  # asked again on the next round
            return False
    for partition, group in groups.items():
        if not await empty_for_partition(client, urls_of.get(partition, []), group, partition):
            return False
    return True


def fragment_info(info: dict[str, Any], partition: str) -> dict[str, Any]:
    """A queue's read as ``partition``'s leader answered it: a spread queue's fragment there
    (``by_partition``; empty when that partition did not answer), else the read itself."""
    if not info.get("spread"):
        return info
    fragment = (info.get("by_partition") or {}).get(partition)
    return dict(fragment) if isinstance(fragment, dict) else {}


async def empty_for_partition(client: RcqClient, urls: list[str], queues: list[str], partition: str = "p0") -> bool:
    """Whether a serving leader shows every queue of ``queues`` empty with nothing that could bring
    an item back, provided no other client acts. Asked of that node: its status (serving, no open
    transaction of anyone's), every queue's count (answered by it, serving), its status again (the
    same term, still serving, still no open transaction). Then no item of these queues exists,
    locked or delayed (``count`` holds them all), and no entry can add one: the leader applied every
    entry of an earlier leader before serving (later ones are fenced), its own commits ended with
    their transactions, and a redrive, a reject or an expiry only moves items that exist. A spread
    queue's count is its fragment in ``partition`` (:func:`fragment_info`), answered by that same
    leader. False when that cannot be shown now (the caller asks again later)."""
    found = await _serving_leader(client, urls)
    if found is None or not _idle(found[1]):
        return False
    url, before = found
    try:
        for queue in queues:
            info = fragment_info(await client.queue_info(queue), partition)
            if info.get("node_id") != before["node_id"] or info.get("locked") is None or info.get("count") != 0:
                return False
        after = await client.cluster(url)
    except Exception:  # asked again on the next round
        return False
    return (after.get("role") == "leader" and after.get("serving") is True and _idle(after)
            and after.get("node_id") == before["node_id"] and after.get("term") == before["term"])


async def _serving_leader(client: RcqClient, urls: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The URL and status of the node of the highest term that says it serves as leader; None if none does."""
    found: tuple[str, dict[str, Any]] | None = None
    for url in urls:
        try:
            view = await client.cluster(url)
        except Exception:  # a node that does not answer now is not the one
            continue
        if view.get("role") == "leader" and view.get("serving") is True and (
                found is None or int(view["term"]) > int(found[1]["term"])):
            found = url, view
    return found


def _idle(view: dict[str, Any]) -> bool:
    return view.get("open_transactions") == 0
