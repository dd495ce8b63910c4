"""The connector on a spread queue (docs/partitions.md, "Spread queues"): which fragment each task uses.

A spread queue has a fragment in each of its partitions, and a transaction lives in one partition.
So every transaction of the connector lives in one fragment, chosen from the queue's placement
(``settings.partitions`` of ``GET /v1/queues/{q}``, in placement order, read once on the driver):

* **a writer task** writes into one fragment: the one of its Spark partition id, in turn over the
  placement (:func:`writer_fragment`). The same task writes into the same fragment on every attempt
  and in a replayed micro-batch, which keeps the per-partition idempotency keys exact
  (:mod:`rcq.spark.writer`), and a write of as many tasks as fragments loads every fragment;
* **a reader** (a micro-batch, a drain) has as many tasks per fragment as ``numPartitions`` needs,
  rounded up: ``ceil(numPartitions / fragments)`` (:func:`reader_fragments`), task ``i`` in
  fragment ``i mod fragments``, so the tasks of a batch read every fragment;
* **a commit** covers the transactions of one partition (``commit_many`` refuses more): the driver
  commits each partition's share of a job, micro-batch or drain on its own (:func:`by_partition`).

A queue that is not spread (in p0, or placed in one partition) has no fragments (``None`` here),
and every task does what it did before spread queues existed: the same labels, keys and commits.

Must not import: pyspark, pysyncobj, lmdb.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rcq.client import RcqClient
from rcq.errors import QueueNotFound
from rcq.names import transaction_partition
from rcq.spark.options import RcqOptions
from rcq.spark.remote import call

Fragments = tuple[str, ...] | None  # a spread queue's partitions in placement order; None: not spread


def spread_of(info: Mapping[str, Any]) -> Fragments:
    """The fragments of the queue ``info`` describes (``GET /v1/queues/{q}``): None unless spread."""
    partitions = [str(p) for p in (info.get("settings") or {}).get("partitions") or []]
    return tuple(partitions) if len(partitions) > 1 else None


async def fragments_of(client: RcqClient, queue: str) -> Fragments:
    """``queue``'s fragments (None: not spread, or not created yet: a first enqueue creates it in p0)."""
    try:
        return spread_of(await client.queue_info(queue))
    except QueueNotFound:
        return None


def placement(options: RcqOptions) -> Fragments:
    """The options' queue's fragments, asked now (on the driver: once per write or query)."""
    return call(options, lambda client: fragments_of(client, options.queue), "reading the queue's placement")


def writer_fragment(fragments: Fragments, task_partition: int) -> str | None:
    """The fragment a writer task of Spark partition ``task_partition`` writes into (None: not spread)."""
    return None if fragments is None else fragments[task_partition % len(fragments)]


def reader_fragments(fragments: Fragments, num_partitions: int) -> list[str | None]:
    """The fragment of each reader task: ``num_partitions`` tasks of no fragment for a queue that is
    not spread, else ``ceil(num_partitions / fragments)`` tasks per fragment, task ``i`` in fragment
    ``i mod fragments``."""
    if fragments is None:
        return [None] * num_partitions
    per_fragment = math.ceil(num_partitions / len(fragments))
    return [fragments[i % len(fragments)] for i in range(per_fragment * len(fragments))]


def fragments_with_items(info: Mapping[str, Any], fragments: Fragments,
                         available: Any) -> frozenset[str] | None:
    """The fragments that had items to read when ``info`` was read (``available(row)`` of each
    fragment's row under ``by_partition``); a fragment that did not answer counts as having some.
    None: not spread (read everything)."""
    if fragments is None:
        return None
    rows = info.get("by_partition") or {}
    return frozenset(p for p in fragments if not isinstance(rows.get(p), Mapping) or available(rows[p]) > 0)


def by_partition(transaction_ids: Iterable[str]) -> dict[str, list[str]]:
    """Transaction ids by the partition each lives in (its id names it), partitions in name order."""
    groups: dict[str, list[str]] = {}
    for transaction_id in transaction_ids:
        groups.setdefault(transaction_partition(transaction_id), []).append(transaction_id)
    return dict(sorted(groups.items()))


def shares(total: int, available: Sequence[int]) -> list[int]:
    """``total`` items shared over fragments that hold ``available`` items each: each fragment gets
    up to what it holds, the fullest the rest (water-filling), so a drain of every item of an uneven
    spread queue reads them all; what no fragment holds is shared evenly (items may still come)."""
    count = len(available)
    given = [0] * count
    left = total
    for position, index in enumerate(sorted(range(count), key=lambda i: available[i])):
        fair = left // (count - position)
        given[index] = min(max(available[index], 0), fair)
        left -= given[index]
    for i in range(count):  # the rest, evenly (left < count * fair share of every fragment)
        given[i] += left // count + (1 if i < left % count else 0)
    return given
