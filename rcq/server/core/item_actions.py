"""The apply of an :class:`~rcq.server.core.commands.ItemsAction`: what a leader does to named items.

A leader proposes these units (docs/queue-features.md): ``deliver`` records a delivery (or kills
an item at its queue's ``max_deliveries``), ``dead_letter`` and ``expire`` kill the items for
which the rule holds at the entry's time, ``reject`` kills the items a transaction rejected, and
``redrive`` sends dead items back to the queues they died in. Each applies only where its rule
holds at the entry's time, so a proposal that raced another change does nothing to the items it
no longer fits. An item that dies goes to its queue's dead-letter queue, or is dropped
(:meth:`~rcq.server.core.ledger.Ledger.kill`).

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from rcq.server.core.commands import EnqueuedRange, ItemsAction, ItemsOutcome
from rcq.server.core.ledger import Ledger


def apply_action(ledger: Ledger, action: ItemsAction, index: int, item_ids_max: int) -> ItemsOutcome:
    """Apply ``action`` at ``index``; a unit naming more than ``item_ids_max`` items is rejected."""
    queue = ledger.queues.get(action.queue)
    if queue is None:
        return ItemsOutcome("done", index, action.action, action.queue)
    if len(action.item_ids) > item_ids_max:
        return ItemsOutcome("rejected", index, action.action, action.queue, reason="too_many_items")
    acted: list[int] = []
    counts: list[int] = []
    dead: list[int] = []
    removed: list[int] = []
    moved: list[EnqueuedRange] = []
    max_deliveries = queue.settings.max_deliveries
    now = ledger.now_ms
    for item_id in dict.fromkeys(action.item_ids):  # each id once, in the order given
        if item_id not in queue.items:
            continue
        meta = queue.meta_of(item_id)
        kind = action.action
        if kind == "deliver":
            if max_deliveries is not None and meta.deliveries >= max_deliveries:
                dead.append(item_id)
                reason = "max_deliveries"
            else:
                own = queue.own_meta(item_id)
                own.deliveries += 1
                acted.append(item_id)
                counts.append(own.deliveries)
                continue
        elif kind == "dead_letter":
            if max_deliveries is None or meta.deliveries < max_deliveries:
                continue
            reason = "max_deliveries"
        elif kind == "expire":
            if meta.expires_at_ms is None or meta.expires_at_ms > now:
                continue
            reason = "expired"
        elif kind == "reject":
            reason = "rejected"
        else:  # redrive
            if meta.dead_reason is None or meta.dead_source is None:
                continue
            acted.append(item_id)
            removed.append(item_id)
            moved.append(ledger.redrive(queue, item_id, meta))
            continue
        if kind != "deliver":
            acted.append(item_id)
        removed.append(item_id)
        arrival = ledger.kill(action.queue, queue, item_id, reason, action.note if kind == "reject" else None)
        if arrival is not None:
            moved.append(arrival)
    if removed:
        queue.forget_old_times()
    return ItemsOutcome("done", index, action.action, action.queue, acted=tuple(acted), counts=tuple(counts),
                        dead=tuple(dead), removed=tuple(removed), moved=tuple(moved))
