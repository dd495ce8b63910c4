"""The ``rcq`` sinks: batch (``df.write``) and streaming (``df.writeStream``), exactly once.

Each task attempt enqueues its rows into transactions of its own (a new one
whenever the current one would pass ``transactionBytesMax``) and does **not**
commit: it returns their ids to the driver. The driver then commits every
task's transactions in **one atomic** ``commit_many`` with an idempotency key:

* batch: ``spark-job:<job id>`` (the job id is drawn once per job on the driver);
* streaming: ``<sink id>:<batch id>`` (sink id: option ``sinkId``, else derived
  from the checkpoint location), so a micro-batch Spark replays after a crash
  commits nothing twice for as long as the server remembers the key.

A failed or retried task attempt aborts its transactions (a killed one leaves
them to expire): its enqueues vanish. A failed job commits nothing.

**A spread queue** (:mod:`rcq.spark.fragments`): a task writes every row into one fragment, the
one of its Spark partition id in turn over the placement, so its transactions live in one
partition, and the write load spreads over the fragments. ``commit_many`` covers one partition:
the driver commits each partition's transactions in one atomic ``commit_many`` of their own, all
at once, with the key ``<key>:<partition>`` (``spark-job:<job id>:p1``, ``<sink id>:<batch
id>:p1``). Exactly once holds per partition: a replayed micro-batch's tasks write the same rows
into the same fragments, so a partition already committed adds nothing, and one that was not
commits the replay. Across partitions the commit is not atomic: a batch job whose commit fails in
one partition after another committed fails naming those committed (their rows stay).

**Priorities, delay, TTL** (docs/queue-features.md): an integer ``priority`` column gives each
row its priority; the rows of different priorities go in separate enqueue operations, but into
the same transactions, so the commit and its exactly once are unchanged. Options ``delayS``
and ``ttlS`` apply to every enqueue of the write. A priority over the queue's ``max_priority``
fails the task with the server's ``invalid_request``. A ``headers`` map column gives each row's
item its headers (:mod:`rcq.spark.headers`): a chunk in which some row has headers goes as one
enqueue of per-item objects; a cluster below feature level 2 fails the task with
``feature_level_required``.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from rcq.client import RcqClient, Transaction
from rcq.errors import RcqError
from rcq.spark.fragments import Fragments, by_partition, writer_fragment
from rcq.spark.headers import Headers, enqueue_with_headers, headers_bytes
from rcq.spark.options import RcqOptions
from rcq.spark.remote import RcqSparkError, call
from rcq.spark.schema import batch_item_headers, batch_priorities, batch_values

log = logging.getLogger(__name__)
REQUEST_BYTES_MAX = 4 << 20  # item bytes per enqueue request (the server takes 32 MiB bodies)


@dataclass(frozen=True)
class TransactionsMessage(WriterCommitMessage):
    """What a successful write task hands the driver: its open transactions."""

    transaction_ids: tuple[str, ...]
    rows: int
    partition: int
    attempt: int
    fragment: str | None = None  # a spread queue: the partition whose fragment the task wrote into


Row = tuple[str | bytes, int, Headers | None]


def _rows(batches: Iterable[pa.RecordBatch]) -> Iterator[Row]:
    """(value, priority, headers) of every row; priority 0 without a ``priority`` column, headers None
    without a ``headers`` column or for a row that has none."""
    for batch in batches:
        values = batch_values(batch)
        priorities = batch_priorities(batch) or itertools.repeat(0)
        headers = batch_item_headers(batch) or itertools.repeat(None)
        # values is the one list of the batch's length; the others are lists as long or endless repeats
        yield from zip(values, priorities, headers, strict=False)


@dataclass
class Chunk:
    """Rows of one priority for one enqueue request. ``headers``: parallel to ``values``, only once
    some row of the chunk has headers (None until then: a plain chunk is the request it always was)."""

    priority: int
    values: list[str | bytes] = field(default_factory=list)
    headers: list[Headers | None] | None = None
    size: int = 0  # UTF-8 bytes of the values and of the header keys and values

    def add(self, value: str | bytes, headers: Headers | None, length: int) -> None:
        if headers and self.headers is None:
            self.headers = [None] * len(self.values)
        if self.headers is not None:
            self.headers.append(headers)
        self.values.append(value)
        self.size += length


def _chunks(batches: Iterable[pa.RecordBatch], items_max: int, bytes_max: int) -> Iterator[Chunk]:
    """The rows in chunks of one priority each, of at most ``items_max`` items and ``bytes_max`` bytes
    (one item may exceed it). The chunks being filled hold at most that much *together* (when the
    next row would not fit, the fullest one goes out), so a task's memory stays bounded however
    priorities interleave. Within a priority, rows keep their order."""
    chunks: dict[int, Chunk] = {}  # the chunks being filled, by priority
    items = size = 0
    for value, priority, headers in _rows(batches):
        length = (len(value.encode("utf-8")) if isinstance(value, str) else len(value)) + headers_bytes(headers)
        while chunks and (items >= items_max or size + length > bytes_max):
            fullest = max(chunks, key=lambda p: (chunks[p].size, len(chunks[p].values)))
            chunk = chunks.pop(fullest)
            items, size = items - len(chunk.values), size - chunk.size
            yield chunk
        filling = chunks.get(priority)
        if filling is None:
            filling = chunks[priority] = Chunk(priority)
        filling.add(value, headers, length)
        items += 1
        size += length
    yield from chunks.values()


def _enqueue(transaction: Transaction, options: RcqOptions, chunk: Chunk) -> Coroutine[Any, Any, int]:
    """One enqueue request for ``chunk``, with the options' delay and TTL. Priority 0 is the default and
    not sent, and a chunk without headers goes as ``enqueue_batch`` does: a write without priorities
    or headers is what older servers take."""
    priority = chunk.priority or None
    if chunk.headers is None:
        return transaction.enqueue_batch(options.queue, chunk.values, priority=priority, delay_s=options.delay_s,
                                         ttl_s=options.ttl_s)
    return enqueue_with_headers(transaction, options.queue, chunk.values, chunk.headers, priority=priority,
                                delay_s=options.delay_s, ttl_s=options.ttl_s)


def begin_in(client: RcqClient, options: RcqOptions, label: str, fragment: str | None) -> Coroutine[Any, Any, Transaction]:
    """A transaction labelled ``label``, begun in ``fragment``'s partition (None: as before spread queues)."""
    if fragment is None:
        return client.begin(options.transaction_timeout_s, label)
    return client.begin(options.transaction_timeout_s, label, partition=fragment)


