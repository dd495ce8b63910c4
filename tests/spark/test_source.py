"""The rcq streaming source and drain: at least once, nothing lost under task failures, restarts and failover."""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from tests.helpers import LEADER_TIMEOUT_S, SPARK_QUERY_TIMEOUT_S
from tests.spark.helpers import (
    abort_open_transactions,
    duplicates,
    enqueue_values,
    open_transactions,
    queue_info,
    take_all,
    take_some,
    unique_queue,
)

pytestmark = pytest.mark.spark


def _stream(spark: Any, urls: str, token: str, queue: str, consumer: str, fmt: str = "rcq",
            **options: str) -> Any:
    return (spark.readStream.format(fmt).option("url", urls).option("token", token).option("queue", queue)
            .option("consumerId", consumer).options(**options).load())


def _to_parquet(stream: Any, out: Path, checkpoint: Path) -> Any:
    return (stream.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def _finish(query: Any) -> None:
    try:
        assert query.awaitTermination(SPARK_QUERY_TIMEOUT_S), f"the query did not finish within {SPARK_QUERY_TIMEOUT_S} s"
    finally:
        query.stop()


def _read_values(spark: Any, out: Path) -> list[int]:
    return [int(row.value) for row in spark.read.parquet(str(out)).select("value").collect()]


def _assert_drained(urls: str, token: str, queue: str, consumer: str) -> None:
    info = queue_info(urls, token, queue)
    assert (info["count"], info["locked"]) == (0, 0), info
    assert open_transactions(urls, token, f"rcq-source:{consumer}:") == []


def test_available_now_reads_every_item_exactly_once(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    queue, consumer = unique_queue("src"), unique_queue("consumer")
    enqueue_values(urls, token, queue, [str(i) for i in range(1000)])
    stream = _stream(spark, urls, token, queue, consumer, valueType="string", maxItemsPerPartition="200", batchSize="70")
    assert stream.schema.simpleString() == ("struct<queue:string,item_id:bigint,value:string,delivery_count:int,priority:int,"
                                            "enqueued_at:timestamp,dead_letter_reason:string,dead_letter_source:string,"
                                            "expires_at:timestamp,headers:map<string,string>>")
    _finish(_to_parquet(stream, tmp_path / "out", tmp_path / "checkpoint"))
    values = _read_values(spark, tmp_path / "out")
    assert duplicates(values) == {}
    assert sorted(values) == list(range(1000))
    batches = [p.name for p in (tmp_path / "checkpoint" / "commits").iterdir() if p.name.isdigit()]
    assert len(batches) == 3  # 400 + 400 + 200
    _assert_drained(urls, token, queue, consumer)


def test_task_failure_during_a_read_loses_nothing(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    queue, consumer = unique_queue("src-retry"), unique_queue("consumer")
    enqueue_values(urls, token, queue, [str(i) for i in range(1000)])
    stream = _stream(spark, urls, token, queue, consumer, fmt="rcq_faulty", valueType="string", maxItemsPerPartition="200",
                     batchSize="50", failPartition="1", failBatch="1", failAttempts="1")
    _finish(_to_parquet(stream, tmp_path / "out", tmp_path / "checkpoint"))
    values = _read_values(spark, tmp_path / "out")
    assert sorted(set(values)) == list(range(1000))
    assert duplicates(values) == {}  # the retry read the same items again (dequeue keys)
    _assert_drained(urls, token, queue, consumer)


def test_query_killed_mid_batch_and_restarted_from_its_checkpoint_loses_nothing(
        spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    queue, consumer = unique_queue("src-restart"), unique_queue("consumer")
    enqueue_values(urls, token, queue, [str(i) for i in range(1000)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    seen: list[int] = []

    def die_in_batch_1(df: Any, batch_id: int) -> None:
        rows = [int(r.value) for r in df.select("value").collect()]  # the items are dequeued...
        if batch_id == 1:
            raise RuntimeError("query killed in the middle of batch 1")  # ...but never recorded
        seen.extend(rows)
        df.write.mode("append").parquet(str(out))

    def run(handler: Any) -> Any:
        stream = _stream(spark, urls, token, queue, consumer, valueType="string", maxItemsPerPartition="150")
        return (stream.writeStream.foreachBatch(handler).option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True).start())

    query = run(die_in_batch_1)
    with pytest.raises(Exception, match="killed in the middle of batch 1"):
        query.awaitTermination(SPARK_QUERY_TIMEOUT_S)
    query.stop()
    assert queue_info(urls, token, queue)["locked"] > 0  # the dead run's transactions are still open
    _finish(run(lambda df, batch_id: df.write.mode("append").parquet(str(out))))
    values = _read_values(spark, out)
    assert sorted(set(values)) == list(range(1000))
    dup = duplicates(values)
    print(f"restart: {len(values)} rows, {len(dup)} duplicated")
    assert dup == {}  # the replayed batch reused the dead run's transactions and keys
    _assert_drained(urls, token, queue, consumer)


def test_a_replayed_batch_whose_transactions_are_gone_reads_nothing_rather_than_lose_items(
        spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    """The sink wrote batch 0, the query died before Spark recorded it, and its source transactions
    vanished (a failover aborted them; another consumer took the returned items). On restart
    Spark replays batch 0: the exactly-once sink drops it as written already, so a replay that
    read fresh items would lose them once the source commits. It must read nothing."""
    queue, consumer = unique_queue("src-replay-gone"), unique_queue("consumer")
    enqueue_values(urls, token, queue, [str(i) for i in range(600)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()

    def exactly_once_sink(crash_after_batch_0: bool) -> Any:
        def handler(df: Any, batch_id: int) -> None:
            # Like the rcq sink: the tasks run, and the commit drops a batch written already.
            staging = tmp_path / "staging" / f"{batch_id}-{uuid.uuid4().hex}"
            df.select("value").write.parquet(str(staging))
            target = out / f"batch={batch_id}"
            if target.exists():
                shutil.rmtree(staging)
            else:
                staging.rename(target)
            if crash_after_batch_0 and batch_id == 0:
                raise RuntimeError("driver died after the sink wrote batch 0")
        return handler

    def run(handler: Any) -> Any:
        stream = _stream(spark, urls, token, queue, consumer, valueType="string", maxItemsPerPartition="150")
        return (stream.writeStream.foreachBatch(handler).option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True).start())

    query = run(exactly_once_sink(crash_after_batch_0=True))
    with pytest.raises(Exception, match="driver died after the sink wrote batch 0"):
        query.awaitTermination(SPARK_QUERY_TIMEOUT_S)
    query.stop()
    abort_open_transactions(urls, token, f"rcq-source:{consumer}:")  # what a failover does
    elsewhere = [int(v) for v in take_some(urls, token, queue, 300)]  # the returned items, elsewhere
    enqueue_values(urls, token, queue, [str(i) for i in range(600, 900)])
    _finish(run(exactly_once_sink(crash_after_batch_0=False)))
    written = [int(row.value) for row in spark.read.parquet(str(out)).select("value").collect()]
    missing = set(range(900)) - set(written) - set(elsewhere)
    assert not missing, f"{len(missing)} items lost, e.g. {sorted(missing)[:5]}"
    _assert_drained(urls, token, queue, consumer)


def test_leader_failover_during_a_streaming_read_loses_nothing(
        spark: Any, urls: str, token: str, healthy_rcq_cluster: LocalCluster, tmp_path: Path) -> None:
    queue, consumer = unique_queue("src-failover"), unique_queue("consumer")
    total = 3000
    enqueue_values(urls, token, queue, [str(i) for i in range(total)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    batches_done = threading.Semaphore(0)

    def write(df: Any, batch_id: int) -> None:
        df.write.mode("append").parquet(str(out))
        batches_done.release()

    stream = _stream(spark, urls, token, queue, consumer, valueType="string", maxItemsPerPartition="100",
                     retryTimeoutSeconds="60")
    query = (stream.writeStream.foreachBatch(write).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        for _ in range(2):
            assert batches_done.acquire(timeout=SPARK_QUERY_TIMEOUT_S), "no micro-batch finished"
        leader = healthy_rcq_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        healthy_rcq_cluster.kill_node(leader)
        assert query.awaitTermination(SPARK_QUERY_TIMEOUT_S), "the query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    healthy_rcq_cluster.heal()
    healthy_rcq_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    values = _read_values(spark, out)
    left = [int(v) for v in take_all(urls, token, queue)]
    missing = set(range(total)) - set(values) - set(left)
    print(f"failover: {len(values)} rows, {len(duplicates(values))} duplicated, {len(left)} left in the queue")
    assert missing == set()


def test_drain_commits_only_when_the_job_succeeds(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    import rcq.spark

    queue = unique_queue("drain")
    enqueue_values(urls, token, queue, [str(i) for i in range(500)])
    with pytest.raises(RuntimeError, match="job failed"), rcq.spark.drain(spark, urls, queue, 300, token=token) as df:
        assert df.count() == 300
        raise RuntimeError("job failed")
    assert queue_info(urls, token, queue)["count"] == 500
    assert queue_info(urls, token, queue)["locked"] == 0

    with rcq.spark.drain(spark, urls, queue, 300, token=token, valueType="string", numPartitions=3) as df:
        assert df.count() == 300  # evaluated twice: the same items both times
        df.write.parquet(str(tmp_path / "out"))
    values = _read_values(spark, tmp_path / "out")
    assert duplicates(values) == {} and len(values) == 300
    rest = [int(v) for v in take_all(urls, token, queue)]
    assert sorted(values + rest) == list(range(500))
