"""One queue of a backup, put back into a running cluster as a new queue, through ordinary commits.

What an operator needs after ``DELETE /v1/queues/orders``: ``rcq restore PATH --queue orders
--into-queue orders.restored`` (docs/backup.md). The file is verified first; the new queue must
not exist. It is configured with the backed-up queue's settings (a dead-letter queue that does
not exist in this cluster is left out, and said so), then the items are enqueued in order, in
transactions of at most RESTORE_BATCH_ITEMS items or RESTORE_BATCH_BYTES bytes, each committed
with an idempotency key derived from the backup's digest, the queue and the batch number: a
commit retried after an unknown outcome is never applied twice, and a restore run again after a
failure skips the batches the first run committed (the keys are remembered for 24 hours).

From a backup set, the queue is read from the part of the partition p0's directory placed it in,
and the new queue is placed in the partition of that name when the running cluster has one.

Each item keeps its value, priority and headers; a delay or TTL still running at the backup's
time runs for what was left of it (from the commit). What ordinary enqueues cannot set is not
restored: delivery counts start at 0, and items that were dead letters in the backup are plain
items of the new queue (their reason is noted in the report).

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rcq.backup.backup_set import P0, is_backup_set, read_directory, verify_set
from rcq.backup.fileformat import read_body, verify
from rcq.errors import CommitOutcomeUnknown, InvalidRequest, QueueNotFound

RESTORE_BATCH_ITEMS = 500
RESTORE_BATCH_BYTES = 4 << 20
COMMIT_ATTEMPTS = 5

# The positions of a queue row's fields in the backup's meta (snapshot format 3 and 4).
_MAX_ITEMS, _MAX_BYTES, _SETTINGS = 4, 5, 6
# QueueSettings.as_tuple(): max_deliveries, dead_letter_queue, default_ttl_ms, default_delay_ms, max_priority
# ItemMeta.as_tuple(): priority, visible_at_ms, expires_at_ms, deliveries, dead_reason, dead_source,
# dead_deliveries, dead_note[, headers]

Options = tuple[int, float | None, float | None, Any]  # priority, delay_s, ttl_s, headers


async def restore_one_queue(client: Any, path: Path, queue: str, into: str,
                            progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Restore ``queue`` of the backup (a file, or a set: the part that holds the queue) at
    ``path`` into the new queue ``into``; a report."""
    notes: list[str] = []
    partition: str | None = None
    if is_backup_set(path):
        path, partition = await _part_holding(client, path, queue, notes)
    header = verify(path)
    _header, meta, items = read_body(path)
    rows = {row[0]: row for row in meta["queues"]}
    if queue not in rows:
        getattr(items, "close", lambda: None)()
        raise QueueNotFound(f"the backup has no queue {queue!r} (it has {len(rows)} queues)")
    if any(existing["queue"] == into for existing in await client.queues()):
        raise InvalidRequest(f"the queue {into!r} exists: restore into a new queue")
    row = rows[queue]
    settings = await _configure(client, into, row, notes, partition)
    item_meta = {item_id: fields for name, item_id, fields in meta.get("item_meta", ()) if name == queue}
    now_ms = int(meta["now_ms"])
    expected = row[1] - row[2] - (row[3] if len(row) > 3 else 0)  # enqueued - dequeued - purged (a guide only)
    done = commits = 0
    key_base = f"restore:{header.data_digest[:24]}:{queue}:{into}"
    for batch_no, (options, values) in enumerate(_batches(_queue_items(items, queue), item_meta, now_ms)):
        await _commit_batch(client, into, options, values, f"{key_base}:{batch_no}")
        commits += 1
        done += len(values)
        if progress is not None:
            progress(done, max(done, expected))
    dead = sum(1 for fields in item_meta.values() if len(fields) > 4 and fields[4] is not None)
    if dead:
        notes.append(f"{dead} items were dead letters in the backup; they are plain items of {into!r}")
    return {"queue": queue, "into_queue": into, "items": done, "commits": commits, "index": header.index,
            "data_digest": header.data_digest, "settings": settings, "notes": notes}


