"""The workload: seeded generators and concurrent workers that use rcq as any client would.

Each worker ``w`` draws its operations from ``random.Random(f"{seed}/{w}")``, so
a run's op sequence per worker is the same for the same seed (what each op
*returns* depends on the cluster, of course). Values are unique strings
``"<process>-<seq>"``.

Every operation is an ``invoke`` line, then exactly one completion:

* ``ok``: it happened (a commit was acknowledged; a read or abort answered);
* ``fail``: it definitely did not happen — an error before the commit was
  sent (nothing commits without a commit), or a commit refused by an error
  whose class says so (``TransactionAborted`` and its subclasses,
  ``TransactionNotFound``, ``InvalidRequest``, and the storage limits:
  ``QueueFull``, ``StorageFull``, ``TooManyQueues`` — the leader refuses before it
  proposes, or the state machine rejects the unit whole);
* ``info``: anything else once the commit may have left — CommitOutcomeUnknown,
  a transport error, a timeout, an exception we did not expect.

The intruder, a principal that tries what it must not, is :mod:`chaos.intruder`; workers register
their open transactions in an :class:`OpenTransactions` for it.

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable
from typing import Any

from rcq.client import Item, RcqClient, Transaction
from rcq.errors import (
    InvalidRequest,
    QueueFull,
    StorageFull,
    TooManyQueues,
    TransactionAborted,
    TransactionNotFound,
)

OP_TIMEOUT_S = 30.0  # an op still running after this is abandoned (info if its commit may have left)
TRANSACTION_TIMEOUT_S = 8.0
VANISH_TIMEOUT_S = 3.0  # a vanished client's items come back this soon
REQUEST_TIMEOUT_S = 4.0
RETRY_TIMEOUT_S = 8.0
HEAD_RANK_WINDOW = 20
DRAIN_BATCH = 100
DEFINITELY_NOT_COMMITTED = (TransactionAborted, TransactionNotFound, InvalidRequest, QueueFull, StorageFull,
                            TooManyQueues)

# op -> weight; the defaults keep queues non-empty (enqueues outnumber dequeues by value)
DEFAULT_MIX: dict[str, int] = {
    "enqueue": 40, "dequeue": 22, "dequeue-abort": 10, "peek": 8, "move": 12, "vanish": 3, "count": 4,
}
# The run's first queue gets its own max_items (checked by the limits checker); queue_full refusals
# are definite failures the total-queue checker must account for.
LIMITED_QUEUE_ITEMS_MAX = 40



def queue_names(count: int) -> list[str]:
    return [f"q{i}" for i in range(count)]


@dataclasses.dataclass(frozen=True)
class Spec:
    """One generated operation: what to invoke, before anything is known of the cluster."""

    f: str
    value: dict[str, Any]
    head_rank: bool = False


class Generator:
    """A worker's op sequence, a pure function of (seed, worker)."""

    def __init__(self, seed: int, worker: int, queues: list[str], mix: dict[str, int] | None = None,
                 values_max: int = 4) -> None:
        self._random = random.Random(f"{seed}/{worker}")
        self.process = worker
        self.queues = queues
        mix = mix or DEFAULT_MIX
        self._ops, self._weights = list(mix), list(mix.values())
        self._values_max = values_max
        self._seq = 0

    def _value(self) -> str:
        self._seq += 1
        return f"{self.process}-{self._seq}"

    def next(self) -> Spec:
        rng = self._random
        f = rng.choices(self._ops, self._weights)[0]
        queue = rng.choice(self.queues)
        if f == "enqueue":
            writes = [{"queue": queue, "values": [self._value() for _ in range(rng.randint(1, self._values_max))]}]
            if len(self.queues) > 1 and rng.random() < 0.3:  # a transaction spanning two queues
                other = rng.choice([q for q in self.queues if q != queue])
                writes.append({"queue": other, "values": [self._value() for _ in range(rng.randint(1, 2))]})
            return Spec(f, {"writes": writes})
        if f == "move":
            target = rng.choice([q for q in self.queues if q != queue] or self.queues)
            return Spec(f, {"from": queue, "to": target, "max": rng.randint(1, 3)})
        if f in ("peek", "count"):
            return Spec(f, {"queue": queue})
        return Spec(f, {"queue": queue, "max": rng.randint(1, 3)}, head_rank=f == "dequeue-abort" and rng.random() < 0.5)


def text_of(item: Item | bytes) -> str:
    value = item.value if isinstance(item, Item) else item
    return value.decode("utf-8", errors="replace")


