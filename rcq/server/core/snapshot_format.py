"""The state machine's snapshot content: encode it, read it back (every format still readable), hash it.

A snapshot is a ``meta`` dict of plain values (lists, tuples, ints, str: everything but the
items) and the items as (queue, item id, value), sorted by queue then id; the raft layer
(``rcq/server/raft/snapshots.py``) stores both in one file. Formats are versioned here, where
they are defined: ``SNAPSHOT_FORMAT`` is what is written, ``SNAPSHOT_FORMATS_READ`` what a node
still restores (1: no queue settings; 2: purge total and limits; 3: settings, every total,
enqueue times, item metadata; 4: the active feature level, the cluster's identity, and item headers as a ninth field of
an item's metadata, only on items that have some; at feature level 3, retry keys in
``retry_keys`` when there are some), so a node reads the snapshots of the
version before it. Format 4 is written only at feature level 2 and above: a cluster at level 1
writes format 3, byte for byte what rcq 0.1 writes, so that its nodes read each other's snapshots
(rcq.server.core.features). A snapshot of a level above the node's stops it: UnreadableLevel.

The digest hashes the same content: replicas that applied the same log have the same digest.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from rcq.immutable import immutable
from rcq.server.core.commands import QueueSettings, decode_headers
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX, LEVEL_OF_SNAPSHOT_FORMAT_4, UnreadableLevel
from rcq.server.core.ledger import Ledger
from rcq.server.core.outcomes import KeyRecord, TransactionOutcome, TransactionRecords
from rcq.server.core.queue import ItemMeta, Queue, QueueStats

SNAPSHOT_FORMAT = 4  # the newest written; 3 while the cluster's feature level is 1
SNAPSHOT_FORMATS_READ = (1, 2, 3, 4)

Members = dict[str, tuple[str, str]]  # node id -> (Raft address, HTTP URL)


def encode_meta(ledger: Ledger, records: TransactionRecords, last_index: int, barrier_term: int,
                members: Members, level: int = LEVEL_BASE, level_writer: str | None = None,
                cluster_id: str | None = None, directory: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything but the items, as plain values."""
    leveled = level >= LEVEL_OF_SNAPSHOT_FORMAT_4
    return {
        "format": SNAPSHOT_FORMAT if leveled else 3,
        "next_item_id": ledger.next_item_id,
        "now_ms": ledger.now_ms,
        "last_index": last_index,
        "barrier_term": barrier_term,
        "queues": [
            (name, q.stats.enqueued_total, q.stats.dequeued_total, q.stats.purged_total, q.max_items,
             q.max_bytes, q.settings.as_tuple(), q.stats.totals(), q.time_boundaries())
            for name, q in sorted(ledger.queues.items())
        ],
        "item_meta": [
            (name, item_id, meta.as_tuple())
            for name, q in sorted(ledger.queues.items()) for item_id, meta in sorted(q.meta.items())
        ],
        "outcomes": [
            (tid, o.status, o.index, o.at_ms, o.reason) for tid, o in records.outcomes.items()
        ],
        "outcomes_forgotten_term": records.forgotten_term,
        "idempotency": [(k, (), r.index, r.at_ms) for k, r in records.keys.items()],
        # Retry keys (feature level 3; rcq.server.core.outcomes), only when there are some: a
        # cluster below level 3 never has any, and its snapshots keep their shape and digest.
        **({"retry_keys": [(k, r.index, r.at_ms) for k, r in records.retry_keys.items()]}
           if len(records.retry_keys) else {}),
        # Only once a membership change recorded one: older states keep their digest.
        **({"members": sorted((node_id, *where) for node_id, where in members.items())} if members else {}),
        **({"level": level, "level_writer": level_writer} if leveled else {}),
        # The cluster's identity (format 4 only: it exists from level 2 on), once a leader gave one.
        **({"cluster_id": cluster_id} if leveled and cluster_id is not None else {}),
        # The partition directory (feature level 4; rcq.server.core.directory), once it holds anything.
        **({"directory": directory} if directory else {}),
    }


def encode_items(ledger: Ledger) -> Iterator[tuple[str, int, bytes]]:
    """Every item as (queue, item id, value), sorted by queue then id."""
    for name in sorted(ledger.queues):
        for item_id, value in ledger.queues[name].items.items():
            yield name, item_id, value


