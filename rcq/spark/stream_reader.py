"""The ``rcq`` streaming source: at least once, never loses an item.

Offsets are logical micro-batch numbers, ``{"batch": n}``; batch ``n`` is the
range ``{"batch": n-1} -> {"batch": n}``. Nothing is read on the driver.

**Tasks** (executors): the task for partition ``i`` of batch ``n`` reads inside
a transaction labelled ``rcq-source:<consumerId>:<n>:<i>``. It first looks for an open
transaction with exactly that label (left by an earlier attempt, or by a run
that died during batch ``n``) and reuses it; otherwise it begins one. Every
dequeue carries the key ``p<i>:<chunk>``, so a reused transaction hands out the
same items again: a retried task or a replayed batch reads what its
predecessor read. Up to ``requestsInFlight`` dequeues are outstanding at a time.
Transactions are per task, not per batch, so a leader
failover (which aborts every open transaction) costs a task retry, not the
query: the retry finds no open transaction and begins a new one, and the
aborted items are back at the head.

**Replayed batches** (a restarted query re-runs the last batch of its offset log, one this
reader never offered through ``latestOffset``): their tasks only *reuse* open transactions and,
where none is left (expired, or aborted by a failover), read nothing. Reading fresh items there
would lose them: a sink that already wrote batch ``n`` drops its replay as a duplicate, and the
source would then commit their dequeue. The items of the vanished transactions are back at the
head and come in a later batch: at least once, never lost.

**Commit** (driver-side runner): a transaction of batch ``n`` is committed only
once Spark has recorded batch ``n`` as done, which Spark shows by calling
``latestOffset(start={"batch": n})`` or ``commit({"batch": n})``. Spark calls
``commit()`` late and sometimes never (last batch of an availableNow run, idle
queue), so both do the work: list the open transactions labelled
``rcq-source:<consumerId>:``, commit those of batches <= n in one ``commit_many``, abort
those of later batches (a dead run's leftovers: their items go back to the
head now, not at their timeout). That listing is also the recovery after a
restart, so the consumer id must be stable and unique per running query.

**When** (:class:`~rcq.spark.settle.Settler`): the first settle of a reader, and the one
after a replayed batch, run before ``latestOffset`` answers (they recover a dead run). After a
batch this reader offered, the commit runs in the background while batch ``n+1`` is planned and
read (it spares batch ``n+1``'s transactions), and ``latestOffset`` waits for it only when there
is no next batch (the query ends or idles) or, for availableNow, when the budget could be spent
by the batches not yet counted. The next ``latestOffset`` waits for it before anything else, and
repeats a failed one synchronously, so a commit's error still fails the query where Spark sees it.

**A spread queue** (:mod:`rcq.spark.fragments`): a batch has ``ceil(numPartitions / fragments)``
tasks per fragment, task ``i`` in fragment ``i mod fragments``, its transaction begun there (a
transaction lives in one partition), so every batch reads every fragment; a fragment that had
nothing to read when ``latestOffset`` looked gets no task in that batch (a replayed batch has all
its tasks). Labels and dequeue keys are as above, and the settle commits each partition's
transactions in a ``commit_many`` of their own (:mod:`rcq.spark.settle`).

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from rcq.client import Item, RcqClient, Transaction
from rcq.errors import RcqError
from rcq.spark.fragments import Fragments, fragments_with_items, reader_fragments, spread_of
from rcq.spark.options import RcqOptions
from rcq.spark.remote import call
from rcq.spark.schema import arrow_schema, items_to_batch
from rcq.spark.settle import Settler, label_prefix

log = logging.getLogger(__name__)


class ReadPartition(InputPartition):
    """One reader task: up to ``max_items`` of the queue under ``label``, dequeue keys ``<key_prefix>:<chunk>``.
    ``transaction_id``: a drain's driver-side transaction; None: find or begin one by label (in
    ``fragment``'s partition for a spread queue)."""

    def __init__(self, label: str, key_prefix: str, max_items: int, transaction_id: str | None = None,
                 replay: bool = False, fragment: str | None = None) -> None:
        super().__init__(label)
        self.label = label
        self.key_prefix = key_prefix
        self.max_items = max_items
        self.transaction_id = transaction_id
        self.replay = replay  # a batch replayed after a restart: reuse a transaction or read nothing
        self.fragment = fragment  # a spread queue: the partition whose fragment this task reads