async def enqueue_task(client: RcqClient, options: RcqOptions, batches: Iterable[pa.RecordBatch],
                       label: str, fragment: str | None = None) -> tuple[list[str], int]:
    """Enqueue every row into fresh transactions, uncommitted, with up to ``requestsInFlight`` requests
    at a time, one enqueue operation per chunk of one priority (:func:`_chunks`), each with the
    options' delay and TTL and each item with its row's headers; on any error abort them and re-raise.
    ``fragment``: a spread queue's partition every transaction is begun in."""
    transactions: list[Transaction] = []
    in_flight: set[asyncio.Task[int]] = set()
    transaction_bytes = 0
    rows = 0
    try:
        for chunk in _chunks(batches, options.batch_size, min(options.transaction_bytes_max, REQUEST_BYTES_MAX)):
            if not transactions or transaction_bytes + chunk.size > options.transaction_bytes_max:
                transactions.append(await begin_in(client, options, label, fragment))
                transaction_bytes = 0
            if len(in_flight) >= options.requests_in_flight:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # raises the first failure
            in_flight.add(asyncio.create_task(_enqueue(transactions[-1], options, chunk)))
            transaction_bytes += chunk.size
            rows += len(chunk.values)
        for finished in asyncio.as_completed(in_flight):
            await finished
    except BaseException:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        for transaction in transactions:
            await transaction.abort_quietly()
        raise
    return [t.opened_id for t in transactions], rows


def write_task(options: RcqOptions, batches: Iterator[pa.RecordBatch], label_prefix: str,
               fragments: Fragments = None) -> TransactionsMessage:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.attemptNumber() if context is not None else 0
    label = f"{label_prefix}:{partition}"
    fragment = writer_fragment(fragments, partition)
    into = f" into fragment {fragment}" if fragment is not None else ""
    ids, rows = call(options, lambda client: enqueue_task(client, options, batches, label, fragment),
                     f"enqueueing partition {partition}{into} (attempt {attempt})", coalesce=options.coalesce)
    return TransactionsMessage(tuple(ids), rows, partition, attempt, fragment)