def error_name(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return str(code) if isinstance(code, str) else type(exc).__name__


class OpenTransactions:
    """The workers' transactions open right now, for the intruder to try to hijack: an Executor
    adds its transaction's id when it begins and removes it when the op ends (a vanished client's
    transaction stays open on the server until its deadline, but is no longer listed). One event
    loop shares it: no lock."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int | str, str]] = {}

    def add(self, transaction_id: str, process: int | str, f: str) -> None:
        self._open[transaction_id] = (process, f)

    def remove(self, transaction_id: str) -> None:
        self._open.pop(transaction_id, None)

    def snapshot(self) -> list[tuple[str, int | str, str]]:
        """(transaction id, process, f) of each, in id order (a seeded draw then picks the same one)."""
        return sorted((tid, process, f) for tid, (process, f) in self._open.items())

    def __len__(self) -> int:
        return len(self._open)


class Executor:
    """Runs one Spec against the cluster and decides ok / fail / info. With ``registry``, the
    transaction of each op is listed there while the op runs (as process ``process``)."""

    def __init__(self, client: RcqClient, registry: OpenTransactions | None = None, process: int | str = "") -> None:
        self.client = client
        self.registry = registry
        self.process = process

    async def run(self, spec: Spec) -> tuple[str, Any, str | None]:
        state: dict[str, Any] = {"commit_sent": False, "values": [], "f": spec.f}
        try:
            type_, value, error = await asyncio.wait_for(self._dispatch(spec, state), OP_TIMEOUT_S)
        except Exception as exc:  # an exception is data here: fail or info
            definite = not state["commit_sent"] or isinstance(exc, DEFINITELY_NOT_COMMITTED)
            type_, value, error = ("fail" if definite else "info"), self._partial(spec, state), error_name(exc)
        finally:
            if self.registry is not None and "transaction_id" in state:
                self.registry.remove(state["transaction_id"])
        if "transaction_id" in state and isinstance(value, dict):
            value = {**value, "transaction_id": state["transaction_id"]}  # to find it in the nodes' logs
        return type_, value, error

    @staticmethod
    def _partial(spec: Spec, state: dict[str, Any]) -> Any:
        if spec.f == "enqueue":
            return spec.value
        if spec.f == "move":
            return {"from": spec.value["from"], "to": spec.value["to"], "values": state["values"]}
        if spec.f == "peek":
            return {"queue": spec.value["queue"], "value": None}
        if spec.f == "count":
            return {"queue": spec.value["queue"]}
        return {"queue": spec.value["queue"], "values": state["values"]}

    async def _dispatch(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        handler: Callable[..., Any] = getattr(self, "_" + spec.f.replace("-", "_"))
        return await handler(spec, state)

    def _began(self, tx: Transaction, state: dict[str, Any]) -> None:
        state["transaction_id"] = tx.transaction_id
        if self.registry is not None:
            self.registry.add(tx.transaction_id, self.process, state["f"])

    async def _commit(self, tx: Transaction, state: dict[str, Any]) -> None:
        state["commit_sent"] = True
        await tx.commit()

    async def _abort_quietly(self, tx: Transaction) -> str | None:
        try:
            await tx.abort()
        except Exception as exc:  # the deadline returns the items anyway
            return error_name(exc)
        return None

    async def _in_transaction(self, state: dict[str, Any], timeout_s: float, body: Callable[[Transaction], Any]) -> Any:
        tx = await self.client.begin(timeout_s, "chaos")
        self._began(tx, state)
        try:
            result = await body(tx)
        except BaseException:
            if not state["commit_sent"]:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._abort_quietly(tx))
            raise
        return result

    async def _enqueue(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        async def body(tx: Transaction) -> None:
            for write in spec.value["writes"]:
                await tx.enqueue_batch(write["queue"], write["values"])
            await self._commit(tx, state)

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, body)
        return "ok", spec.value, None

    async def _dequeue(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]

        async def body(tx: Transaction) -> None:
            items = await tx.dequeue_items(queue, spec.value["max"])
            state["values"] = [text_of(i) for i in items]
            await self._commit(tx, state)

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, body)
        return "ok", {"queue": queue, "values": state["values"]}, None

    async def _move(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        source, target = spec.value["from"], spec.value["to"]

        async def body(tx: Transaction) -> None:
            items = await tx.dequeue_items(source, spec.value["max"])
            state["values"] = [text_of(i) for i in items]
            if items:
                await tx.enqueue_batch(target, [i.value for i in items])
            await self._commit(tx, state)

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, body)
        return "ok", {"from": source, "to": target, "values": state["values"]}, None

    async def _dequeue_abort(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]
        tx = await self.client.begin(TRANSACTION_TIMEOUT_S, "chaos")
        self._began(tx, state)
        try:
            items = await tx.dequeue_items(queue, spec.value["max"])
        except BaseException:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._abort_quietly(tx))
            raise
        values = [text_of(i) for i in items]
        state["values"] = values
        abort_error = await self._abort_quietly(tx)
        value: dict[str, Any] = {"queue": queue, "values": values}
        if abort_error is not None:
            value["abort_error"] = abort_error  # never committed: the deadline gives them back
        elif spec.head_rank and values:
            with contextlib.suppress(Exception):
                value["head_rank"] = await self._head_rank(queue, set(values))
        # never committed, whatever happened to the abort: it definitely did not remove anything
        return "ok", value, None

    async def _head_rank(self, queue: str, values: set[str]) -> int | None:
        """How near the head the aborted values came back: the rank of the first one seen."""
        tx = await self.client.begin(TRANSACTION_TIMEOUT_S, "chaos-head-rank")
        try:
            items = await tx.dequeue_items(queue, HEAD_RANK_WINDOW)
        finally:
            await self._abort_quietly(tx)
        return next((rank for rank, item in enumerate(items) if text_of(item) in values), None)

    async def _count(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        """The replicated count with the queue's own limit: the limits checker holds one to the other."""
        info = await self.client.queue_info(spec.value["queue"])
        settings = info.get("settings") or {}
        return "ok", {"queue": spec.value["queue"], "count": info.get("count"),
                      "max_items": settings.get("max_items")}, None

    async def _peek(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        value = await self.client.peek(spec.value["queue"])
        return "ok", {"queue": spec.value["queue"], "value": None if value is None else text_of(value)}, None

    async def _vanish(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]
        tx = await self.client.begin(VANISH_TIMEOUT_S, "chaos-vanish")
        self._began(tx, state)
        items = await tx.dequeue_items(queue, spec.value["max"])
        # Walk away: no commit, no abort. The server's deadline must give the items back.
        return "ok", {"queue": queue, "values": [text_of(i) for i in items]}, None


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


def make_client(urls: list[str], token: str | None = None) -> RcqClient:
    """A client of the cluster, sending ``token`` (the cluster's, when it requires one) with every request."""
    return RcqClient(urls, request_timeout_s=REQUEST_TIMEOUT_S, retry_timeout_s=RETRY_TIMEOUT_S, token=token)


async def run_worker(history: Any, urls: list[str], generator: Generator, stop: asyncio.Event,
                     on_complete: Callable[[str, str], None] | None = None, ops_max: int | None = None, *,
                     token: str | None = None, registry: OpenTransactions | None = None) -> int:
    """Invoke the generator's ops one after another until ``stop`` is set; returns how many.
    ``registry``: where the worker lists its open transactions (for the intruder)."""
    done = 0
    async with make_client(urls, token) as client:
        executor = Executor(client, registry, generator.process)
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
                quiet_s: float = VANISH_TIMEOUT_S + 1.0, *, token: str | None = None) -> dict[str, Any]:
    """Dequeue and commit every queue until all are empty and stay so (items of vanished or
    aborted transactions come back on their deadlines). Returns what it saw."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    drained = {q: 0 for q in queues}
    empty_since: float | None = None
    async with make_client(urls, token) as client:
        executor = Executor(client)
        while loop.time() < deadline:
            got_any = False
            for queue in queues:
                while loop.time() < deadline:
                    spec = Spec("drain", {"queue": queue, "max": DRAIN_BATCH})
                    op = history.invoke(process, "drain", spec.value)
                    type_, value, error = await executor.run(dataclasses.replace(spec, f="dequeue"))
                    history.complete(op, type_, value, error)
                    if type_ == "ok" and not value["values"]:
                        break
                    if type_ == "ok":
                        drained[queue] += len(value["values"])
                        got_any = True
                    elif type_ != "ok":
                        await asyncio.sleep(0.2)  # back off while the cluster answers badly
            if got_any:
                empty_since = None
                continue
            counts = await _counts(client, queues)
            if counts is not None and not any(counts.values()):
                now = loop.time()
                empty_since = empty_since if empty_since is not None else now
                if now - empty_since >= quiet_s:
                    return {"complete": True, "drained": drained}
            else:
                empty_since = None
            await asyncio.sleep(0.25)  # locked items come back on their transactions' deadlines
    return {"complete": False, "drained": drained}


async def _counts(client: RcqClient, queues: list[str]) -> dict[str, int] | None:
    try:
        listed = {str(q.get("queue")): int(q.get("count", 0)) for q in await client.queues()}
    except Exception:  # asked again on the next round
        return None
    return {q: listed.get(q, 0) for q in queues}
