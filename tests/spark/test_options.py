"""Options of the rcq data source: parsed with clear errors, in Spark and without it."""

from __future__ import annotations

from typing import Any

import pytest

from rcq.spark.options import RcqOptionError, parse_options, sink_id_of

URL = "http://127.0.0.1:1"


@pytest.mark.parametrize(("options", "message"), [
    ({"queue": "q"}, "option url is required"),
    ({"url": "localhost:7001", "queue": "q"}, "is not http://host:port"),
    ({"url": URL}, "option queue is required"),
    ({"url": URL, "queue": "a/b"}, "is not a queue name"),
    ({"url": URL, "queue": "q", "batchSize": "many"}, "option batchSize='many' is not an integer"),
    ({"url": URL, "queue": "q", "batchSize": "0"}, "option batchSize=0 is out of range"),
    ({"url": URL, "queue": "q", "numPartitions": "-2"}, "option numPartitions=-2 is out of range"),
    ({"url": URL, "queue": "q", "transactionTimeoutSeconds": "7200"}, "transactionTimeoutSeconds=7200.0 is out of range"),
    ({"url": URL, "queue": "q", "valueType": "json"}, "option valueType='json' is unknown"),
    ({"url": URL, "queue": "q", "consumerId": "a b"}, "option consumerId='a b' is malformed"),
])
def test_bad_options_are_refused_with_a_clear_message(options: dict[str, str], message: str) -> None:
    with pytest.raises(RcqOptionError, match=message):
        parse_options({k.lower(): v for k, v in options.items()})


def test_options_have_defaults_and_the_sink_id_follows_the_checkpoint() -> None:
    options = parse_options({"url": f"{URL}, http://127.0.0.1:2/", "queue": "q", "maxitemsperpartition": "5"})
    assert options.urls == (URL, "http://127.0.0.1:2")
    assert (options.value_type, options.batch_size, options.max_items_per_partition) == ("binary", 1000, 5)
    first = sink_id_of(options, {"checkpointlocation": "/data/cp"})
    assert first == sink_id_of(options, {"checkpointlocation": "/data/cp"}) != sink_id_of(options, {"checkpointlocation": "/x"})
    with pytest.raises(RcqOptionError, match="needs option sinkId or a checkpointLocation"):
        sink_id_of(options, {})


@pytest.mark.spark
def test_bad_options_fail_the_spark_call_with_the_same_message(spark: Any, urls: str) -> None:
    df = spark.range(3).selectExpr("cast(id as string) AS value")
    with pytest.raises(Exception, match="option url is required"):
        df.write.format("rcq").option("queue", "q").mode("append").save()
    with pytest.raises(Exception, match="option queue is required"):
        df.write.format("rcq").option("url", urls).mode("append").save()
    with pytest.raises(Exception, match="option batchSize='x' is not an integer"):
        df.write.format("rcq").option("url", urls).option("queue", "q").option("batchSize", "x").mode("append").save()
    with pytest.raises(Exception, match="option consumerId is required"):
        spark.readStream.format("rcq").option("url", urls).option("queue", "q").load() \
            .writeStream.format("noop").start().awaitTermination(60)
    with pytest.raises(Exception, match=r"rcq\.spark\.drain"):
        spark.read.format("rcq").option("url", urls).option("queue", "q").load().collect()


@pytest.mark.spark
def test_unreachable_cluster_fails_the_task_with_the_rcq_error_code(spark: Any) -> None:
    df = spark.range(3).selectExpr("cast(id as string) AS value")
    with pytest.raises(Exception, match="rcq unavailable: enqueueing partition"):
        df.write.format("rcq").option("url", URL).option("queue", "q").option("retryTimeoutSeconds", "0.5") \
            .mode("append").save()
