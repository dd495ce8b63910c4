"""Settling the streaming source's transactions: commit the batches Spark recorded, abort a dead run's.

The source's tasks leave their transactions open, labelled
``rcq-source:<consumerId>:<batch>:<partition>``; :func:`settle` lists a consumer's open
transactions, commits those of batches <= the one Spark recorded as done in one
``commit_many``, and aborts those of later batches it is told to (a dead run's leftovers).

:class:`Settler` runs settles one at a time for the driver-side reader, either now or in the
background: a micro-batch's commit (a few hundred milliseconds for 20,000 items on a small
machine) then overlaps the next micro-batch's reads instead of delaying them. Whether a settle
runs now or later changes nothing about what it commits: only batches Spark recorded as done
(see :mod:`rcq.spark.stream_reader`). A background settle that fails is logged and repeated by
the next one, which lists the open transactions again.

**A spread queue**: a batch's transactions live in its fragments' partitions (one each), and one
``commit_many`` covers one partition, so a settle commits each partition's share in a
``commit_many`` of its own, all at once. Each is atomic; between them a reader of the queue may
see a batch's items in one fragment settled (gone for good) while those in another are still
locked (invisible to other consumers, counted in ``locked``). A settle that fails in one
partition after another committed leaves that partition's transactions open; the next settle
lists them and commits them (their items come back to be read again only if their transaction
expires or is aborted, as on a queue that is not spread).

Must not import: pyspark, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from rcq.client import RcqClient
from rcq.errors import RcqError, TransactionClosed
from rcq.spark.fragments import by_partition
from rcq.spark.options import RcqOptions
from rcq.spark.remote import call

log = logging.getLogger(__name__)


def label_prefix(consumer_id: str) -> str:
    """Labels of a consumer's transactions: ``rcq-source:<consumerId>:<batch>:<partition>``."""
    return f"rcq-source:{consumer_id}:"


def _batch_of(label: str | None, prefix: str) -> int | None:
    if not label or not label.startswith(prefix):
        return None
    head = label[len(prefix):].split(":", 1)[0]
    return int(head) if head.isdigit() else None


async def settle(client: RcqClient, consumer_id: str, done_batch: int, spare_through: int | None = None) -> int:
    """Commit open transactions of batches <= ``done_batch``, abort those of batches after
    ``spare_through`` (default ``done_batch``: every later one); returns items committed."""
    prefix = label_prefix(consumer_id)
    last_spared = done_batch if spare_through is None else max(done_batch, spare_through)
    to_commit: list[str] = []
    to_abort: list[str] = []
    for described in await client.transactions(label_prefix=prefix, complete=True):
        batch = _batch_of(described.get("label"), prefix)
        if batch is None or described.get("state") != "open":
            continue
        if batch <= done_batch:
            to_commit.append(described["transaction_id"])
        elif batch > last_spared:
            to_abort.append(described["transaction_id"])
    for transaction_id in to_abort:
        await client.attach(transaction_id).abort_quietly()
    if not to_commit:
        return 0
    groups = by_partition(to_commit)  # one group unless the queue is spread
    answers = await asyncio.gather(*(_commit(client, consumer_id, done_batch, group) for group in groups.values()),
                                   return_exceptions=True)
    committed = 0
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer  # the partitions that committed stay committed; the next settle commits the rest
        committed += answer
    return committed


async def _commit(client: RcqClient, consumer_id: str, done_batch: int, to_commit: list[str]) -> int:
    """Commit the transactions of one partition; items committed."""
    try:
        return (await client.commit_many(to_commit)).dequeued
    except TransactionClosed as exc:  # one expired or was aborted: commit the others one by one
        log.warning("rcq source %s: commit of batch <= %d: %s; committing one by one", consumer_id, done_batch, exc)
    committed = 0
    for transaction_id in to_commit:
        try:
            committed += (await client.attach(transaction_id).commit()).dequeued
        except TransactionClosed as exc:  # its items went back to the queue: they will be read again
            log.warning("rcq source %s: %s was closed (%s); its items will be read again",
                        consumer_id, transaction_id, exc.code)
    return committed


class Settler:
    """One consumer's settles, one at a time, on a thread of its own when run in the background.

    ``settled_through``: the highest done batch handed to a settle (finished or running);
    ``counted_through``: the highest whose settle finished, its items in :meth:`take_committed`.
    """

    def __init__(self, options: RcqOptions, consumer_id: str) -> None:
        self.options = options
        self.consumer_id = consumer_id
        self.settled_through = -1
        self.counted_through = -1
        self._committed = 0  # items committed by finished settles, not yet taken
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._running: concurrent.futures.Future[int] | None = None
        self._running_batch = -1

    def _run(self, done_batch: int, spare_through: int | None) -> int:
        return call(self.options, lambda client: settle(client, self.consumer_id, done_batch, spare_through),
                    f"committing consumer {self.consumer_id}'s batches up to {done_batch}")

    def wait(self) -> bool:
        """Wait for the background settle, if any; False if it failed (logged; the next settle repeats it)."""
        running, self._running = self._running, None
        if running is None:
            return True
        try:
            self._committed += running.result()
        except (RcqError, RuntimeError, OSError) as exc:
            log.warning("rcq source %s: committing batches up to %d failed (%s); the next settle repeats it",
                        self.consumer_id, self._running_batch, exc)
            return False
        self.counted_through = max(self.counted_through, self._running_batch)
        return True

    def poll(self) -> None:
        """Count the background settle if it has finished; never waits."""
        if self._running is not None and self._running.done():
            self.wait()

    def now(self, done_batch: int) -> None:
        """Settle up to ``done_batch`` before returning, aborting every later batch; raises its errors."""
        self.wait()
        self.settled_through = max(self.settled_through, done_batch)
        self._committed += self._run(done_batch, None)
        self.counted_through = max(self.counted_through, done_batch)

    def later(self, done_batch: int, spare_through: int) -> None:
        """Start settling up to ``done_batch`` in the background, sparing batches up to ``spare_through``
        (those this run is reading); waits for the previous background settle first."""
        if not self.wait():
            self.now(done_batch)  # a failing settle fails where Spark sees it, as a synchronous one would
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"rcq-settle-{self.consumer_id}")
        self.settled_through = max(self.settled_through, done_batch)
        self._running_batch = done_batch
        self._running = self._pool.submit(self._run, done_batch, spare_through)

    def take_committed(self) -> int:
        """Items committed by the settles counted so far, since the last call."""
        committed, self._committed = self._committed, 0
        return committed

    def close(self) -> None:
        """Let a background settle finish (best effort: the next run's first settle repeats it)."""
        self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
