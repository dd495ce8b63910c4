"""One-off batch reads: drain up to N items, committed only when the job succeeds.

::

    with rcq.spark.drain(spark, url, "events", max_items=10_000) as df:
        df.write.parquet("out/")          # commits on a clean exit, aborts on an exception

The driver begins one transaction (kept alive while the block runs) and hands
its id to ``spark.read.format("rcq")``. Each reader task dequeues with the keys
``p<i>:<chunk>``, so the DataFrame reads the same items however many times
Spark evaluates it (a retried task, a ``count()`` then a ``write``): what was
read is committed once, at the end. A failed job aborts: every item goes back
to the head of the queue.

**A spread queue** (:mod:`rcq.spark.fragments`): a transaction lives in one partition, so the
driver begins one in each fragment, and shares ``max_items`` over them by what each fragment held
when the drain began (each at most what it holds, the rest shared evenly), so a drain of every
item of an uneven queue reads them all. Each fragment's share is read by ``ceil(numPartitions /
fragments)`` tasks. On a clean exit each transaction is committed (all at once): each commit is
atomic, the drain as a whole is not. A reader may see one fragment's items gone while another's
are still locked, and a failed commit in one fragment puts its items back in the queue (read again
later: none is lost). The error says which fragments committed.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from rcq.client import RcqClient
from rcq.errors import QueueNotFound, RcqError
from rcq.names import transaction_partition
from rcq.spark.fragments import shares, spread_of
from rcq.spark.options import RcqOptionError, RcqOptions, parse_options
from rcq.spark.remote import RcqSparkError, call
from rcq.spark.stream_reader import ReadPartition, available_items, read_partition

log = logging.getLogger(__name__)


class RcqDrainReader(DataSourceReader):
    def __init__(self, options: RcqOptions) -> None:
        if options.transaction_id is None:
            raise RcqOptionError("spark.read.format('rcq') reads inside a transaction that commits when your job "
                                 "succeeds: use `with rcq.spark.drain(spark, url, queue, max_items) as df:` "
                                 "(or spark.readStream for a stream)")
        self.options = options

    def partitions(self) -> list[ReadPartition]:
        total = self.options.max_items or self.options.max_items_per_partition * self.options.num_partitions
        if self.options.drain_shares is None:  # one transaction: numPartitions tasks share the items
            count = self.options.num_partitions
            return [ReadPartition(f"rcq-drain:{self.options.transaction_id}:{i}", f"p{i}", share,
                                  self.options.transaction_id) for i, share in enumerate(_even(total, count)) if share > 0]
        assert self.options.transaction_id is not None
        ids = self.options.transaction_id.split(",")
        per_fragment = math.ceil(self.options.num_partitions / len(ids))
        planned: list[ReadPartition] = []
        for transaction_id, fragment_share in zip(ids, self.options.drain_shares, strict=True):
            for share in _even(fragment_share, per_fragment):
                i = len(planned)  # keys and labels numbered over the whole drain, as the tasks' order is fixed
                planned.append(ReadPartition(f"rcq-drain:{transaction_id}:{i}", f"p{i}", share, transaction_id))
        return [partition for partition in planned if partition.max_items > 0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ReadPartition)
        return read_partition(self.options, partition)


def _even(total: int, count: int) -> list[int]:
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


@contextlib.contextmanager
def drain(spark: Any, url: str, queue: str, max_items: int, **options: Any) -> Iterator[Any]:
    """A DataFrame of up to ``max_items`` items of ``queue``; committed on a clean exit, aborted otherwise.
    ``options``: more rcq options (numPartitions, valueType, transactionTimeoutSeconds, tokenFile, caFile, ...)."""
    raw = {"url": url, "queue": queue, "maxItems": str(max_items), **{k: str(v) for k, v in options.items()}}
    parsed = parse_options(raw)
    ids, fragment_shares = call(parsed, lambda client: _begin(client, parsed, max_items), "beginning a drain")
    plan = {"transactionId": ",".join(ids)}
    if fragment_shares is not None:
        plan["drainShares"] = ",".join(map(str, fragment_shares))
    stop = threading.Event()
    keepalive = threading.Thread(target=_keep_alive, args=(parsed, ids, stop), daemon=True,
                                 name=f"rcq-drain-keepalive-{ids[0]}")
    keepalive.start()
    try:
        yield spark.read.format("rcq").options(**raw, **plan).load()
    except BaseException:
        stop.set()
        call(parsed, lambda client: _abort(client, ids), "aborting a drain")
        raise
    finally:
        stop.set()
        keepalive.join(parsed.request_timeout_s + parsed.retry_timeout_s)
    _commit(parsed, ids)


async def _begin(client: RcqClient, options: RcqOptions, max_items: int) -> tuple[list[str], list[int] | None]:
    """The drain's transactions: one (in the queue's partition), or one per fragment of a spread queue
    with each one's share of ``max_items`` (None: one transaction, no shares)."""
    try:
        info = await client.queue_info(options.queue)
    except QueueNotFound:
        info = {}
    fragments = spread_of(info)
    if fragments is None:  # in the queue's one partition (opened now: its id goes to the tasks)
        placed = [str(p) for p in (info.get("settings") or {}).get("partitions") or []]
        begun = await client.begin(options.transaction_timeout_s, "rcq-drain", partition=placed[0] if placed else None)
        return [await begun.open()], None
    rows = info.get("by_partition") or {}
    held = [available_items(rows.get(p) or {}) for p in fragments]
    ids: list[str] = []
    try:
        for fragment in fragments:
            begun = await client.begin(options.transaction_timeout_s, "rcq-drain", partition=fragment)
            ids.append(begun.opened_id)
    except BaseException:
        await _abort(client, ids)
        raise
    return ids, shares(max_items, held)


