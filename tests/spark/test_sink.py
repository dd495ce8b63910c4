"""The rcq batch and streaming sinks: exactly once under task retries, failed jobs and replayed batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import check_stream_sink_replay_adds_nothing_twice, duplicates, take_all, unique_queue

pytestmark = pytest.mark.spark


def _write(df: Any, urls: str, token: str, queue: str, fmt: str = "rcq", **options: str) -> None:
    df.write.format(fmt).option("url", urls).option("token", token).option("queue", queue).options(**options) \
        .mode("append").save()


def test_batch_write_adds_every_row_once_as_text_or_bytes(spark: Any, urls: str, token: str) -> None:
    queue = unique_queue("sink-text")
    df = spark.range(0, 10_000, 1, 4).selectExpr("cast(id as string) AS value", "id")
    _write(df, urls, token, queue, batchSize="700")
    values = take_all(urls, token, queue)
    assert sorted(int(v) for v in values) == list(range(10_000))

    binary_queue = unique_queue("sink-binary")
    _write(spark.createDataFrame([(bytes([0, 255, i]),) for i in range(10)], "value BINARY"), urls, token, binary_queue)
    assert sorted(take_all(urls, token, binary_queue)) == sorted(bytes([0, 255, i]) for i in range(10))


def test_batch_write_whose_task_fails_after_enqueuing_is_retried_without_duplicates(spark: Any, urls: str, token: str) -> None:
    queue = unique_queue("sink-retry")
    df = spark.range(0, 10_000, 1, 4).selectExpr("cast(id as string) AS value")
    _write(df, urls, token, queue, fmt="rcq_faulty", batchSize="100", failPartition="1", failAttempts="1")
    values = [int(v) for v in take_all(urls, token, queue)]
    assert duplicates(values) == {}
    assert sorted(values) == list(range(10_000))


def test_job_whose_every_attempt_fails_leaves_the_queue_untouched(spark: Any, urls: str, token: str) -> None:
    queue = unique_queue("sink-fails")
    df = spark.range(0, 4_000, 1, 4).selectExpr("cast(id as string) AS value")
    with pytest.raises(Exception, match="injected writer failure"):
        _write(df, urls, token, queue, fmt="rcq_faulty", batchSize="100", failPartition="2", failAttempts="99")
    assert take_all(urls, token, queue) == []


def test_stream_sink_replayed_batch_adds_nothing_twice(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    check_stream_sink_replay_adds_nothing_twice(spark, urls, token, tmp_path)


def test_writer_without_a_value_column_says_so(spark: Any, urls: str, token: str) -> None:
    with pytest.raises(Exception, match="column 'value'"):
        _write(spark.range(3), urls, token, unique_queue("sink-bad"))
    with pytest.raises(Exception, match="must be STRING or BINARY"):
        _write(spark.range(3).selectExpr("id AS value"), urls, token, unique_queue("sink-bad"))
