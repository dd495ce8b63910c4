"""The starvation probe: one consumer alone drains every fragment of a spread queue
(docs/partitions.md, "Spread queues"; docs/chaos.md).

A spread queue has a fragment in each of its partitions, and a consumer that is not told which
fragment to take from (a one-request dequeue or receive, a transaction without a partition key)
must not be stuck on some of them while the others fill up. After the heal and before the drain,
while no other client acts, the probe runs one round per way of taking (:data:`MODES`) on the
topology's probe queue (``spread-probe``, spread over every partition, no worker's):

1. **fill**: :data:`ITEMS_PER_FRAGMENT` values into every fragment, each fragment's in one
   transaction begun in its partition (an ``enqueue`` op with ``"fragment"``, and
   ``"starvation"``: the round's mode);
2. **take**: ONE consumer, one item at a time, until it has every value the fill committed or
   the round's bound (:data:`BOUND_S`) has passed: ``one-request`` (``RcqClient.dequeue_items``:
   at most once), ``receive`` (``RcqClient.receive``, then a commit) or ``transaction`` (a
   transaction without a partition key: the client's next fragment in turn, a first dequeue moving
   on from empty ones). Each take is a ``dequeue`` op with ``"starvation"``; after an empty answer
   the next take waits (``wait_ms``) instead of asking at once.

A ``starvation`` checker-input line per round says when its consumer started and stopped (history
time), the bound, and whether the bound ended it. What a round left is the drain's. The spread
checker (chaos.checkers.spread) judges it from the ops: every value committed into a fragment
taken within the bound, else that fragment is **starved** (INVALID).

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from chaos.executor import DEFINITELY_NOT_COMMITTED, Executor, error_name, make_client, metas_of, text_of
from chaos.generator import Spec, Topology
from chaos.history import CHECKER_INPUT_PROCESS
from rcq.client import RcqClient

MODES = ("one-request", "receive", "transaction")
ITEMS_PER_FRAGMENT = 4
BOUND_S = 30.0  # a lone consumer takes every item of every fragment within this (seconds here)
EMPTY_WAIT_MS = 500  # after an empty answer, the next take waits this long for an item
FILL_ATTEMPTS_MAX = 3  # a fill transaction is tried again after a definite failure, this often
TX_TIMEOUT_S = 8.0


class _Values:
    """The probe's own unique values, ``<process>-<seq>`` like the workers'."""

    def __init__(self, process: int) -> None:
        self.process, self.seq = process, 0

    def take(self, count: int) -> list[str]:
        out = []
        for _ in range(count):
            self.seq += 1
            out.append(f"{self.process}-{self.seq}")
        return out


async def probe_starvation(history: Any, urls: list[str], topology: Topology, process: int, now_s: Callable[[], float],
                           *, token: str | None = None, bound_s: float = BOUND_S) -> dict[str, Any]:
    """Every round of :data:`MODES` on ``topology.probe`` (see the module); what each took, for the
    run's report. Nothing when there is no probe queue, or ``bound_s`` is 0 (no cluster left)."""
    plan = topology.probe
    if plan is None or bound_s <= 0:
        return {"ran": False}
    values = _Values(process)
    rounds: list[dict[str, Any]] = []
    async with make_client(urls, token) as client:
        executor = Executor(client, topology=topology, process=process)
        for mode in MODES:
            filled = await _fill(history, executor, plan.name, plan.spread, mode, values, process)
            rounds.append(await _take(history, client, executor, plan.name, mode, filled, process, now_s, bound_s))
    return {"ran": True, "queue": plan.name, "rounds": rounds}


async def _fill(history: Any, executor: Executor, queue: str, partitions: tuple[str, ...], mode: str,
                values: _Values, process: int) -> set[str]:
    """ITEMS_PER_FRAGMENT values committed into each fragment (one transaction begun there each);
    the values acknowledged."""
    acknowledged: set[str] = set()
    for partition in partitions:
        for _ in range(FILL_ATTEMPTS_MAX):
            spec = Spec("enqueue", {"writes": [{"queue": queue, "values": values.take(ITEMS_PER_FRAGMENT)}],
                                    "fragment": partition, "starvation": mode})
            op = history.invoke(process, spec.f, spec.value)
            type_, value, error = await executor.run(spec)
            history.complete(op, type_, value, error)
            if type_ == "ok":
                acknowledged.update(spec.value["writes"][0]["values"])
            if type_ != "fail":  # done, or unknown: its values are the drain's either way
                break
    return acknowledged