async def _part_holding(client: Any, path: Path, queue: str, notes: list[str]) -> tuple[Path, str | None]:
    """The part of the set at ``path`` that holds ``queue`` (as p0's directory places it), and the
    partition of the running cluster to place the new queue in (None: where the cluster places a new
    queue, said in ``notes`` when the backed-up partition does not exist here)."""
    backup_set = verify_set(path)
    placement = dict(read_directory(backup_set.p0.path).get("directory", {}).get("placement", ()))
    name = (placement.get(queue) or (P0,))[0]
    part = backup_set.part(name)
    if part is None:  # verify_set holds every placed partition's part; a placement names one
        raise QueueNotFound(f"the backup places {queue!r} in partition {name}, whose part the set lacks")
    if name == P0:
        return part.path, None
    if any(row["name"] == name for row in await client.partitions()):
        return part.path, name
    notes.append(f"partition {name} (where {queue!r} lived) does not exist here: {queue!r} was restored into the "
                 "partition this cluster places a new queue in")
    return part.path, None


async def _configure(client: Any, into: str, row: Any, notes: list[str], partition: str | None = None
                     ) -> dict[str, Any]:
    settings = list(row[_SETTINGS]) if len(row) > _SETTINGS else [None] * 5
    max_deliveries, dead_letter_queue, ttl_ms, delay_ms, max_priority = (settings + [None] * 5)[:5]
    if dead_letter_queue is not None:
        names = {existing["queue"] for existing in await client.queues()}
        if dead_letter_queue not in names:
            notes.append(f"dead-letter queue {dead_letter_queue!r} does not exist here: {into!r} has none")
            dead_letter_queue = None
    chosen = {"max_items": row[_MAX_ITEMS] if len(row) > _MAX_ITEMS else None,
              "max_bytes": row[_MAX_BYTES] if len(row) > _MAX_BYTES else None,
              "max_deliveries": max_deliveries, "dead_letter_queue": dead_letter_queue,
              "default_ttl_s": None if ttl_ms is None else ttl_ms / 1000,
              "default_delay_s": None if delay_ms is None else delay_ms / 1000, "max_priority": max_priority}
    await client.configure_queue(into, **chosen, **({"partitions": [partition]} if partition else {}))
    return {**chosen, **({"partitions": [partition]} if partition else {})}


def _queue_items(items: Iterator[tuple[str, int, bytes]], queue: str) -> Iterator[tuple[int, bytes]]:
    """The items of ``queue``, in order (the backup holds them sorted by queue, then id)."""
    seen = False
    for name, item_id, value in items:
        if name == queue:
            seen = True
            yield item_id, value
        elif seen:
            break  # past the queue: the rest of the file is not needed
    close = getattr(items, "close", None)
    if close is not None:
        close()


def _options(fields: Any, now_ms: int) -> Options:
    if fields is None:
        return 0, None, None, None
    priority, visible_at_ms, expires_at_ms = int(fields[0]), int(fields[1]), fields[2]
    delay_s = (visible_at_ms - now_ms) / 1000 if visible_at_ms > now_ms else None
    ttl_s = max(0.001, (int(expires_at_ms) - now_ms) / 1000) if expires_at_ms is not None else None
    headers = fields[8] if len(fields) > 8 else None
    return priority, delay_s, ttl_s, headers


def _batches(items: Iterator[tuple[int, bytes]], item_meta: dict[int, Any], now_ms: int
             ) -> Iterator[tuple[Options, list[bytes]]]:
    """Runs of consecutive items with the same options, within the batch bounds."""
    options: Options | None = None
    values: list[bytes] = []
    size = 0
    for item_id, value in items:
        these = _options(item_meta.get(item_id), now_ms)
        if values and (these != options or len(values) >= RESTORE_BATCH_ITEMS
                       or size + len(value) > RESTORE_BATCH_BYTES):
            assert options is not None
            yield options, values
            values, size = [], 0
        options = these
        values.append(value)
        size += len(value)
    if values and options is not None:
        yield options, values


async def _commit_batch(client: Any, into: str, options: Options, values: list[bytes], key: str) -> None:
    priority, delay_s, ttl_s, headers = options
    extra: dict[str, Any] = {"headers": dict(headers)} if headers else {}
    for attempt in range(COMMIT_ATTEMPTS):
        transaction = await client.begin()
        try:
            await transaction.enqueue_batch(into, values, priority=priority or None, delay_s=delay_s, ttl_s=ttl_s,
                                            **extra)
            await transaction.commit(idempotency_key=key)  # a retry of a committed batch is a duplicate
            return
        except CommitOutcomeUnknown:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
        except BaseException:
            with contextlib.suppress(Exception):
                await transaction.abort()
            raise
