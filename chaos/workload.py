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

Queue features (docs/queue-features.md), with a :class:`Topology`: ``q0`` stays plain; the other
queues get dead-letter queues (``<queue>-dlq``), ``max_deliveries`` and ``max_priority`` (see
Topology.of), set by ``configure`` ops before the workload starts. Writes to them carry
priorities, delays and ttls, and some carry a poison value (``<process>-<seq>-poison``): a
consumer never commits poison out of a workload queue — it aborts (``fail``, error
``poison_abort``) or rejects it (``rejected`` in the op's value, with ``reject_outcome``), and a
mover aborts. Dequeues record each item's id, delivery count, enqueue time, priority and
dead-letter record (``items``); workers also consume the dead-letter queues and redrive them. An
ok enqueue records its acknowledgement's wall time (``ack_ms``). The features checker
(chaos.checkers.features) holds the cluster to the rules with all of it.

Item headers (feature level 2): some writes to featured queues carry values marked
``<process>-<seq>-h`` (:func:`has_headers`); each such item is enqueued with the headers
:func:`headers_of` derives from its value, ``{"rcq-chaos": value}``, alone in its enqueue call
(the client gives one set of headers to a whole call), plain values of the write batched between
them, so the write's order is kept. A mover re-enqueues what it took with the headers it came
with. Dequeues record each item's headers (``h``, only when it has some); the headers checker
(chaos.checkers.headers) holds every item seen to exactly its value's headers. A cluster below
level 2 (the upgrade nemesis holds it at 1, and a new cluster is there until it raises itself)
refuses headers before anything is buffered: such an enqueue is a definite ``fail``
(``feature_level_required``), as any error before the commit, and the whole transaction with it.

One-request enqueues (``RcqClient.enqueue``: begin, enqueue and commit in one request, exactly
once under the client's own retries through the retry key it makes, docs/limits.md): a share of
the single-queue writes that one enqueue call can carry (``"one_request": true`` in the op's
value), drawn from a generator of their own so that the rest of a seed's sequence is what it
was. Such a request may apply from its first attempt on: any error but a definite one is
``info``.

Workers reach the cluster as clients do by default, over a session channel (``GET /v1/session``),
except every fourth, which sends one HTTP request per operation (:func:`uses_channel`); the
``client-drop`` nemesis cuts and stalls those connections mid-request.

The intruder, a principal that tries what it must not, is :mod:`chaos.intruder`; workers register
their open transactions in an :class:`OpenTransactions` for it.

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
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
HTTP_WORKER_EVERY = 4  # every fourth worker sends one HTTP request per operation, the others use a session channel
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

# Poison, time and priorities (docs/queue-features.md), on every queue but the first, which stays plain.
MAX_DELIVERIES = 3
MAX_PRIORITY = 2
DEAD_LETTER_SUFFIX = "-dlq"
POISON_SUFFIX = "-poison"  # a value ending so is poison: consumers never commit it out of a source queue
HEADERS_SUFFIX = "-h"  # a value ending so is enqueued with headers_of(value), and must come back with exactly those
HEADER_KEY = "rcq-chaos"
HEADERS_SHARE = 0.2  # of the writes to a featured queue: every value but a poison one carries headers
FEATURE_MIX: dict[str, int] = {"dlq-dequeue": 8, "redrive": 2}  # added to the mix when there are dead-letter queues
PRIORITY_SHARE = 0.5  # of the writes to a queue with priorities: a random priority 0..max_priority
ONE_REQUEST_SHARE = 0.4  # of the enqueues one call can carry: sent as one-request enqueues (retry keys)
DELAY_SHARE = 0.2  # ... a delay of DELAY_S
TTL_SHARE = 0.2  # ... a time to live of TTL_S (longer than any delay)
POISON_SHARE = 0.15  # ... one poison value more (never with a ttl: poison must die of deliveries or rejects)
POISON_REJECT_SHARE = 0.25  # on a queue with max_deliveries, a consumer rejects poison this often (else aborts)
DELAY_S = (0.2, 2.0)
TTL_S = (2.5, 6.0)
REDRIVE_ITEMS_MAX = 4


def queue_names(count: int) -> list[str]:
    return [f"q{i}" for i in range(count)]


def is_poison(value: object) -> bool:
    return isinstance(value, str) and value.endswith(POISON_SUFFIX)


def has_headers(value: object) -> bool:
    """Whether the workload enqueued ``value`` with headers (they are :func:`headers_of` it)."""
    return isinstance(value, str) and value.endswith(HEADERS_SUFFIX)


def headers_of(value: str) -> dict[str, str]:
    """The headers an item of ``value`` must carry: derived from the value, so that anyone who sees
    the item can tell, and empty for a value not marked so."""
    return {HEADER_KEY: value} if has_headers(value) else {}


class PoisonAbort(Exception):
    """A consumer met poison and aborts its transaction (the op definitely did not commit)."""

    code = "poison_abort"


@dataclasses.dataclass(frozen=True)
class QueuePlan:
    """The settings the run gives one of its queues before the workload starts."""

    name: str
    max_items: int | None = None
    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    max_priority: int | None = None

    def settings(self) -> dict[str, Any]:
        return {"max_items": self.max_items, "max_deliveries": self.max_deliveries,
                "dead_letter_queue": self.dead_letter_queue, "max_priority": self.max_priority}

    @property
    def featured(self) -> bool:
        """Takes poison, delays, ttls and priorities."""
        return self.max_deliveries is not None or self.dead_letter_queue is not None


@dataclasses.dataclass(frozen=True)
class Topology:
    """The run's queues: each workload queue's plan, and the dead-letter queues they feed.

    ``q0`` stays plain (its own max_items only: the old paths, the limits checker); then, in turn,
    a queue with a dead-letter queue and ``max_deliveries`` (delivery counts replicated), one with a
    dead-letter queue and no delivery limit (counts in the leader's memory; poison is rejected),
    and one with ``max_deliveries`` and no dead-letter queue (dead items dropped)."""

    plans: dict[str, QueuePlan]

    @classmethod
    def of(cls, queues: list[str]) -> Topology:
        plans: dict[str, QueuePlan] = {}
        for i, queue in enumerate(queues):
            if i == 0:
                plans[queue] = QueuePlan(queue, max_items=LIMITED_QUEUE_ITEMS_MAX)
            elif i % 4 == 2:
                plans[queue] = QueuePlan(queue, dead_letter_queue=queue + DEAD_LETTER_SUFFIX, max_priority=MAX_PRIORITY)
            elif i % 4 == 3:
                plans[queue] = QueuePlan(queue, max_deliveries=MAX_DELIVERIES, max_priority=MAX_PRIORITY)
            else:
                plans[queue] = QueuePlan(queue, max_deliveries=MAX_DELIVERIES,
                                         dead_letter_queue=queue + DEAD_LETTER_SUFFIX, max_priority=MAX_PRIORITY)
        return cls(plans)

    @property
    def queues(self) -> list[str]:
        return list(self.plans)

    @property
    def dead_letter_queues(self) -> list[str]:
        return [p.dead_letter_queue for p in self.plans.values() if p.dead_letter_queue is not None]

    @property
    def all_queues(self) -> list[str]:
        """Workload queues first, then dead-letter queues (the drain's order: rejects land in the latter)."""
        return self.queues + self.dead_letter_queues

    def is_dead_letter_queue(self, queue: str) -> bool:
        return queue in self.dead_letter_queues

    def poison_policy(self, queue: str) -> str | None:
        """What a consumer does with poison from ``queue`` by default: None (a dead-letter queue:
        consume it), else reject it."""
        return None if self.is_dead_letter_queue(queue) else "reject"


@dataclasses.dataclass(frozen=True)
class Spec:
    """One generated operation: what to invoke, before anything is known of the cluster."""

    f: str
    value: dict[str, Any]
    head_rank: bool = False


class Generator:
    """A worker's op sequence, a pure function of (seed, worker)."""

    def __init__(self, seed: int, worker: int, queues: list[str], mix: dict[str, int] | None = None,
                 values_max: int = 4, topology: Topology | None = None) -> None:
        """``topology``: the queues' plans; with it, writes to featured queues get priorities, delays,
        ttls and poison, and dead-letter queues are consumed and redriven. Without it, the old workload."""
        self._random = random.Random(f"{seed}/{worker}")
        self._one_request = random.Random(f"{seed}/{worker}/one-request")  # leaves _random's draws as they were
        self.process = worker
        self.queues = queues
        self.topology = topology
        custom = mix is not None
        mix = dict(mix or DEFAULT_MIX)
        if not custom and topology is not None and topology.dead_letter_queues:
            mix.update(FEATURE_MIX)
        self._ops, self._weights = list(mix), list(mix.values())
        self._values_max = values_max
        self._seq = 0

    def _value(self, poison: bool = False, headers: bool = False) -> str:
        self._seq += 1
        return f"{self.process}-{self._seq}" + (POISON_SUFFIX if poison else HEADERS_SUFFIX if headers else "")

    def _write(self, queue: str, count: int) -> dict[str, Any]:
        rng = self._random
        plan = self.topology.plans.get(queue) if self.topology is not None else None
        if plan is None or not plan.featured:
            return {"queue": queue, "values": [self._value() for _ in range(count)]}
        headers = rng.random() < HEADERS_SHARE
        write: dict[str, Any] = {"queue": queue, "values": [self._value(headers=headers) for _ in range(count)]}
        if plan.max_priority and rng.random() < PRIORITY_SHARE:
            write["priority"] = rng.randint(0, plan.max_priority)
        if rng.random() < DELAY_SHARE:
            write["delay_s"] = round(rng.uniform(*DELAY_S), 3)
        if rng.random() < TTL_SHARE:
            write["ttl_s"] = round(rng.uniform(*TTL_S), 3)
        elif rng.random() < POISON_SHARE:
            write["values"].insert(rng.randint(0, count), self._value(poison=True))
        return write

    def next(self) -> Spec:
        rng = self._random
        f = rng.choices(self._ops, self._weights)[0]
        queue = rng.choice(self.queues)
        if f == "enqueue":
            writes = [self._write(queue, rng.randint(1, self._values_max))]
            if len(self.queues) > 1 and rng.random() < 0.3:  # a transaction spanning two queues
                other = rng.choice([q for q in self.queues if q != queue])
                writes.append(self._write(other, rng.randint(1, 2)))
            enqueue: dict[str, Any] = {"writes": writes}
            if (len(writes) == 1 and len(runs_by_headers(writes[0]["values"], headers_of)) == 1
                    and self._one_request.random() < ONE_REQUEST_SHARE):
                enqueue["one_request"] = True
            return Spec(f, enqueue)
        if f == "move":
            target = rng.choice([q for q in self.queues if q != queue] or self.queues)
            return Spec(f, {"from": queue, "to": target, "max": rng.randint(1, 3)})
        if f in ("peek", "count"):
            return Spec(f, {"queue": queue})
        if f in ("dlq-dequeue", "redrive"):
            assert self.topology is not None
            dlq = rng.choice(self.topology.dead_letter_queues)
            if f == "redrive":
                return Spec(f, {"dlq": dlq, "max_items": rng.randint(1, REDRIVE_ITEMS_MAX)})
            return Spec("dequeue", {"queue": dlq, "max": rng.randint(1, 3)})
        value: dict[str, Any] = {"queue": queue, "max": rng.randint(1, 3)}
        plan = self.topology.plans.get(queue) if self.topology is not None else None
        if f == "dequeue" and plan is not None and plan.featured:
            value["poison"] = "reject" if plan.max_deliveries is None or rng.random() < POISON_REJECT_SHARE else "abort"
        # The head-rank look dequeues (and aborts) up to HEAD_RANK_WINDOW items: deliveries that would
        # kill bystanders on a queue with max_deliveries, where priorities blur the rank anyway.
        head_rank = f == "dequeue-abort" and rng.random() < 0.5 and (plan is None or not plan.featured)
        return Spec(f, value, head_rank=head_rank)


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
        finally:
            if self.registry is not None and "transaction_id" in state:
                self.registry.remove(state["transaction_id"])
        if state["extra"] and isinstance(value, dict):
            value = {**value, **state["extra"]}  # item details, rejects, poison: whatever the outcome
        if "transaction_id" in state and isinstance(value, dict):
            value = {**value, "transaction_id": state["transaction_id"]}  # to find it in the nodes' logs
        return type_, value, error

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

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, body)
        # The acknowledgement's wall time (ms): an item whose enqueue time is later lives again (redriven).
        return "ok", {**spec.value, "ack_ms": int(time.time() * 1000)}, None

    def _poison_policy(self, spec: Spec, queue: str) -> str | None:
        """What to do with poison dequeued from ``queue``: "abort", "reject", or None (consume it:
        a dead-letter queue, or a run without a topology)."""
        if self.topology is None or self.topology.is_dead_letter_queue(queue):
            return None
        return spec.value.get("poison") or self.topology.poison_policy(queue)

    def _record_items(self, state: dict[str, Any], items: list[Item]) -> None:
        if self.topology is not None:
            state["extra"].setdefault("items", {}).update(metas_of(items))

    async def _dequeue(self, spec: Spec, state: dict[str, Any]) -> tuple[str, Any, str | None]:
        queue = spec.value["queue"]
        policy = self._poison_policy(spec, queue)

        async def body(tx: Transaction) -> None:
            items = await tx.dequeue_items(queue, spec.value["max"])
            state["values"] = [text_of(i) for i in items]
            self._record_items(state, items)
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

        await self._in_transaction(state, TRANSACTION_TIMEOUT_S, body)
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
            self._record_items(state, items)
            poison = [text_of(i) for i in items if is_poison(text_of(i))]
            if poison:  # a mover is a consumer too: it never carries poison elsewhere
                state["extra"]["poison"] = poison
                raise PoisonAbort(f"{len(poison)} poison item(s)")
            # each item keeps its headers (Item.headers) where it goes
            for values, headers in runs_by_headers(items, lambda item: item.headers):
                await enqueue_with(tx, target, [item.value for item in values], headers)
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
        self._record_items(state, items)
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
        self._record_items(state, items)
        # Walk away: no commit, no abort. The server's deadline must give the items back.
        return "ok", {"queue": queue, "values": [text_of(i) for i in items]}, None


def runs_by_headers(values: list[Any], headers: Callable[[Any], dict[str, str]]) -> list[tuple[list[Any], dict[str, str]]]:
    """``values`` split, in order, into what one enqueue call can carry: each value with headers
    alone, the plain ones between them together (a plain write is the one call it always was)."""
    runs: list[tuple[list[Any], dict[str, str]]] = []
    for value in values:
        own = headers(value)
        if own or not runs or runs[-1][1]:
            runs.append(([value], dict(own)))
        else:
            runs[-1][0].append(value)
    return runs


def write_options(write: dict[str, Any]) -> dict[str, Any]:
    """The enqueue options a generated write carries (priority, delay_s, ttl_s), as keyword arguments."""
    return {name: write[name] for name in ("priority", "delay_s", "ttl_s") if name in write}


async def enqueue_with(tx: Transaction, queue: str, values: list[Any], headers: dict[str, str], **options: Any) -> None:
    """One enqueue call; ``headers`` sent only when there are some, so a plain call is the request of
    a client that knows nothing of them."""
    if headers:
        options["headers"] = headers
    await tx.enqueue_batch(queue, values, **options)


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
        plans = [QueuePlan(dlq) for dlq in topology.dead_letter_queues] + list(topology.plans.values())
        for plan in plans:
            value = {"queue": plan.name, **plan.settings()}
            op = history.invoke(process, "configure", value)
            try:
                await client.configure_queue(plan.name, **plan.settings())
            except Exception as exc:
                history.complete(op, "info", value, error_name(exc))
                raise
            history.complete(op, "ok", value, None)


def make_client(urls: list[str], token: str | None = None, retry_timeout_s: float = RETRY_TIMEOUT_S,
                channel: bool = True) -> RcqClient:
    """A client of the cluster sending ``token`` (the cluster's, if it needs one); retry_timeout_s 0: one try.
    ``channel``: the session channel for the hot verbs (the client's default); False: HTTP only."""
    return RcqClient(urls, request_timeout_s=REQUEST_TIMEOUT_S, retry_timeout_s=retry_timeout_s, token=token,
                     channel=channel)


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
            if await empty_for_good(client, urls, queues):
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
    try:
        listed = {str(q.get("queue")): int(q.get("count", 0)) for q in await client.queues()}
    except Exception:  # asked again on the next round
        return None
    return {q: listed.get(q, 0) for q in queues}


async def empty_for_good(client: RcqClient, urls: list[str], queues: list[str]) -> bool:
    """Whether a serving leader shows every queue of ``queues`` empty with nothing that could bring
    an item back, provided no other client acts. Asked of that node: its status (serving, no open
    transaction of anyone's), every queue's count (answered by it, serving), its status again (the
    same term, still serving, still no open transaction). Then no item of these queues exists,
    locked or delayed (``count`` holds them all), and no entry can add one: the leader applied every
    entry of an earlier leader before serving (later ones are fenced), its own commits ended with
    their transactions, and a redrive, a reject or an expiry only moves items that exist. False
    when that cannot be shown now (the caller asks again later)."""
    found = await _serving_leader(client, urls)
    if found is None or not _idle(found[1]):
        return False
    url, before = found
    try:
        for queue in queues:
            info = await client.queue_info(queue)
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
