"""The executor: runs one generated operation against the cluster, as any client would, and
decides what became of it.

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

Consumers never commit poison (chaos.generator.is_poison) out of a workload queue: a consumer
aborts (``fail``, error ``poison_abort``) or rejects it (``rejected`` in the op's value, with
``reject_outcome``), and a mover aborts. Dequeues record each item's id, delivery count, enqueue
time, priority, dead-letter record and headers (``items``; headers ``h`` only when it has some).
An ok enqueue records its acknowledgement's wall time (``ack_ms``). A mover re-enqueues what it
took with the headers it came with. The features checker (chaos.checkers.features) and the
headers checker (chaos.checkers.headers) hold the cluster to the rules with all of it. A cluster
below level 2 (the upgrade nemesis holds it at 1, and a new cluster is there until it raises
itself) refuses headers before anything is buffered: such an enqueue is a definite ``fail``
(``feature_level_required``), as any error before the commit, and the whole transaction with it.

A one-request enqueue (``RcqClient.enqueue``: exactly once under the client's own retries
through the retry key it makes, docs/limits.md) may apply from its first attempt on: any error
but a definite one is ``info``.

A transaction that begins on a spread queue (docs/partitions.md, "Spread queues") picks its
fragment as its op says (chaos.generator): begun in the op's ``fragment``, with its
``partition_key``, or left to the client (the next fragment in turn). In a run with spread queues
every op that ran a transaction records the partition it ran in (``partition``, the client's
``Transaction.partition``; absent when it never opened), and each item dequeued from a spread
queue its fragment (``pt``): item ids are a partition's own, so the same id in two fragments is
two items.

The intruder, a principal that tries what it must not, is :mod:`chaos.intruder`; executors
register their open transactions in an :class:`OpenTransactions` for it.

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from chaos.generator import Spec, Topology, headers_of, is_poison, runs_by_headers
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
DEFINITELY_NOT_COMMITTED = (TransactionAborted, TransactionNotFound, InvalidRequest, QueueFull, StorageFull,
                            TooManyQueues)


class PoisonAbort(Exception):
    """A consumer met poison and aborts its transaction (the op definitely did not commit)."""

    code = "poison_abort"


def text_of(item: Item | bytes) -> str:
    value = item.value if isinstance(item, Item) else item
    return value.decode("utf-8", errors="replace")


def item_meta(item: Item) -> dict[str, Any]:
    """What the history keeps of a dequeued item besides its value: id, delivery count, enqueue
    time and expiry (ms, the server's; expiry None: never), and its priority, dead-letter record and
    headers when it has them."""
    meta: dict[str, Any] = {"id": item.item_id, "dc": item.delivery_count, "at": item.enqueued_at_ms,
                            "exp": item.expires_at_ms}
    if item.priority:
        meta["p"] = item.priority
    if item.dead_letter is not None:
        dead = item.dead_letter
        meta["dl"] = [dead.reason, dead.source_queue, dead.delivery_count]
    if item.headers:
        meta["h"] = dict(item.headers)
    return meta


def metas_of(items: list[Item]) -> dict[str, dict[str, Any]]:
    return {text_of(i): item_meta(i) for i in items if isinstance(i, Item)}


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

    def __init__(self, client: RcqClient, registry: OpenTransactions | None = None, process: int | str = "",
                 topology: Topology | None = None) -> None:
        self.client = client
        self.registry = registry
        self.process = process
        self.topology = topology

    async def run(self, spec: Spec) -> tuple[str, Any, str | None]:
        state: dict[str, Any] = {"commit_sent": False, "values": [], "f": spec.f, "extra": {}}
        try:
            type_, value, error = await asyncio.wait_for(self._dispatch(spec, state), OP_TIMEOUT_S)
        except Exception as exc:  # an exception is data here: fail or info
            definite = not state["commit_sent"] or isinstance(exc, DEFINITELY_NOT_COMMITTED)
            type_, value, error = ("fail" if definite else "info"), self._partial(spec, state), error_name(exc)
            state["extra"].update({"full": exc.details} if isinstance(exc, QueueFull) else {})  # the queue, its limit
        finally:
            if self.registry is not None and "transaction_id" in state:
                self.registry.remove(state["transaction_id"])
        if state["extra"] and isinstance(value, dict):
            value = {**value, **state["extra"]}  # item details, rejects, poison: whatever the outcome
        if "transaction_id" in state and isinstance(value, dict):
            value = {**value, "transaction_id": state["transaction_id"]}  # to find it in the nodes' logs
        tx = state.get("tx")
        if self._spread_run and tx is not None and tx.partition is not None and isinstance(value, dict):
            value = {**value, "partition": tx.partition}  # where it ran: the partitions checker's fragments
        return type_, value, error

    @property
    def _spread_run(self) -> bool:
        return self.topology is not None and bool(self.topology.spread_queues)

    @staticmethod
    def _partial(spec: Spec, state: dict[str, Any]) -> Any:
        if spec.f in ("enqueue", "redrive"):
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

    def _partition(self, queue: str) -> str | None:
        """The partition a transaction on ``queue`` is begun in (None: a run without partitions)."""
        return self.topology.partition_of(queue) if self.topology is not None and self.topology.partitioned else None

    async def _begin(self, timeout_s: float, label: str, queue: str, pick: dict[str, Any] | None = None
                     ) -> Transaction:
        """A transaction for ``queue``: in its partition; on a spread queue, in the fragment ``pick``
        (the op's value) names (``fragment``), by its ``partition_key``, or as the client chooses."""
        if self.topology is not None and self.topology.is_spread(queue):
            pick = pick or {}
            if pick.get("fragment") is not None:
                return await self.client.begin(timeout_s, label, partition=str(pick["fragment"]))
            return await self.client.begin(timeout_s, label, partition_key=pick.get("partition_key"))
        partition = self._partition(queue)
        if partition is None:  # the call of a run without partitions, as it always was
            return await self.client.begin(timeout_s, label)
        return await self.client.begin(timeout_s, label, partition=partition)

    def _began(self, tx: Transaction, state: dict[str, Any]) -> None:
        state["tx"] = tx  # its partition, once it has run (recorded by run)
        if tx.transaction_id is None:  # opened at its first verb (a partitioned cluster): not known yet
            return
        state["transaction_id"] = tx.transaction_id
        # The intruder hijacks p0's transactions only: the security checker explains a refusal by
        # p0's sampled leader terms, and a partition's id carries its own partition's term.
        if self.registry is not None and "." not in tx.transaction_id.partition(".")[2]:
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

    async def _in_transaction(self, state: dict[str, Any], timeout_s: float, queue: str,
                              body: Callable[[Transaction], Any], pick: dict[str, Any] | None = None) -> Any:
        """``body(tx)`` in a transaction begun in ``queue``'s partition (a spread queue's fragment as
        ``pick`` says); aborted if it fails before its commit."""
        tx = await self._begin(timeout_s, "chaos", queue, pick)
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
        if spec.value.get("one_request"):
            (write,) = spec.value["writes"]
            ((values, headers),) = runs_by_headers(write["values"], headers_of)
            options = write_options(write)
            state["commit_sent"] = True  # one request: it may apply from its first attempt on
            await self.client.enqueue(write["queue"], *values, headers=headers or None, **options)
            return "ok", {**spec.value, "ack_ms": int(time.time() * 1000)}, None

        async def body(tx: Transaction) -> None:
            for write in spec.value["writes"]:
                options = write_options(write)
                for values, headers in runs_by_headers(write["values"], headers_of):
                    await enqueue_with(tx, write["queue"], values, headers, **options)
            await self._commit(tx, state)

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, spec.value["writes"][0]["queue"], body, spec.value)
        # The acknowledgement's wall time (ms): an item whose enqueue time is later lives again (redriven).
        return "ok", {**spec.value, "ack_ms": int(time.time() * 1000)}, None

    def _poison_policy(self, spec: Spec, queue: str) -> str | None:
        """What to do with poison dequeued from ``queue``: "abort", "reject", or None (consume it:
        a dead-letter queue, or a run without a topology)."""
        if self.topology is None or self.topology.is_dead_letter_queue(queue):
            return None
        return spec.value.get("poison") or self.topology.poison_policy(queue)

    def _record_items(self, state: dict[str, Any], items: list[Item], queue: str) -> None:
        if self.topology is not None:
            metas = metas_of(items)
            tx = state.get("tx")
            if self.topology.is_spread(queue) and tx is not None and tx.partition is not None:
                metas = {value: {**meta, "pt": tx.partition} for value, meta in metas.items()}
            state["extra"].setdefault("items", {}).update(metas)

    async def _dequeue(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]
        policy = self._poison_policy(spec, queue)

        async def body(tx: Transaction) -> None:
            items = await tx.dequeue_items(queue, spec.value["max"])
            state["values"] = [text_of(i) for i in items]
            self._record_items(state, items, queue)
            poison = [i for i in items if is_poison(text_of(i))] if policy is not None else []
            if poison and policy == "abort":
                state["extra"]["poison"] = [text_of(i) for i in poison]
                raise PoisonAbort(f"{len(poison)} poison item(s)")
            if poison:
                # Rejected items leave the transaction at once, for the dead-letter queue (or dropped):
                # "values" keeps only what the commit takes.
                state["values"] = [text_of(i) for i in items if i not in poison]
                extra = state["extra"]
                extra["rejected"] = [text_of(i) for i in poison]
                extra["reject_outcome"] = "unknown"
                try:
                    await tx.reject(queue, poison, reason="poison")
                except DEFINITELY_NOT_COMMITTED:
                    extra["reject_outcome"] = "fail"
                    raise
                extra["reject_outcome"] = "ok"
            await self._commit(tx, state)

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, queue, body, spec.value)
        return "ok", {"queue": queue, "values": state["values"]}, None

    async def _redrive(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        state["commit_sent"] = True  # one replicated request: its outcome may be unknown
        answer = await self.client.redrive(spec.value["dlq"], max_items=spec.value["max_items"])
        return "ok", {**spec.value, "redriven": answer.get("redriven"), "by_queue": answer.get("by_queue")}, None

    async def _move(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        source, target = spec.value["from"], spec.value["to"]

        async def body(tx: Transaction) -> None:
            items = await tx.dequeue_items(source, spec.value["max"])
            state["values"] = [text_of(i) for i in items]
            self._record_items(state, items, source)
            poison = [text_of(i) for i in items if is_poison(text_of(i))]
            if poison:  # a mover is a consumer too: it never carries poison elsewhere
                state["extra"]["poison"] = poison
                raise PoisonAbort(f"{len(poison)} poison item(s)")
            # each item keeps its headers (Item.headers) where it goes
            for values, headers in runs_by_headers(items, lambda item: item.headers):
                await enqueue_with(tx, target, [item.value for item in values], headers)
            await self._commit(tx, state)

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, source, body, spec.value)
        return "ok", {"from": source, "to": target, "values": state["values"]}, None

    async def _dequeue_abort(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]
        tx = await self._begin(TRANSACTION_TIMEOUT_S, "chaos", queue, spec.value)
        self._began(tx, state)
        try:
            items = await tx.dequeue_items(queue, spec.value["max"])
        except BaseException:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._abort_quietly(tx))
            raise
        values = [text_of(i) for i in items]
        state["values"] = values
        self._record_items(state, items, queue)
        abort_error = await self._abort_quietly(tx)
        value: dict[str, Any] = {"queue": queue, "values": values}
        if abort_error is not None:
            value["abort_error"] = abort_error  # never committed: the deadline gives them back
        elif spec.head_rank and values:
            with contextlib.suppress(Exception):
                value["head_rank"] = await self._head_rank(queue, set(values), tx.partition)
        # never committed, whatever happened to the abort: it definitely did not remove anything
        return "ok", value, None

    async def _head_rank(self, queue: str, values: set[str], partition: str | None) -> int | None:
        """How near the head the aborted values came back: the rank of the first one seen (in the
        fragment they came from, ``partition``, on a spread queue)."""
        tx = await self._begin(TRANSACTION_TIMEOUT_S, "chaos-head-rank", queue, {"fragment": partition})
        try:
            items = await tx.dequeue_items(queue, HEAD_RANK_WINDOW)
        finally:
            await self._abort_quietly(tx)
        return next((rank for rank, item in enumerate(items) if text_of(item) in values), None)

    async def _count(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        """The replicated count and limit (a spread queue's fragments' too): the limits checker holds one to the other."""
        info = await self.client.queue_info(spec.value["queue"])
        settings = info.get("settings") or {}
        fragments = {p: {"count": r.get("count"), "share": r.get("share")} for p, r in (info.get("by_partition") or {}).items()}
        return "ok", {"queue": spec.value["queue"], "count": info.get("count"), "max_items": settings.get("max_items"),
                      **({"by_partition": fragments} if info.get("spread") else {})}, None

    async def _peek(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        value = await self.client.peek(spec.value["queue"])
        return "ok", {"queue": spec.value["queue"], "value": None if value is None else text_of(value)}, None

    async def _vanish(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]
        tx = await self._begin(VANISH_TIMEOUT_S, "chaos-vanish", queue, spec.value)
        self._began(tx, state)
        items = await tx.dequeue_items(queue, spec.value["max"])
        self._record_items(state, items, queue)
        # Walk away: no commit, no abort. The server's deadline must give the items back.
        return "ok", {"queue": queue, "values": [text_of(i) for i in items]}, None


def write_options(write: dict[str, Any]) -> dict[str, Any]:
    """The enqueue options a generated write carries (priority, delay_s, ttl_s), as keyword arguments."""
    return {name: write[name] for name in ("priority", "delay_s", "ttl_s") if name in write}


async def enqueue_with(tx: Transaction, queue: str, values: list[Any], headers: dict[str, str], **options: Any) -> None:
    """One enqueue call; ``headers`` sent only when there are some, so a plain call is the request of
    a client that knows nothing of them."""
    if headers:
        options["headers"] = headers
    await tx.enqueue_batch(queue, values, **options)


def make_client(urls: list[str], token: str | None = None, retry_timeout_s: float = RETRY_TIMEOUT_S,
                channel: bool = True) -> RcqClient:
    """A client of the cluster sending ``token`` (the cluster's, if it needs one); retry_timeout_s 0: one try.
    ``channel``: the session channel for the hot verbs (the client's default); False: HTTP only."""
    return RcqClient(urls, request_timeout_s=REQUEST_TIMEOUT_S, retry_timeout_s=retry_timeout_s, token=token,
                     channel=channel)