async def _take(history: Any, client: RcqClient, executor: Executor, queue: str, mode: str, filled: set[str],
                process: int, now_s: Callable[[], float], bound_s: float) -> dict[str, Any]:
    """One consumer takes one item at a time until it has ``filled`` or ``bound_s`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    started_s, started = now_s(), time.monotonic()
    taken: list[str] = []
    takes = 0
    wait_ms = 0
    while not filled <= set(taken) and loop.time() < deadline:
        wait_ms = min(wait_ms, max(0, int((deadline - loop.time()) * 1000) - 1000))
        got = await _take_one(history, client, executor, queue, mode, wait_ms, process)
        takes += 1
        taken += got
        wait_ms = 0 if got else EMPTY_WAIT_MS
    summary = {"queue": queue, "mode": mode, "bound_s": bound_s, "started_s": round(started_s, 6),
               "stopped_s": round(now_s(), 6), "elapsed_s": round(time.monotonic() - started, 3),
               "takes": takes, "filled": len(filled), "taken": len(set(taken) & filled),
               "ended_by_bound": not filled <= set(taken)}
    history.info(CHECKER_INPUT_PROCESS, "starvation", summary)
    return summary


async def _take_one(history: Any, client: RcqClient, executor: Executor, queue: str, mode: str, wait_ms: int,
                    process: int) -> list[str]:
    """One take of ``mode`` (at most one item), recorded; the values it took for good."""
    if mode == "transaction":
        spec = Spec("dequeue", {"queue": queue, "max": 1, "starvation": mode})
        op = history.invoke(process, spec.f, spec.value)
        type_, value, error = await executor.run(spec)
        history.complete(op, type_, value, error)
        return list(value.get("values") or []) if type_ == "ok" else []
    invoked = {"queue": queue, "max": 1, "starvation": mode, "wait_ms": wait_ms}
    if mode == "one-request":
        invoked["one_request"] = True
    op = history.invoke(process, "dequeue", invoked)
    state: dict[str, Any] = {"sent": False, "values": []}
    try:
        value = await (_one_request(client, queue, wait_ms, state) if mode == "one-request"
                       else _receive(client, queue, wait_ms, state))
    except Exception as exc:  # an error is data here: fail when nothing can have committed, else info
        definite = not state["sent"] or isinstance(exc, DEFINITELY_NOT_COMMITTED)
        history.complete(op, "fail" if definite else "info", {**invoked, "values": state["values"]}, error_name(exc))
        return []
    history.complete(op, "ok", {**invoked, **value}, None)
    return list(value["values"])


async def _one_request(client: RcqClient, queue: str, wait_ms: int, state: dict[str, Any]) -> dict[str, Any]:
    state["sent"] = True  # one request: it may commit from its first attempt on
    items = await client.dequeue_items(queue, 1, wait_ms=wait_ms)
    # no item details: which fragment it came from is not known, and item ids are a fragment's own
    return {"values": [text_of(i) for i in items]}


async def _receive(client: RcqClient, queue: str, wait_ms: int, state: dict[str, Any]) -> dict[str, Any]:
    tx = await client.receive(queue, 1, wait_ms=wait_ms, timeout_s=TX_TIMEOUT_S, label="chaos-starvation")
    if tx is None:
        return {"values": []}
    state["values"] = [text_of(i) for i in tx.items]
    try:
        state["sent"] = True
        await tx.commit()
    except BaseException:
        if tx.state == "open":
            with contextlib.suppress(Exception):
                await tx.abort()
        raise
    metas = {value: {**meta, "pt": tx.partition} for value, meta in metas_of(tx.items).items()}
    return {"values": state["values"], "items": metas, "partition": tx.partition}
