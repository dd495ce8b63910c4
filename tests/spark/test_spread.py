"""The Spark connector on a spread queue (docs/partitions.md, "Spread queues"; docs/spark.md): the
sinks write each task into one fragment and every row once, committing per partition; the drain
and the streaming source read every fragment and every item once, settling per partition; a
retried task, a replayed micro-batch and a driver dying between two partitions' commits add
nothing twice and lose nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import rcq.spark
from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.names import transaction_partition
from rcq.spark.fragments import fragments_with_items, reader_fragments, shares, writer_fragment
from rcq.spark.options import parse_options
from rcq.spark.settle import Settler
from tests.helpers import SPARK_QUERY_TIMEOUT_S
from tests.spark.helpers import duplicates, open_transactions, queue_info, take_all, unique_queue

pytestmark = pytest.mark.spark

SPREAD = ["p0", "p1", "p2"]


@pytest.fixture
def spread(healthy_rcq_cluster: LocalCluster) -> Any:
    """A new queue spread over p0, p1 and p2 (the partitions made once per run), by its name."""
    healthy_rcq_cluster.ensure_partitions(len(SPREAD))

    def place(prefix: str) -> str:
        queue = unique_queue(prefix)
        answer = healthy_rcq_cluster.poll_json(healthy_rcq_cluster.url(0) + f"/v1/queues/{queue}", method="PUT",
                                               body={"partitions": SPREAD})
        assert answer["settings"]["partitions"] == SPREAD, answer
        return queue

    return place


def _by_partition(urls: str, token: str, queue: str, key: str = "count") -> dict[str, int]:
    info = queue_info(urls, token, queue)
    assert info.get("spread") and "unanswered" not in info, info
    return {p: int(row[key]) for p, row in info["by_partition"].items()}


def _enqueue_in(urls: str, token: str, queue: str, counts: dict[str, int]) -> list[str]:
    """``counts[p]`` items committed into fragment ``p``: the values ``<p>-<i>``."""
    async def work(client: RcqClient) -> None:
        for partition, count in counts.items():
            if not count:
                continue
            async with await client.begin(30, partition=partition) as transaction:
                for start in range(0, count, 1000):
                    await transaction.enqueue_batch(queue, [f"{partition}-{i}" for i in range(start, min(count, start + 1000))])

    asyncio.run(_with_client(urls, token, work))
    return [f"{p}-{i}" for p, count in counts.items() for i in range(count)]


async def _with_client(urls: str, token: str, work: Any) -> Any:
    async with RcqClient(urls.split(","), retry_timeout_s=30.0, token=token) as client:
        return await work(client)


def _finish(query: Any) -> None:
    try:
        assert query.awaitTermination(SPARK_QUERY_TIMEOUT_S), f"the query did not finish within {SPARK_QUERY_TIMEOUT_S} s"
        assert query.exception() is None
    finally:
        query.stop()


def _write(spark: Any, urls: str, token: str, queue: str, rows: int, tasks: int, fmt: str = "rcq", **options: str) -> None:
    df = spark.range(0, rows, 1, tasks).selectExpr("cast(id as string) AS value")
    df.write.format(fmt).mode("append").option("url", urls).option("token", token).option("queue", queue) \
        .options(**options).save()


def test_the_sink_writes_each_task_into_one_fragment_and_the_drain_reads_every_row_once(
        spark: Any, urls: str, token: str, spread: Any) -> None:
    queue = spread("sink-spread")
    _write(spark, urls, token, queue, 6_000, 6, batchSize="300")  # tasks 0..5: fragments p0 p1 p2 p0 p1 p2
    assert _by_partition(urls, token, queue) == {"p0": 2_000, "p1": 2_000, "p2": 2_000}
    with rcq.spark.drain(spark, urls, queue, max_items=6_000, token=token, valueType="string",
                         numPartitions=4) as df:  # 2 tasks per fragment
        values = [int(row.value) for row in df.select("value").collect()]
        assert len(df.select("value").collect()) == 6_000  # evaluated again: the same items (dequeue keys)
    assert duplicates(values) == {} and sorted(values) == list(range(6_000))
    assert _by_partition(urls, token, queue) == {"p0": 0, "p1": 0, "p2": 0}
    assert _by_partition(urls, token, queue, "locked") == {"p0": 0, "p1": 0, "p2": 0}


def test_a_retried_writer_task_adds_nothing_twice_to_a_spread_queue(spark: Any, urls: str, token: str, spread: Any) -> None:
    queue = spread("sink-spread-retry")
    _write(spark, urls, token, queue, 3_000, 3, fmt="rcq_faulty", failPartition="1", failAttempts="2")
    assert _by_partition(urls, token, queue) == {"p0": 1_000, "p1": 1_000, "p2": 1_000}
    values = [int(v) for v in take_all(urls, token, queue)]
    assert duplicates(values) == {} and sorted(values) == list(range(3_000))


def test_a_drain_of_an_uneven_spread_queue_reads_every_item_and_aborts_on_failure(
        spark: Any, urls: str, token: str, spread: Any) -> None:
    queue = spread("drain-uneven")
    expected = _enqueue_in(urls, token, queue, {"p0": 10, "p1": 400, "p2": 0})
    with pytest.raises(RuntimeError, match="the job failed"):
        with rcq.spark.drain(spark, urls, queue, max_items=410, token=token, valueType="string") as df:
            assert df.count() == 410
            raise RuntimeError("the job failed")
    assert _by_partition(urls, token, queue) == {"p0": 10, "p1": 400, "p2": 0}  # all back
    assert _by_partition(urls, token, queue, "locked") == {"p0": 0, "p1": 0, "p2": 0}
    with rcq.spark.drain(spark, urls, queue, max_items=410, token=token, valueType="string") as df:
        values = [row.value for row in df.select("value").collect()]
    assert duplicates(values) == {} and sorted(values) == sorted(expected)
    assert queue_info(urls, token, queue)["count"] == 0


def _stream_to_parquet(spark: Any, urls: str, token: str, queue: str, consumer: str, out: Path, checkpoint: Path,
                       fmt: str = "rcq", **options: str) -> Any:
    stream = (spark.readStream.format(fmt).option("url", urls).option("token", token).option("queue", queue)
              .option("consumerId", consumer).option("valueType", "string").options(**options).load())
    return (stream.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


@pytest.mark.parametrize("fmt", ["rcq", "rcq_faulty"])
def test_the_streaming_source_reads_every_fragment_and_every_item_once(
        spark: Any, urls: str, token: str, spread: Any, tmp_path: Path, fmt: str) -> None:
    """rcq_faulty: task 1 of batch 1 fails after its first rows, and its retry reads the same items."""
    queue, consumer = spread("src-spread"), unique_queue("consumer")
    expected = _enqueue_in(urls, token, queue, {"p0": 700, "p1": 300, "p2": 500})
    faults = {"failPartition": "1", "failBatch": "1", "failAttempts": "1"} if fmt == "rcq_faulty" else {}
    _finish(_stream_to_parquet(spark, urls, token, queue, consumer, tmp_path / "out", tmp_path / "checkpoint", fmt,
                               maxItemsPerPartition="200", batchSize="70", **faults))
    values = [row.value for row in spark.read.parquet(str(tmp_path / "out")).select("value").collect()]
    assert duplicates(values) == {} and sorted(values) == sorted(expected)
    assert _by_partition(urls, token, queue) == {"p0": 0, "p1": 0, "p2": 0}
    assert _by_partition(urls, token, queue, "locked") == {"p0": 0, "p1": 0, "p2": 0}
    assert open_transactions(urls, token, f"rcq-source:{consumer}:") == []


def test_a_settle_commits_each_partitions_transactions_of_a_batch(urls: str, token: str, spread: Any) -> None:
    """One commit_many covers one partition: a batch read in three fragments is settled in three."""
    queue, consumer = spread("settle-spread"), unique_queue("consumer")
    _enqueue_in(urls, token, queue, {"p0": 2, "p1": 3, "p2": 4})

    async def read_batch_1(client: RcqClient) -> list[str]:
        ids = []
        for i, partition in enumerate(SPREAD):
            transaction = await client.begin(60, f"rcq-source:{consumer}:1:{i}", partition=partition)
            assert len(await transaction.dequeue_batch(queue, 10)) == 2 + i
            ids.append(transaction.opened_id)
        return ids

    ids = asyncio.run(_with_client(urls, token, read_batch_1))
    assert [transaction_partition(i) for i in ids] == SPREAD
    settler = Settler(parse_options({"url": urls, "queue": queue, "token": token}), consumer)
    try:
        settler.now(1)
        assert settler.take_committed() == 9
    finally:
        settler.close()
    assert open_transactions(urls, token, f"rcq-source:{consumer}:") == []
    assert queue_info(urls, token, queue)["count"] == 0


def _json_batches(source: Path, batches: int, rows: int) -> None:
    source.mkdir()
    for number in range(batches):
        lines = [json.dumps({"n": number * rows + i}) for i in range(rows)]
        (source / f"part-{number}.json").write_text("\n".join(lines) + "\n")


def _stream_into(spark: Any, urls: str, token: str, queue: str, source: Path, checkpoint: Path, fmt: str = "rcq",
                 **options: str) -> Any:
    stream = spark.readStream.format("json").schema("n BIGINT").option("maxFilesPerTrigger", 1).load(str(source))
    # three tasks a micro-batch, each row in the same task however often the batch runs (hash of n)
    return (stream.repartition(3, "n").selectExpr("cast(n as string) AS value").writeStream.format(fmt)
            .option("url", urls).option("token", token).option("queue", queue)
            .option("checkpointLocation", str(checkpoint)).options(**options).trigger(availableNow=True).start())


def test_a_stream_sink_batch_replayed_after_a_driver_died_between_two_partitions_commits_adds_every_row_once(
        spark: Any, urls: str, token: str, spread: Any, tmp_path: Path) -> None:
    """Batch 1's commit commits p0's transactions alone, then the driver 'dies': the restarted query
    replays batch 1, whose commit finds p0's key already used (its rows dropped) and commits p1's
    and p2's. Then batch 2's commit file removed, the query re-run: the whole replay adds nothing."""
    queue = spread("sink-spread-replay")
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    _json_batches(source, 3, 100)
    query = _stream_into(spark, urls, token, queue, source, checkpoint, "rcq_faulty", failCommitOfBatch="1")
    with pytest.raises(Exception, match="injected driver failure after committing partition p0 of batch 1"):
        query.awaitTermination(SPARK_QUERY_TIMEOUT_S)
    query.stop()
    after_crash = _by_partition(urls, token, queue)
    assert after_crash["p0"] > 0 and sum(after_crash.values()) < 200, after_crash  # batch 0, and batch 1's p0 share
    _finish(_stream_into(spark, urls, token, queue, source, checkpoint))
    counts = _by_partition(urls, token, queue)
    assert all(counts[p] > 0 for p in SPREAD) and sum(counts.values()) == 300, counts
    (checkpoint / "commits" / "2").unlink()  # forget batch 2's commit: Spark replays it
    for crc in (checkpoint / "commits").glob(".2.crc"):
        crc.unlink()
    _finish(_stream_into(spark, urls, token, queue, source, checkpoint))
    assert _by_partition(urls, token, queue) == counts
    values = [int(v) for v in take_all(urls, token, queue)]
    assert duplicates(values) == {} and sorted(values) == list(range(300))


def test_tasks_are_spread_over_the_fragments_and_a_drain_shares_its_items_by_what_each_holds() -> None:
    fragments = ("p0", "p1", "p2")
    assert [writer_fragment(fragments, i) for i in range(5)] == ["p0", "p1", "p2", "p0", "p1"]
    assert writer_fragment(None, 7) is None
    assert reader_fragments(None, 2) == [None, None]  # a plain queue: numPartitions tasks, as before
    assert reader_fragments(fragments, 2) == ["p0", "p1", "p2"]  # rounded up to a multiple
    assert reader_fragments(fragments, 4) == ["p0", "p1", "p2"] * 2
    assert shares(410, [10, 400, 0]) == [10, 400, 0]
    assert shares(100, [10, 400, 0]) == [10, 90, 0]
    assert shares(30, [100, 100, 100]) == [10, 10, 10]
    assert shares(20, [0, 0, 0]) == [7, 7, 6]  # nothing held: evenly
    assert sum(shares(1000, [5, 17, 3])) == 1000
    info = {"by_partition": {"p0": {"ready": 0}, "p1": {"ready": 3}}}  # p2 did not answer: read it anyway
    assert fragments_with_items(info, fragments, lambda row: row["ready"]) == {"p1", "p2"}
