"""Ordering, as a metric and never a verdict: rcq promises best-effort order only.

For each producer (the process of an ok enqueue) and each queue, take its
values in enqueue order (op order, then place in the op's list) and count
inversions in the order they first left that queue (by a committed dequeue,
move or drain: completion index, then place in the batch). An inversion is
a pair enqueued x-before-y and dequeued y-before-x. Aborted items return to
the head and concurrent consumers finish in any order, so inversions are
expected; they are counted, with a few late values as samples.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel, build_model


def check_ordering(history: Any) -> dict[str, Any]:
    model = history if isinstance(history, QueueModel) else build_model(history)
    enqueue_rank: dict[tuple[Hashable, str], tuple[str, int]] = {}
    counter_by_producer: dict[str, int] = {}
    for tx in model.enqueues:
        if tx.op.type != "ok":
            continue
        producer = str(tx.op.process)
        for queue, values in tx.writes:
            for value in values:
                rank = counter_by_producer.get(producer, 0)
                counter_by_producer[producer] = rank + 1
                enqueue_rank.setdefault((value, queue), (producer, rank))
    first_out: dict[tuple[Hashable, str], tuple[int, int]] = {}
    for removal in model.removals:
        key = (removal.value, removal.queue)
        if removal.committed and key in enqueue_rank and removal.op.complete_index is not None:
            order = (removal.op.complete_index, removal.position)
            first_out[key] = min(first_out.get(key, order), order)
    sequences: dict[tuple[str, str], list[tuple[tuple[int, int], int, Hashable]]] = {}
    for key, order in first_out.items():
        producer, rank = enqueue_rank[key]
        sequences.setdefault((producer, key[1]), []).append((order, rank, key[0]))
    by_producer: dict[str, dict[str, int]] = {}
    late: list[Hashable] = []
    for (producer, _queue), items in sorted(sequences.items()):
        items.sort(key=lambda item: item[0])
        ranks = [rank for _, rank, _ in items]
        stats = by_producer.setdefault(producer, {"values": 0, "inversions": 0})
        stats["values"] += len(ranks)
        stats["inversions"] += _count_inversions(ranks)
        highest = -1
        for _, rank, value in items:
            if rank < highest and len(late) < SAMPLE_SIZE_MAX:
                late.append(value)
            highest = max(highest, rank)
    total = sum(stats["inversions"] for stats in by_producer.values())
    worst = max(by_producer.items(), key=lambda item: item[1]["inversions"], default=(None, None))[0]
    return {
        "valid": True,
        "inversions_count": total,
        "ordered_values_count": sum(stats["values"] for stats in by_producer.values()),
        "producers_with_inversions_count": sum(1 for stats in by_producer.values() if stats["inversions"]),
        "worst_producer": worst if total else None,
        "by_producer": by_producer,
        "late_values": late,
    }


def _count_inversions(ranks: list[int]) -> int:
    """Pairs i < j with ranks[i] > ranks[j], by merge sort: O(n log n)."""
    if len(ranks) < 2:
        return 0
    middle = len(ranks) // 2
    left, right = ranks[:middle], ranks[middle:]
    inversions = _count_inversions(left) + _count_inversions(right)
    left.sort()
    right.sort()
    merged_from_left = 0
    for value in right:
        # every left value greater than `value` forms an inversion with it
        while merged_from_left < len(left) and left[merged_from_left] <= value:
            merged_from_left += 1
        inversions += len(left) - merged_from_left
    return inversions