def transaction_ids(messages: Iterable[WriterCommitMessage | None]) -> list[str]:
    return [t for m in messages if isinstance(m, TransactionsMessage) for t in m.transaction_ids]


def commit_all(options: RcqOptions, messages: Iterable[WriterCommitMessage | None], key: str,
               fragments: Fragments = None) -> None:
    ids = transaction_ids(messages)
    if not ids:  # no rows at all
        return
    if fragments is None:
        info = call(options, lambda client: client.commit_many(ids, idempotency_key=key),
                    f"committing {len(ids)} transactions with idempotency key {key!r}")
        if info.duplicate:
            log.info("rcq sink: %s was already committed; this attempt added nothing", key)
        return
    commit_by_partition(options, by_partition(ids), key)


def commit_by_partition(options: RcqOptions, groups: dict[str, list[str]], key: str) -> None:
    """A spread queue's write: each partition's transactions in one ``commit_many`` with the key
    ``<key>:<partition>``, the partitions at once; a failure names the partitions that committed."""

    async def commit(client: RcqClient) -> list[tuple[str, Any]]:
        answers = await asyncio.gather(*(client.commit_many(group, idempotency_key=f"{key}:{partition}")
                                         for partition, group in groups.items()), return_exceptions=True)
        return list(zip(groups, answers, strict=True))

    answers = call(options, commit, f"committing {sum(map(len, groups.values()))} transactions in partitions "
                                    f"{', '.join(groups)} with idempotency keys {key!r}:<partition>")
    failed = [(partition, answer) for partition, answer in answers if isinstance(answer, BaseException)]
    for partition, answer in answers:
        if not isinstance(answer, BaseException) and answer.duplicate:
            log.info("rcq sink: %s:%s was already committed; this attempt added nothing there", key, partition)
    if not failed:
        return
    committed = [partition for partition, answer in answers if not isinstance(answer, BaseException)]
    partition, error = failed[0]
    code = error.code if isinstance(error, RcqError) else type(error).__name__
    message = error.message if isinstance(error, RcqError) else str(error)
    kept = (f"partitions {', '.join(committed)} committed (their rows are in the queue)" if committed
            else "no partition committed")
    raise RcqSparkError(f"rcq {code}: committing partition {partition}'s transactions with idempotency key "
                        f"{key}:{partition} (queue {options.queue!r}, urls {','.join(options.urls)}): {message}; "
                        f"{kept}") from error


def abort_all(options: RcqOptions, messages: Iterable[WriterCommitMessage | None]) -> None:
    """Abort what the finished tasks left open; a killed task's transactions expire on their own."""
    ids = transaction_ids(messages)

    async def abort(client: RcqClient) -> None:
        for transaction_id in ids:
            await client.attach(transaction_id).abort_quietly()

    if ids:
        try:
            call(options, abort, f"aborting {len(ids)} transactions")
        except (RcqError, RuntimeError, OSError) as exc:  # they expire anyway; do not hide the job's error
            log.warning("rcq sink: abort failed (%s); the transactions will expire", exc)


class RcqBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: RcqOptions, fragments: Fragments = None) -> None:
        self.options = options
        self.fragments = fragments  # a spread queue's partitions, read once on the driver
        self.job_id = uuid4().hex  # runs once per job on the driver; pickled to every task and to commit()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TransactionsMessage:
        return write_task(self.options, iterator, f"rcq-sink:{self.job_id}", self.fragments)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_all(self.options, messages, f"spark-job:{self.job_id}", self.fragments)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_all(self.options, messages)


class RcqStreamWriter(DataSourceStreamArrowWriter):
    """Built afresh for the tasks and for commit(): only options and the sink id are shared."""

    def __init__(self, options: RcqOptions, sink_id: str, fragments: Fragments = None) -> None:
        self.options = options
        self.sink_id = sink_id
        self.fragments = fragments  # a spread queue's partitions (fixed: every build reads the same)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TransactionsMessage:
        context = TaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        return write_task(self.options, iterator, f"rcq-sink:{self.sink_id}:{batch_id}", self.fragments)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_all(self.options, messages, f"{self.sink_id}:{batchId}", self.fragments)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_all(self.options, messages)