async def _abort(client: RcqClient, ids: list[str]) -> None:
    for transaction_id in ids:
        await client.attach(transaction_id).abort_quietly()


def _commit(options: RcqOptions, ids: list[str]) -> None:
    """Commit the drain's transactions, all at once; a failure names the fragments that committed."""

    async def commit(client: RcqClient) -> list[Any]:
        return list(await asyncio.gather(*(client.attach(t).commit() for t in ids), return_exceptions=True))

    answers = call(options, commit, f"committing drain {','.join(ids)}")
    failed = [(t, a) for t, a in zip(ids, answers, strict=True) if isinstance(a, BaseException)]
    if not failed:
        return
    transaction_id, error = failed[0]
    if len(ids) == 1 or not isinstance(error, RcqError):
        if isinstance(error, RcqError):
            raise RcqSparkError(f"rcq {error.code}: committing drain {transaction_id} (queue {options.queue!r}, "
                                f"urls {','.join(options.urls)}): {error.message}") from error
        raise error
    committed = [transaction_partition(t) for t, a in zip(ids, answers, strict=True) if not isinstance(a, BaseException)]
    kept = f"fragments {', '.join(committed)} committed" if committed else "no fragment committed"
    raise RcqSparkError(f"rcq {error.code}: committing drain {transaction_id} in fragment "
                        f"{transaction_partition(transaction_id)} (queue {options.queue!r}, urls {','.join(options.urls)}): "
                        f"{error.message}; {kept}; the items of the others are back in the queue") from error


def _keep_alive(options: RcqOptions, ids: list[str], stop: threading.Event) -> None:
    while not stop.wait(options.transaction_timeout_s / 3):
        for transaction_id in ids:
            try:
                _extend(options, transaction_id)
            except RuntimeError as exc:  # the commit will say what happened
                log.warning("rcq drain: keepalive of %s failed: %s", transaction_id, exc)


def _extend(options: RcqOptions, transaction_id: str) -> None:
    call(options, lambda client: client.attach(transaction_id).extend(options.transaction_timeout_s),
         f"extending drain {transaction_id}")
