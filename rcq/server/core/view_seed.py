"""ViewSeed: what a new leader's view of a queue starts from, read from the replicated queue.

A leader keeps its own view of each queue (``rcq/server/leader/queue_view.py``): which items are
visible to dequeue, by priority, and which wait for a time (delay, expiry) or a death (delivery
limit). It builds that view once, when it starts to serve, from the state at its barrier; this
module reads the queue for it in one pass.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rcq.server.core.queue import Queue


@dataclass(slots=True)
class ViewSeed:
    ranges: dict[int, list[tuple[int, int]]]  # priority -> [first, end) ranges of visible ids, head first
    delayed: list[tuple[int, int, int]]  # (visible_at_ms, item id, priority)
    expiring: list[tuple[int, int]]  # (expires_at_ms, item id)
    deliveries: dict[int, int]  # item id -> recorded deliveries
    at_limit: list[int]  # items whose deliveries reached max_deliveries: they must die


def view_seed(queue: Queue | None, now_ms: int) -> ViewSeed:
    """The items visible at ``now_ms`` by priority (ranges, head first), the delayed ones, the
    expiring ones, the recorded delivery counts, and the items already at their delivery limit."""
    seed = ViewSeed({}, [], [], {}, [])
    if queue is None:
        return seed
    meta_of = queue.meta
    max_deliveries = queue.settings.max_deliveries
    plain: list[int] = []
    by_priority: dict[int, list[int]] = {}
    for item_id in queue.live_ids():
        meta = meta_of.get(item_id)
        if meta is None:
            plain.append(item_id)
            continue
        if meta.expires_at_ms is not None:
            seed.expiring.append((meta.expires_at_ms, item_id))
        if meta.deliveries:
            seed.deliveries[item_id] = meta.deliveries
            if max_deliveries is not None and meta.deliveries >= max_deliveries:
                seed.at_limit.append(item_id)
                continue
        if meta.visible_at_ms > now_ms:
            seed.delayed.append((meta.visible_at_ms, item_id, meta.priority))
        elif meta.priority:
            by_priority.setdefault(meta.priority, []).append(item_id)
        else:
            plain.append(item_id)
    if plain:
        by_priority[0] = plain
    seed.ranges = {p: coalesce_ranges(ids) for p, ids in by_priority.items()}
    return seed


def coalesce_ranges(item_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Turn increasing ids into [first, end) ranges of consecutive ids."""
    ranges: list[tuple[int, int]] = []
    for item_id in item_ids:
        if ranges and item_id == ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], item_id + 1)
        else:
            ranges.append((item_id, item_id + 1))
    return ranges
