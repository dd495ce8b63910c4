"""The workload's generators: seeded op sequences, the run's queues and the values they write.

Each worker ``w`` draws its operations from ``random.Random(f"{seed}/{w}")``, so a run's op
sequence per worker is the same for the same seed (what each op *returns* depends on the cluster,
of course: :mod:`chaos.executor` runs them). Values are unique strings ``"<process>-<seq>"``.

Queue features (docs/queue-features.md), with a :class:`Topology`: ``q0`` stays plain; the other
queues get dead-letter queues (``<queue>-dlq``), ``max_deliveries`` and ``max_priority`` (see
Topology.of), set by ``configure`` ops before the workload starts (chaos.workload). Writes to
them carry priorities, delays and ttls, and some carry a poison value
(``<process>-<seq>-poison``, :func:`is_poison`), which consumers never commit out of a workload
queue. Workers also consume the dead-letter queues and redrive them.

Item headers (feature level 2): some writes to featured queues carry values marked
``<process>-<seq>-h`` (:func:`has_headers`); each such item is enqueued with the headers
:func:`headers_of` derives from its value, ``{"rcq-chaos": value}``, alone in its enqueue call
(the client gives one set of headers to a whole call), plain values of the write batched between
them (:func:`runs_by_headers`), so the write's order is kept.

One-request enqueues (``RcqClient.enqueue``: begin, enqueue and commit in one request): a share
of the single-queue writes that one enqueue call can carry (``"one_request": true`` in the op's
value), drawn from a generator of their own so that the rest of a seed's sequence is what it was.

Spread queues (docs/partitions.md, "Spread queues"; ``spread`` > 0 in :meth:`Topology.of`):
``s0``, ``s1``, ... each spread over every partition (``s0`` with a dead-letter queue spread
likewise, ``s1`` with a ``max_items`` its fragments share: :func:`spread_plans`), beside the
queues placed in one partition, and ``spread-probe`` for the starvation
probe (chaos.starvation), which no worker touches. An op whose transaction begins on a spread
queue says how it picks the fragment (drawn from a generator of its own): ``"fragment": "p1"``
(begun in that partition), ``"partition_key": "k3"`` (the key's fragment), or neither (the
client's choice: the next fragment in turn, a first dequeue moving on from empty ones). A move out
of a spread queue goes, more often than not, into another spread queue (the same partitions: the
move is atomic inside the transaction's fragment).

Must not import: rcq (a seed's op sequence owes nothing to the cluster).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

# op -> weight; the defaults keep queues non-empty (enqueues outnumber dequeues by value)
DEFAULT_MIX: dict[str, int] = {
    "enqueue": 40, "dequeue": 22, "dequeue-abort": 10, "peek": 8, "move": 12, "vanish": 3, "count": 4,
}
# The run's first queue gets its own max_items (checked by the limits checker); queue_full refusals
# are definite failures the total-queue checker must account for.
LIMITED_QUEUE_ITEMS_MAX = 40
# The plain spread queue (s1, s4, ...) gets max_items too, split by the server into one share per
# fragment (spread_items_max): the whole queue's limit is the plain limited queue's, and never
# below this many per fragment.
SPREAD_SHARE_ITEMS_MIN = 2

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
SPREAD_PREFIX = "s"  # spread queues: s0, s1, ...
STARVATION_QUEUE = "spread-probe"  # the starvation probe's spread queue (chaos.starvation): no worker's
FRAGMENT_CHOICES = ("fragment", "partition_key", "client")  # how a transaction on a spread queue picks its fragment
PARTITION_KEYS = 8  # partition keys k0 ... k7
SPREAD_MOVE_SHARE = 0.6  # of the moves out of a spread queue: into another spread queue


def queue_names(count: int) -> list[str]:
    return [f"q{i}" for i in range(count)]


def spread_queue_names(count: int) -> list[str]:
    return [f"{SPREAD_PREFIX}{i}" for i in range(count)]


def is_poison(value: object) -> bool:
    return isinstance(value, str) and value.endswith(POISON_SUFFIX)


def has_headers(value: object) -> bool:
    """Whether the workload enqueued ``value`` with headers (they are :func:`headers_of` it)."""
    return isinstance(value, str) and value.endswith(HEADERS_SUFFIX)


def headers_of(value: str) -> dict[str, str]:
    """The headers an item of ``value`` must carry: derived from the value, so that anyone who sees
    the item can tell, and empty for a value not marked so."""
    return {HEADER_KEY: value} if has_headers(value) else {}


@dataclasses.dataclass(frozen=True)
class QueuePlan:
    """The settings the run gives one of its queues before the workload starts."""

    name: str
    max_items: int | None = None
    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    max_priority: int | None = None
    partition: str | None = None  # where it is placed (None: a run without partitions; p0)
    spread: tuple[str, ...] = ()  # a spread queue: every partition it has a fragment in (partition unused)

    def settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"max_items": self.max_items, "max_deliveries": self.max_deliveries,
                                    "dead_letter_queue": self.dead_letter_queue, "max_priority": self.max_priority}
        if self.spread:
            settings["partitions"] = list(self.spread)
        elif self.partition is not None:
            settings["partitions"] = [self.partition]
        return settings

    @property
    def partitions(self) -> tuple[str, ...]:
        """Where it lives: its fragments' partitions (spread), or its one partition (p0 by default)."""
        return self.spread or (self.partition or "p0",)

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
    probe: QueuePlan | None = None  # the starvation probe's spread queue (no worker's)

    @classmethod
    def of(cls, queues: list[str], partitions: int = 1, spread: int = 0) -> Topology:
        """``partitions`` > 1: queue i is placed in partition ``p{i % partitions}``, its dead-letter
        queue with it (docs/partitions.md), so transactions over two queues sometimes span two
        partitions, and are refused. ``spread`` (with ``partitions`` > 1): that many spread queues
        more, over every partition (:meth:`spread_plans`), and the starvation probe's."""
        if spread and partitions < 2:
            raise ValueError("spread queues need two partitions or more")
        plans: dict[str, QueuePlan] = {}
        for i, queue in enumerate(queues):
            partition = f"p{i % partitions}" if partitions > 1 else None
            if i == 0:
                plans[queue] = QueuePlan(queue, max_items=LIMITED_QUEUE_ITEMS_MAX, partition=partition)
            elif i % 4 == 2:
                plans[queue] = QueuePlan(queue, dead_letter_queue=queue + DEAD_LETTER_SUFFIX, max_priority=MAX_PRIORITY,
                                         partition=partition)
            elif i % 4 == 3:
                plans[queue] = QueuePlan(queue, max_deliveries=MAX_DELIVERIES, max_priority=MAX_PRIORITY,
                                         partition=partition)
            else:
                plans[queue] = QueuePlan(queue, max_deliveries=MAX_DELIVERIES,
                                         dead_letter_queue=queue + DEAD_LETTER_SUFFIX, max_priority=MAX_PRIORITY,
                                         partition=partition)
        every = tuple(f"p{i}" for i in range(partitions))
        plans.update(spread_plans(spread_queue_names(spread), every))
        return cls(plans, QueuePlan(STARVATION_QUEUE, spread=every) if spread else None)

    @property
    def partitioned(self) -> bool:
        return any(plan.partition is not None or plan.spread for plan in self.plans.values())

    def _plan_of(self, queue: str) -> QueuePlan | None:
        """The plan of ``queue``, or of the queue whose dead-letter queue it is."""
        for plan in self.plans.values():
            if queue in (plan.name, plan.dead_letter_queue):
                return plan
        return self.probe if self.probe is not None and queue == self.probe.name else None

    def partitions_of(self, queue: str) -> tuple[str, ...]:
        """Every partition ``queue`` (or the dead-letter queue of one) has a fragment in: one, unless spread."""
        plan = self._plan_of(queue)
        return plan.partitions if plan is not None else ("p0",)

    def partition_of(self, queue: str) -> str:
        """The partition ``queue`` (or the dead-letter queue of one) is placed in (a spread queue's first)."""
        return self.partitions_of(queue)[0]

    def is_spread(self, queue: str) -> bool:
        return len(self.partitions_of(queue)) > 1

    @property
    def spread_queues(self) -> list[str]:
        """The workload's spread queues (not their dead-letter queues, nor the probe's)."""
        return [p.name for p in self.plans.values() if p.spread]

    @property
    def dead_letter_plans(self) -> list[QueuePlan]:
        """Each dead-letter queue, placed with its source queue (spread over its partitions, if it is spread)."""
        return [QueuePlan(p.dead_letter_queue, partition=p.partition, spread=p.spread) for p in self.plans.values()
                if p.dead_letter_queue is not None]

    @property
    def queues(self) -> list[str]:
        return list(self.plans)

    @property
    def dead_letter_queues(self) -> list[str]:
        return [p.dead_letter_queue for p in self.plans.values() if p.dead_letter_queue is not None]

    @property
    def all_queues(self) -> list[str]:
        """Workload queues first, then dead-letter queues (the drain's order: rejects land in the
        latter), then the starvation probe's queue."""
        return self.queues + self.dead_letter_queues + ([self.probe.name] if self.probe is not None else [])

    def is_dead_letter_queue(self, queue: str) -> bool:
        return queue in self.dead_letter_queues

    def poison_policy(self, queue: str) -> str | None:
        """What a consumer does with poison from ``queue`` by default: None (a dead-letter queue:
        consume it), else reject it."""
        return None if self.is_dead_letter_queue(queue) else "reject"


