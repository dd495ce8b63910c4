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

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from rcq.spark.options import RcqOptionError, RcqOptions, parse_options
from rcq.spark.remote import call
from rcq.spark.stream_reader import ReadPartition, read_partition

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
        count = self.options.num_partitions
        shares = [total // count + (1 if i < total % count else 0) for i in range(count)]
        return [ReadPartition(f"rcq-drain:{self.options.transaction_id}:{i}", f"p{i}", share,
                              self.options.transaction_id) for i, share in enumerate(shares) if share > 0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ReadPartition)
        return read_partition(self.options, partition)


@contextlib.contextmanager
def drain(spark: Any, url: str, queue: str, max_items: int, **options: Any) -> Iterator[Any]:
    """A DataFrame of up to ``max_items`` items of ``queue``; committed on a clean exit, aborted otherwise.
    ``options``: more rcq options (numPartitions, valueType, transactionTimeoutSeconds, tokenFile, caFile, ...)."""
    raw = {"url": url, "queue": queue, "maxItems": str(max_items), **{k: str(v) for k, v in options.items()}}
    parsed = parse_options(raw)
    transaction_id = call(parsed, lambda client: _begin(client, parsed), "beginning a drain")
    stop = threading.Event()
    keepalive = threading.Thread(target=_keep_alive, args=(parsed, transaction_id, stop), daemon=True,
                                 name=f"rcq-drain-keepalive-{transaction_id}")
    keepalive.start()
    try:
        yield spark.read.format("rcq").options(**raw, transactionId=transaction_id).load()
    except BaseException:
        stop.set()
        call(parsed, lambda client: client.attach(transaction_id).abort_quietly(), "aborting a drain")
        raise
    finally:
        stop.set()
        keepalive.join(parsed.request_timeout_s + parsed.retry_timeout_s)
    call(parsed, lambda client: client.attach(transaction_id).commit(), f"committing drain {transaction_id}")


async def _begin(client: Any, options: RcqOptions) -> str:
    return (await client.begin(options.transaction_timeout_s, "rcq-drain")).transaction_id


def _keep_alive(options: RcqOptions, transaction_id: str, stop: threading.Event) -> None:
    while not stop.wait(options.transaction_timeout_s / 3):
        try:
            call(options, lambda client: client.attach(transaction_id).extend(options.transaction_timeout_s),
                 f"extending drain {transaction_id}")
        except RuntimeError as exc:  # the commit will say what happened
            log.warning("rcq drain: keepalive of %s failed: %s", transaction_id, exc)