async def _transaction_for(client: RcqClient, options: RcqOptions, partition: ReadPartition) -> Transaction | None:
    if partition.transaction_id is not None:
        return client.attach(partition.transaction_id)
    for described in await client.transactions(label_prefix=partition.label, complete=True):
        if described.get("label") == partition.label and described.get("state") == "open":
            return client.attach(described["transaction_id"], partition.label)
    if partition.replay:
        return None  # see the module docstring: a replay never reads fresh items
    if partition.fragment is not None:
        return await client.begin(options.transaction_timeout_s, partition.label, partition=partition.fragment)
    return await client.begin(options.transaction_timeout_s, partition.label)


async def take_items(client: RcqClient, options: RcqOptions, partition: ReadPartition) -> tuple[str, list[Item]]:
    """Dequeue up to ``max_items`` with replayable keys, ``requestsInFlight`` requests at a time, until
    a request comes back short; an empty own transaction is aborted. A replayed batch whose
    transaction is gone reads nothing (``""``, no items)."""
    transaction = await _transaction_for(client, options, partition)
    if transaction is None:
        log.warning("rcq source: %s is a replayed batch whose transaction is gone; it reads nothing "
                    "(its items are back in the queue)", partition.label)
        return "", []
    items: list[Item] = []
    chunk = 0
    while len(items) < partition.max_items:
        wants: list[int] = []
        left = partition.max_items - len(items)
        while left > 0 and len(wants) < options.requests_in_flight:
            wants.append(min(options.batch_size, left))
            left -= wants[-1]
        answers = await asyncio.gather(*(
            transaction.dequeue_items(options.queue, want, key=f"{partition.key_prefix}:{chunk + n}")
            for n, want in enumerate(wants)))
        chunk += len(wants)
        for got in answers:
            items.extend(got)
        if any(len(got) < want for got, want in zip(answers, wants, strict=True)):
            break
    if not items and partition.transaction_id is None:
        await transaction.abort_quietly()  # nothing to commit; a retry may begin afresh
    return transaction.transaction_id or "", items


def read_partition(options: RcqOptions, partition: ReadPartition) -> Iterator[pa.RecordBatch]:
    transaction_id, items = call(options, lambda client: take_items(client, options, partition),
                                 f"dequeuing for {partition.label}")
    schema = arrow_schema(options.value_type)
    extended_at = time.monotonic()
    for start in range(0, len(items), options.batch_size):
        # keepalive: a slow consumer of this iterator must not let the transaction expire
        if time.monotonic() - extended_at > options.transaction_timeout_s / 3:
            call(options, lambda client: client.attach(transaction_id).extend(options.transaction_timeout_s),
                 f"extending {partition.label}")
            extended_at = time.monotonic()
        yield items_to_batch(items[start:start + options.batch_size], schema)


def available_items(info: dict[str, Any]) -> int:
    """Items a dequeue could take now: ``ready`` (not locked, not delayed) where the server says so,
    else ``available`` (not locked), else ``count``."""
    for key in ("ready", "available", "count"):
        if info.get(key) is not None:
            return int(info[key])
    return 0


class RcqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """State lives in the driver-side runner process only and is rebuilt from rcq after a restart."""

    def __init__(self, options: RcqOptions, consumer_id: str) -> None:
        # No side effects here: Spark builds this object in several processes.
        self.options = options
        self.consumer_id = consumer_id
        self.budget_items: int | None = None  # availableNow: items left to read
        self.offered: set[int] = set()  # batches this reader announced; any other one is a replay
        self.fragments: Fragments = None  # a spread queue's partitions, from the first queue info
        self.fragments_known = False
        self.with_items: dict[int, frozenset[str]] = {}  # an offered batch -> the fragments that had items
        self._settler: Settler | None = None  # made by the first settle: only the driver-side runner settles

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_settler": None}

    @property
    def settler(self) -> Settler:
        if self._settler is None:
            self._settler = Settler(self.options, self.consumer_id)
        return self._settler

    def initialOffset(self) -> dict[str, int]:
        return {"batch": 0}

    def _count_committed(self) -> None:
        committed = self.settler.take_committed()
        if self.budget_items is not None:
            self.budget_items -= committed

    def _may_settle_later(self, done: int) -> bool:
        """A batch this run offered may be committed during the next one, but for availableNow only
        when the budget outlasts it even if every batch not yet counted read all it could."""
        if done not in self.offered:  # the first call, or a replayed batch: recover now
            return False
        if self.budget_items is None:
            return True
        uncounted = done - self.settler.counted_through
        # the budget was read with the queue's info (prepareForTriggerAvailableNow): its fragments are known
        tasks = len(reader_fragments(self.fragments, self.options.num_partitions))
        batch_items_max = tasks * self.options.max_items_per_partition
        return self.budget_items - uncounted * batch_items_max > 0

    def _queue_info(self) -> dict[str, Any]:
        async def ask(client: RcqClient) -> dict[str, Any]:
            await client.wait_for_leader(self.options.retry_timeout_s)  # only the leader knows what is locked
            return await client.queue_info(self.options.queue)

        info = call(self.options, ask, "asking the queue's depth")
        self.fragments, self.fragments_known = spread_of(info), True  # fixed: the first answer says it
        return info

    def task_fragments(self) -> list[str | None]:
        """The fragment of each task of a batch (None each: not spread); asks the placement once."""
        if not self.fragments_known:
            self._queue_info()
        return reader_fragments(self.fragments, self.options.num_partitions)

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything in the queue now, including what a dead run holds locked (recovered below).
        self.budget_items = int(self._queue_info()["count"])

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        done = int(start["batch"])
        settler = self.settler
        last_one_failed = not settler.wait()  # then settle now, where its error shows
        self._count_committed()
        if not last_one_failed and self._may_settle_later(done):
            settler.later(done, spare_through=done + 1)  # batch done+1's tasks begin while it runs
        else:
            settler.now(done)
        self._count_committed()
        if self.budget_items is not None and self.budget_items <= 0:
            return start
        info = self._queue_info()
        if available_items(info) <= 0:
            if not settler.wait():  # no next batch (the query ends or idles): commit before answering
                settler.now(done)
            self._count_committed()
            return start
        self.offered.add(done + 1)
        with_items = fragments_with_items(info, self.fragments, available_items)
        if with_items is not None:
            self.with_items = {b: f for b, f in self.with_items.items() if b > done - 2}
            self.with_items[done + 1] = with_items
        return {"batch": done + 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ReadPartition]:
        batch = int(end["batch"])
        if batch == int(start["batch"]):
            return []
        replay = batch not in self.offered  # from the offset log of an earlier run
        # an offered batch of a spread queue skips the fragments that had nothing; a replay has every task
        with_items = None if replay else self.with_items.get(batch)
        return [ReadPartition(f"{label_prefix(self.consumer_id)}{batch}:{i}", f"p{i}", self.options.max_items_per_partition,
                              replay=replay, fragment=fragment)
                for i, fragment in enumerate(self.task_fragments())
                if with_items is None or fragment in with_items]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ReadPartition)
        return read_partition(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        batch = int(end["batch"])
        if batch <= self.settler.settled_through:  # latestOffset settled it, or is settling it
            return
        try:
            self.settler.now(batch)
        except (RcqError, RuntimeError) as exc:  # latestOffset will try again
            log.warning("rcq source %s: commit(%s) failed: %s", self.consumer_id, end, exc)
            return
        self._count_committed()

    def stop(self) -> None:
        if self._settler is not None:
            self._settler.close()
