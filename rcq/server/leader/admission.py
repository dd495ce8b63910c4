"""Admission: what the leader refuses before it proposes — storage limits and fair use.

The state machine enforces the storage limits deterministically when an entry applies (a unit
past a limit is rejected whole, and its transaction aborted). The leader checks first, so that a
client normally hears ``queue_full`` (429) or ``storage_full`` (507) *before* anything is
aborted: when it enqueues, and again when it commits, against the replicated usage plus what
its own commits in flight will add (``reserve``/``release``). Only this leader proposes in its
term, and every entry of earlier terms is applied before it serves, so the two checks agree
unless the limits change under it.

The storage budget it stamps is this process's **allowance**: a node's ``storage_bytes_max`` is
shared by the partitions it hosts (docs/partitions.md, "Memory budget"). A process starts with a
static share of it (:func:`limits_of`) and takes what p0's controller gives it
(:meth:`Admission.set_storage_budget`): the entries it proposes carry that number, so every
replica enforces it.

It also keeps the per-client count of open transactions (a client is the peer address, or the
principal once authentication exists), so one client cannot fill this process's table: each
partition's leader has its own (docs/limits.md).

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

from rcq.errors import QueueFull, StorageFull, TooManyTransactions
from rcq.server.config import NodeConfig
from rcq.server.core.commands import Limits
from rcq.server.core.state_machine import QueueStateMachine, item_cost
from rcq.server.leader.storage_budget import static_share

# queue -> (items, item bytes) a transaction adds (negative: removes)
Growth = dict[str, tuple[int, int]]


def limits_of(config: NodeConfig) -> Limits:
    """The limits this process's configuration sets: what it stamps on the entries it proposes as
    leader until p0's controller gives it an allowance. The storage budget is the node's split
    evenly between ``storage_share_partitions`` (1 for a node's own process: the whole budget)."""
    return Limits(storage_bytes_max=static_share(config.storage_bytes_max, config.storage_share_partitions),
                  queue_items_max=config.queue_items_max_default, queue_bytes_max=config.queue_bytes_max_default)


class Admission:
    def __init__(self, config: NodeConfig) -> None:
        self.limits = limits_of(config)
        self.node_storage_bytes_max = config.storage_bytes_max  # the node's budget, shared by its partitions
        self._open_max = config.transactions_open_max
        self._per_client_max = config.transactions_open_per_client_max
        self._open_by_client: Counter[str] = Counter()
        self._reserved: dict[str, list[int]] = {}  # queue -> [items, cost] of commits in flight
        self._reserved_cost = 0

    # ------------------------------------------------------------ transactions
    def check_begin(self, client: str, open_total: int) -> None:
        if open_total >= self._open_max:
            raise TooManyTransactions(f"{open_total} open transactions; the limit is {self._open_max}",
                                      details={"scope": "cluster"})
        held = self._open_by_client[client]
        if held >= self._per_client_max:
            raise TooManyTransactions(
                f"this client holds {held} open transactions; the limit per client is {self._per_client_max}",
                details={"scope": "client"})

    def opened(self, client: str) -> None:
        self._open_by_client[client] += 1

    def closed(self, client: str) -> None:
        left = self._open_by_client[client] - 1
        if left > 0:
            self._open_by_client[client] = left
        else:
            del self._open_by_client[client]

    def clients(self) -> int:
        return len(self._open_by_client)

    # ----------------------------------------------------------------- storage
    def set_storage_budget(self, storage_bytes_max: int) -> int:
        """Take ``storage_bytes_max`` as this process's allowance (never above the node's budget,
        never below 1): the next entries proposed carry it. Returns the allowance now in force."""
        allowance = max(1, min(storage_bytes_max, self.node_storage_bytes_max))
        if allowance != self.limits.storage_bytes_max:
            self.limits = dataclasses.replace(self.limits, storage_bytes_max=allowance)
        return allowance

    def check_growth(self, growth: Growth, state: QueueStateMachine) -> None:
        """Raise QueueFull/StorageFull when ``growth`` would take a queue or the state past a limit.
        Call inside the replicator's read (``state`` is the state machine)."""
        limits = self.limits
        total = 0
        for queue, (items, item_bytes) in growth.items():
            cost = item_cost(items, item_bytes)
            total += cost
            if items <= 0 and cost <= 0:
                continue
            count_now, cost_now = state.usage(queue)
            reserved_items, reserved_cost = self._reserved.get(queue, (0, 0))
            max_items, max_bytes = state.effective_limits(queue, limits)
            if items > 0 and count_now + reserved_items + items > max_items:
                held = count_now + reserved_items  # committed, and reserved by commits still in flight
                raise QueueFull(f"queue {queue!r} holds {held} items and this transaction adds {items}: over its "
                                f"limit of {max_items} items", details={"queue": queue, "max_items": max_items})
            if cost > 0 and cost_now + reserved_cost + cost > max_bytes:
                raise QueueFull(f"queue {queue!r} holds {cost_now + reserved_cost} bytes (items and their "
                                f"bookkeeping) and this transaction adds {cost}: over its limit of {max_bytes} bytes",
                                details={"queue": queue, "max_bytes": max_bytes})
        if total > 0 and state.storage_cost + self._reserved_cost + total > limits.storage_bytes_max:
            raise StorageFull(self._storage_full_message(state.storage_cost + self._reserved_cost),
                              details={"storage_bytes_max": limits.storage_bytes_max,
                                       "node_storage_bytes_max": self.node_storage_bytes_max})

    def _storage_full_message(self, held: int) -> str:
        allowance, budget = self.limits.storage_bytes_max, self.node_storage_bytes_max
        if allowance >= budget:
            return f"the queues hold {held} bytes (items and their bookkeeping); the node's budget is {budget}"
        return (f"the queues hold {held} bytes (items and their bookkeeping); this partition's share of the "
                f"node's budget is {allowance} of {budget} (shared by the node's partitions, given out again "
                "as they fill: docs/partitions.md)")

    def reserve(self, growth: Growth) -> None:
        self._add(growth, 1)

    def release(self, growth: Growth) -> None:
        self._add(growth, -1)

    def _add(self, growth: Growth, sign: int) -> None:
        for queue, (items, item_bytes) in growth.items():
            if items <= 0 and item_bytes <= 0:
                continue  # only growth is reserved: a shrinking commit frees room when it applies
            entry = self._reserved.setdefault(queue, [0, 0])
            cost = item_cost(items, item_bytes)
            entry[0] += sign * max(items, 0)
            entry[1] += sign * max(cost, 0)
            self._reserved_cost += sign * max(cost, 0)
            if entry[0] <= 0 and entry[1] <= 0:
                del self._reserved[queue]

    def clear_reservations(self) -> None:
        self._reserved = {}
        self._reserved_cost = 0


def merge_growth(parts: Iterable[Growth]) -> Growth:
    merged: dict[str, tuple[int, int]] = {}
    for growth in parts:
        for queue, (items, item_bytes) in growth.items():
            old_items, old_bytes = merged.get(queue, (0, 0))
            merged[queue] = (old_items + items, old_bytes + item_bytes)
    return merged