def digest(meta: dict[str, Any], items: Iterable[tuple[str, int, bytes]]) -> str:
    """A hash of a snapshot's content (``meta`` and ``items`` as encoded above)."""
    h = hashlib.sha256()
    for key, value in meta.items():
        h.update(repr((key, value)).encode())
    for queue_name, item_id, value in items:
        h.update(repr((queue_name, item_id, len(value))).encode())
        h.update(value)
    return h.hexdigest()


@immutable
class Decoded:
    """A snapshot read back: the parts the state machine replaces its own with."""

    ledger: Ledger
    last_index: int
    barrier_term: int
    outcomes: list[tuple[str, TransactionOutcome]]
    outcomes_forgotten_term: int
    keys: list[tuple[str, KeyRecord]]
    retry_keys: list[tuple[str, KeyRecord]]
    members: Members
    level: int
    level_writer: str | None
    cluster_id: str | None
    directory: dict[str, Any] | None


def decode(meta: dict[str, Any], items: Iterable[tuple[str, int, bytes]], level_max: int = LEVEL_MAX) -> Decoded:
    """Read a snapshot (``items`` sorted as :func:`encode_items` yields them); ValueError for an
    unknown format."""
    if meta.get("format") not in SNAPSHOT_FORMATS_READ:
        raise ValueError(f"snapshot format {meta.get('format')!r}, expected one of {SNAPSHOT_FORMATS_READ}")
    level = int(meta.get("level", LEVEL_BASE))
    if level > level_max:
        raise UnreadableLevel(level, meta.get("level_writer"), "this node's snapshot", level_max)
    ledger = Ledger()
    for name, enqueued_total, dequeued_total, *rest in meta["queues"]:
        ledger.queues[name] = _decode_queue(enqueued_total, dequeued_total, rest)
    item_meta = {(name, item_id): fields for name, item_id, fields in meta.get("item_meta", ())}
    for name, item_id, value in items:
        fields = item_meta.get((name, item_id))
        ledger.load(name, item_id, value, None if fields is None else _item_meta(fields))
    ledger.next_item_id = meta["next_item_id"]
    ledger.now_ms = meta["now_ms"]
    return Decoded(
        ledger=ledger,
        last_index=meta["last_index"],
        barrier_term=meta["barrier_term"],
        outcomes=[(tid, TransactionOutcome(status, index, at_ms, reason))
                  for tid, status, index, at_ms, reason in meta["outcomes"]],
        outcomes_forgotten_term=int(meta.get("outcomes_forgotten_term", 0)),
        keys=[(key, KeyRecord(index, at_ms)) for key, _ids, index, at_ms in meta["idempotency"]],
        retry_keys=[(key, KeyRecord(index, at_ms)) for key, index, at_ms in meta.get("retry_keys", ())],
        members={node_id: (raft_address, url) for node_id, raft_address, url in meta.get("members", ())},
        level=level,
        level_writer=meta.get("level_writer"),
        cluster_id=meta.get("cluster_id"),
        directory=meta.get("directory"),
    )


def _item_meta(fields: Any) -> ItemMeta:
    """Eight fields (format 3 and 4), or nine: with the item's headers (format 4)."""
    meta = ItemMeta(*fields[:8])
    if len(fields) > 8:
        meta.headers = decode_headers(fields[8])
    return meta


def _decode_queue(enqueued_total: int, dequeued_total: int, rest: list[Any]) -> Queue:
    purged_total, max_items, max_bytes = rest[:3] if rest else (0, None, None)  # format 1: no settings
    queue = Queue(max_items, max_bytes)
    queue.stats.enqueued_total = enqueued_total
    queue.stats.dequeued_total = dequeued_total
    queue.stats.purged_total = purged_total
    if len(rest) > 3:  # format 3: settings, every total, enqueue times
        settings, totals, (time_ids, time_ms) = rest[3:6]
        queue.settings = QueueSettings(*settings)
        for field_name, total in zip(QueueStats.TOTALS, totals, strict=True):
            setattr(queue.stats, field_name, total)
        queue.restore_times(time_ids, time_ms)
    return queue