def spread_items_max(fragments: int) -> int:
    """The ``max_items`` of a limited spread queue over ``fragments`` partitions: the plain limited
    queue's, at least SPREAD_SHARE_ITEMS_MIN per fragment (the server refuses less than one)."""
    return max(LIMITED_QUEUE_ITEMS_MAX, SPREAD_SHARE_ITEMS_MIN * fragments)


def spread_plans(names: list[str], partitions: tuple[str, ...]) -> dict[str, QueuePlan]:
    """Spread queues over ``partitions``, in turn: one with a dead-letter queue (spread over the same
    partitions), ``max_deliveries`` and priorities; one plain but for its ``max_items``
    (:func:`spread_items_max`); one with ``max_deliveries`` and no dead-letter queue. The server
    splits a spread queue's ``max_items`` into one share per fragment, adding up to it (the first
    fragments take the remainder: 40 over three are 14, 13 and 13), and each fragment refuses
    (``queue_full``) what would take it past its share (docs/partitions.md, "Spread queues"): the
    limits checker holds the reads to the limit and to each share."""
    plans: dict[str, QueuePlan] = {}
    for i, name in enumerate(names):
        if i % 3 == 0:
            plans[name] = QueuePlan(name, max_deliveries=MAX_DELIVERIES, dead_letter_queue=name + DEAD_LETTER_SUFFIX,
                                    max_priority=MAX_PRIORITY, spread=partitions)
        elif i % 3 == 1:
            plans[name] = QueuePlan(name, max_items=spread_items_max(len(partitions)), spread=partitions)
        else:
            plans[name] = QueuePlan(name, max_deliveries=MAX_DELIVERIES, max_priority=MAX_PRIORITY, spread=partitions)
    return plans


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
        self._fragments = random.Random(f"{seed}/{worker}/fragment")  # likewise: spread queues' fragments
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

    def _spread(self, queue: str) -> tuple[str, ...]:
        """The partitions of ``queue`` when it is spread, else ()."""
        plan = self.topology.plans.get(queue) if self.topology is not None else None
        return plan.spread if plan is not None else ()

    def _fragment(self, spec: Spec, queue: str) -> Spec:
        """``spec``, whose transaction begins on ``queue``, with how it picks a spread queue's fragment."""
        spread = self._spread(queue)
        if not spread:
            return spec
        choice = self._fragments.choice(FRAGMENT_CHOICES)
        if choice == "fragment":
            return dataclasses.replace(spec, value={**spec.value, "fragment": self._fragments.choice(spread)})
        if choice == "partition_key":
            key = f"k{self._fragments.randrange(PARTITION_KEYS)}"
            return dataclasses.replace(spec, value={**spec.value, "partition_key": key})
        return spec

    def next(self) -> Spec:
        spec = self._next()
        if spec.f == "enqueue" and not spec.value.get("one_request"):
            return self._fragment(spec, spec.value["writes"][0]["queue"])
        if spec.f == "move":
            return self._fragment(spec, spec.value["from"])
        if spec.f in ("dequeue", "dequeue-abort", "vanish"):
            return self._fragment(spec, spec.value["queue"])
        return spec

    def _next(self) -> Spec:
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
            spread = self._spread(queue)
            alike = [q for q in self.queues if q != queue and self._spread(q) == spread] if spread else []
            if alike and self._fragments.random() < SPREAD_MOVE_SHARE:  # atomic in the transaction's fragment
                target = self._fragments.choice(alike)
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
