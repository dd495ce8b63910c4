"""The Spark connector over a queue placed in a partition (docs/partitions.md): the sink and the
streaming source route by queue through the nodes' own URLs, exactly once and losing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from tests.helpers import SPARK_QUERY_TIMEOUT_S
from tests.spark.helpers import (
    duplicates,
    enqueue_values,
    open_transactions,
    queue_info,
    take_all,
    unique_queue,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def in_p1(healthy_rcq_cluster: LocalCluster) -> Any:
    """A new queue placed in p1 (made once per run), by its name."""
    healthy_rcq_cluster.ensure_partitions(2)

    def place(prefix: str) -> str:
        queue = unique_queue(prefix)
        answer = healthy_rcq_cluster.poll_json(healthy_rcq_cluster.url(0) + f"/v1/queues/{queue}", method="PUT",
                                               body={"partitions": ["p1"]})
        assert answer["settings"]["partitions"] == ["p1"], answer
        return queue

    return place


def test_the_sink_writes_every_row_once_into_a_queue_of_another_partition(
        spark: Any, urls: str, token: str, in_p1: Any) -> None:
    queue = in_p1("sink-p1")
    df = spark.range(0, 4_000, 1, 4).selectExpr("cast(id as string) AS value")
    df.write.format("rcq").mode("append").option("url", urls).option("token", token).option("queue", queue).save()
    assert queue_info(urls, token, queue)["settings"]["partitions"] == ["p1"]
    values = [int(v) for v in take_all(urls, token, queue)]
    assert duplicates(values) == {} and sorted(values) == list(range(4_000))


def test_the_source_reads_every_item_once_from_a_queue_of_another_partition(
        spark: Any, urls: str, token: str, in_p1: Any, tmp_path: Path) -> None:
    queue, consumer = in_p1("src-p1"), unique_queue("consumer")
    enqueue_values(urls, token, queue, [str(i) for i in range(600)])
    stream = (spark.readStream.format("rcq").option("url", urls).option("token", token).option("queue", queue)
              .option("consumerId", consumer).option("valueType", "string").option("maxItemsPerPartition", "200")
              .load())
    query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(SPARK_QUERY_TIMEOUT_S), "the query did not finish in time"
    finally:
        query.stop()
    values = [int(row.value) for row in spark.read.parquet(str(tmp_path / "out")).select("value").collect()]
    assert duplicates(values) == {} and sorted(values) == list(range(600))
    info = queue_info(urls, token, queue)
    assert (info["count"], info["locked"]) == (0, 0), info
    assert open_transactions(urls, token, f"rcq-source:{consumer}:") == []
