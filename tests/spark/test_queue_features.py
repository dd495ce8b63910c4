"""The connector and the queue features of docs/queue-features.md: the rows' delivery count, priority,
enqueue time and dead-letter columns; the sink's priority column and its delayS/ttlS options.

All but the last test need neither Spark's JVM nor a server: they drive the row building and
the writer's grouping through a transport that records requests. The last one writes and reads
a queue with priorities on the test cluster.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from rcq.client import DeadLetter, Item, RcqClient, Transaction  # noqa: E402
from rcq.client.routes import Routes  # noqa: E402
from rcq.client.transport import Request  # noqa: E402
from rcq.client.wire import item_from_wire  # noqa: E402
from rcq.spark.options import RcqOptionError, parse_options  # noqa: E402
from rcq.spark.schema import (  # noqa: E402
    arrow_schema,
    batch_priorities,
    check_writer_schema,
    items_to_batch,
    read_schema_ddl,
)
from rcq.spark.stream_reader import ReadPartition, available_items, take_items  # noqa: E402
from rcq.spark.writer import _chunks, enqueue_task  # noqa: E402
from tests.spark.helpers import duplicates, queue_info, unique_queue  # noqa: E402

URL = "http://127.0.0.1:1"
ENQUEUED_AT_MS = 1_795_000_000_123
NEW_ITEM = {"item_id": 17, "queue": "jobs.dlq", "value": "hello", "encoding": "utf-8", "delivery_count": 2,
            "priority": 5, "enqueued_at_ms": ENQUEUED_AT_MS, "expires_at_ms": ENQUEUED_AT_MS + 60_000,
            "dead_letter": {"reason": "max_deliveries", "source_queue": "jobs", "delivery_count": 3}}
OLD_ITEM = {"item_id": 18, "queue": "jobs", "value": base64.b64encode(b"\x00\xff").decode(), "encoding": "base64"}


# ------------------------------------------------------------------------------ the read schema
def _expected_struct(value_type: Any) -> Any:
    from pyspark.sql.types import IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType

    return StructType([
        StructField("queue", StringType(), False), StructField("item_id", LongType(), False),
        StructField("value", value_type, True), StructField("delivery_count", IntegerType(), False),
        StructField("priority", IntegerType(), False), StructField("enqueued_at", TimestampType(), True),
        StructField("dead_letter_reason", StringType(), True), StructField("dead_letter_source", StringType(), True),
        StructField("expires_at", TimestampType(), True),
        StructField("headers", MapType(StringType(), StringType(), True), True)])


def test_the_read_schema_keeps_its_columns_first_and_appends_the_new_ones() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import BinaryType, StringType

    assert read_schema_ddl("string") == (
        "queue STRING NOT NULL, item_id BIGINT NOT NULL, value STRING, delivery_count INT NOT NULL, "
        "priority INT NOT NULL, enqueued_at TIMESTAMP, dead_letter_reason STRING, dead_letter_source STRING, "
        "expires_at TIMESTAMP, headers MAP<STRING, STRING>")
    assert read_schema_ddl("binary").startswith("queue STRING NOT NULL, item_id BIGINT NOT NULL, value BINARY, ")
    # Spark refuses a reader's Arrow batch whose schema differs from this, nullability included
    for value_type, spark_type in (("binary", BinaryType()), ("string", StringType())):
        assert to_arrow_schema(_expected_struct(spark_type), timezone="UTC").equals(arrow_schema(value_type))


def test_an_item_entry_becomes_a_row_with_or_without_the_new_fields() -> None:
    new, old = item_from_wire(NEW_ITEM), item_from_wire(OLD_ITEM)
    assert new == Item(17, "jobs.dlq", b"hello", delivery_count=2, priority=5, enqueued_at_ms=ENQUEUED_AT_MS,
                       dead_letter=DeadLetter("max_deliveries", "jobs", 3), expires_at_ms=ENQUEUED_AT_MS + 60_000)
    assert old == Item(18, "jobs", b"\x00\xff")  # an older server: the defaults

    rows = items_to_batch([new, old], arrow_schema("binary")).to_pylist()
    assert rows[0] == {"queue": "jobs.dlq", "item_id": 17, "value": b"hello", "delivery_count": 2, "priority": 5,
                       "enqueued_at": datetime.datetime(2026, 11, 18, 11, 6, 40, 123000, tzinfo=datetime.UTC),
                       "dead_letter_reason": "max_deliveries", "dead_letter_source": "jobs",
                       "expires_at": datetime.datetime(2026, 11, 18, 11, 7, 40, 123000, tzinfo=datetime.UTC),
                       "headers": []}
    assert rows[1] == {"queue": "jobs", "item_id": 18, "value": b"\x00\xff", "delivery_count": 0, "priority": 0,
                       "enqueued_at": None, "dead_letter_reason": None, "dead_letter_source": None, "expires_at": None,
                       "headers": []}
    # null is as absent; a live item has no dead_letter
    live = item_from_wire({**OLD_ITEM, "delivery_count": None, "priority": 3, "enqueued_at_ms": None, "dead_letter": None})
    assert items_to_batch([live], arrow_schema("binary")).to_pylist()[0] == {**rows[1], "priority": 3}
    assert items_to_batch([new], arrow_schema("string")).column("value").to_pylist() == ["hello"]
    with pytest.raises(ValueError, match="is not UTF-8 text: read with option valueType=binary"):
        items_to_batch([old], arrow_schema("string"))


def test_the_source_counts_only_items_a_dequeue_could_take() -> None:
    assert available_items({"count": 10, "available": 8, "ready": 5, "delayed": 3}) == 5  # delayed ones are not
    assert available_items({"count": 10, "available": 8, "locked": 2}) == 8  # an older server
    assert available_items({"count": 10, "available": None}) == 10  # a follower's answer


# ------------------------------------------------------------------------ a recording transport
class RecordingTransport:
    """Answers the transaction verbs the connector sends and records their bodies; dequeues answer
    ``entries`` (all of them for the first request, then none)."""

    def __init__(self, entries: list[dict[str, Any]] | None = None) -> None:
        self.routes = Routes(self.ask)  # what a Transaction asks of its transport (rcq.client.routes)
        self.entries = list(entries or ())
        self.requests: list[Request] = []
        self.buffered: dict[str, int] = {}

    async def ask(self, path: str) -> dict[str, Any]:
        raise AssertionError(f"unexpected lookup {path}")

    async def request(self, request: Request) -> dict[str, Any]:
        self.requests.append(request)
        body = request.body or {}
        transaction_id = request.path.split("/")[3]
        if request.path.endswith("/enqueue"):
            self.buffered[transaction_id] = self.buffered.get(transaction_id, 0) + len(body["items"])
            return {"buffered": self.buffered[transaction_id]}
        if request.path.endswith("/dequeue"):
            given, self.entries = self.entries[:body["max_items"]], self.entries[body["max_items"]:]
            return {"items": given}
        if request.path.endswith("/abort"):
            return {"returned": 0}
        raise AssertionError(f"unexpected request {request}")

    def enqueues(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r.path.split("/")[3], dict(r.body or {})) for r in self.requests if r.path.endswith("/enqueue")]


class RecordingClient:
    """What enqueue_task and take_items ask of an RcqClient: begin, transactions, attach."""

    def __init__(self, transport: RecordingTransport) -> None:
        self.transport = transport
        self.begun = 0

    async def begin(self, timeout_s: float | None = None, label: str | None = None) -> Transaction:
        self.begun += 1
        return Transaction(self.transport, f"{self.begun:x}.{'0' * 24}", label=label)  # type: ignore[arg-type]

    async def transactions(self, label_prefix: str | None = None, *, complete: bool = False) -> list[dict[str, Any]]:
        return []


def _options(**extra: str) -> Any:
    return parse_options({"url": URL, "queue": "jobs", **{k.lower(): v for k, v in extra.items()}})


def _batch(values: list[Any], priorities: list[Any] | None = None, priority_type: Any = None) -> Any:
    if priorities is None:
        return pa.RecordBatch.from_arrays([pa.array(values, pa.string())], names=["value"])
    return pa.RecordBatch.from_arrays([pa.array(values, pa.string()), pa.array(priorities, priority_type or pa.int64())],
                                      names=["value", "Priority"])


def test_the_source_reads_the_new_fields_through_its_own_dequeues() -> None:
    transport = RecordingTransport([NEW_ITEM, OLD_ITEM])
    partition = ReadPartition("rcq-source:c:1:0", "p0", 10)
    transaction_id, items = asyncio.run(take_items(RecordingClient(transport), _options(), partition))  # type: ignore[arg-type]
    assert transaction_id.startswith("1.")
    assert [(i.item_id, i.delivery_count, i.priority, i.dead_letter) for i in items] == [
        (17, 2, 5, DeadLetter("max_deliveries", "jobs", 3)), (18, 0, 0, None)]
    first = transport.requests[0]
    assert first.body == {"queue": "jobs", "max_items": 10, "wait_ms": 0, "key": "p0:0"}  # replayable keys
    assert first.batch_operation == {"op": "dequeue", "transaction_id": transaction_id, **first.body}


# ------------------------------------------------------------------------------ the sink's rows
def test_the_priority_column_is_read_with_nulls_as_zero_and_checked() -> None:
    assert batch_priorities(_batch(["a"])) is None
    assert batch_priorities(_batch(["a", "b", "c"], [3, None, 255], pa.int16())) == [3, 0, 255]
    assert batch_priorities(_batch([], [])) == []
    with pytest.raises(ValueError, match="'priority' column holds 256: priorities are 0 to 255"):
        batch_priorities(_batch(["a", "b"], [1, 256]))
    with pytest.raises(ValueError, match="'priority' column holds -1"):
        batch_priorities(_batch(["a"], [-1], pa.int32()))


def _chunk_tuples(batches: list[Any], items_max: int, bytes_max: int) -> list[tuple[int, list[Any], int]]:
    """The writer's chunks as (priority, values, size); none of these batches has headers."""
    chunks = list(_chunks(batches, items_max, bytes_max))
    assert all(chunk.headers is None for chunk in chunks)
    return [(chunk.priority, chunk.values, chunk.size) for chunk in chunks]


def test_rows_are_grouped_into_chunks_of_one_priority_in_their_order() -> None:
    batches = [_batch([f"v{i}" for i in range(10)], [i % 3 for i in range(10)]),
               _batch(["w0", "w1"], [None, 2])]
    chunks = _chunk_tuples(batches, items_max=100, bytes_max=1 << 20)
    assert chunks == [(0, ["v0", "v3", "v6", "v9", "w0"], 10), (1, ["v1", "v4", "v7"], 6), (2, ["v2", "v5", "v8", "w1"], 8)]
    # without a priority column: the chunks of before, in order, all priority 0
    plain = _chunk_tuples([_batch([f"{i}" for i in range(7)])], items_max=3, bytes_max=1 << 20)
    assert plain == [(0, ["0", "1", "2"], 3), (0, ["3", "4", "5"], 3), (0, ["6"], 1)]


def test_the_chunks_being_filled_stay_within_the_bounds_together() -> None:
    values = [f"{i:04d}" for i in range(1000)]  # 4 bytes each
    for items_max, bytes_max in ((10, 1 << 20), (1000, 40)):  # at most 10 items in memory either way
        chunks = _chunk_tuples([_batch(values, [i % 7 for i in range(1000)])], items_max, bytes_max)
        assert all(len(chunk) <= 10 and size == 4 * len(chunk) for _, chunk, size in chunks)
        assert sorted(v for _, chunk, _ in chunks for v in chunk) == values  # every row once
        for priority in range(7):
            mine = [v for p, chunk, _ in chunks if p == priority for v in chunk]
            assert mine == [v for i, v in enumerate(values) if i % 7 == priority]  # in their order


def test_each_priority_is_an_enqueue_of_its_own_in_the_same_transaction_with_delay_and_ttl() -> None:
    transport = RecordingTransport()
    client = RecordingClient(transport)
    batches = [_batch([str(i) for i in range(9)], [i % 3 for i in range(9)])]
    ids, rows = asyncio.run(enqueue_task(client, _options(delayS="0", ttlS="90.5"), batches, "rcq-sink:x:0"))  # type: ignore[arg-type]
    assert rows == 9 and len(ids) == 1 and client.begun == 1
    enqueues = transport.enqueues()
    assert {transaction_id for transaction_id, _ in enqueues} == set(ids)
    by_priority = {body.get("priority", 0): body for _, body in enqueues}
    assert sorted(by_priority) == [0, 1, 2] and len(enqueues) == 3
    assert by_priority[0]["items"] == ["0", "3", "6"] and "priority" not in by_priority[0]  # 0: the default, not sent
    assert by_priority[2]["items"] == ["2", "5", "8"] and by_priority[2]["priority"] == 2
    assert all(body["delay_s"] == 0.0 and body["ttl_s"] == 90.5 for body in by_priority.values())  # an explicit 0 is sent
    assert len({body["key"] for body in by_priority.values()}) == 3


def test_a_write_without_the_new_options_sends_the_requests_of_before() -> None:
    transport = RecordingTransport()
    _, rows = asyncio.run(enqueue_task(RecordingClient(transport), _options(), [_batch(["a", "b"])], "l"))  # type: ignore[arg-type]
    [(_, body)] = transport.enqueues()
    assert set(body) == {"queue", "items", "encoding", "key"} and rows == 2


def test_a_bad_priority_fails_the_task_and_aborts_what_it_enqueued() -> None:
    transport = RecordingTransport()
    client = RecordingClient(transport)
    batches = [_batch(["a", "b"], [1, 1]), _batch(["c"], [300])]  # "a" goes out before "c" is seen
    with pytest.raises(ValueError, match="holds 300"):
        asyncio.run(enqueue_task(client, _options(batchSize="1"), batches, "l"))  # type: ignore[arg-type]
    assert client.begun == 1 and transport.requests[-1].path.endswith("/abort")


# ---------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(("extra", "message"), [
    ({"delayS": "-1"}, r"option delayS=-1 is out of range: use at least 0 and at most 604800 seconds"),
    ({"delayS": "soon"}, r"option delayS='soon' is not a number of seconds"),
    ({"delayS": "nan"}, r"option delayS=nan is out of range"),
    ({"ttlS": "0"}, r"option ttlS=0 is out of range: use more than 0 and at most 3.1536e\+07 seconds"),
    ({"ttlS": "-5"}, r"option ttlS=-5 is out of range"),
    ({"ttlS": "1e99"}, r"option ttlS=1e\+99 is out of range"),
])
def test_bad_delay_and_ttl_options_are_refused(extra: dict[str, str], message: str) -> None:
    with pytest.raises(RcqOptionError, match=message):
        _options(**extra)


def test_delay_and_ttl_options_default_to_the_queues_settings() -> None:
    assert (_options().delay_s, _options().ttl_s) == (None, None)
    assert (_options(delayS="0", ttlS="0.25").delay_s, _options(delayS="0", ttlS="0.25").ttl_s) == (0.0, 0.25)


def test_the_writer_refuses_a_priority_column_that_is_not_an_integer() -> None:
    from pyspark.sql.types import (
        ByteType,
        DoubleType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        StructField,
        StructType,
    )

    def schema(priority_type: Any) -> Any:
        return StructType([StructField("value", StringType()), StructField("PRIORITY", priority_type)])

    for integral in (ByteType(), ShortType(), IntegerType(), LongType()):
        check_writer_schema(schema(integral))
    check_writer_schema(StructType([StructField("value", StringType())]))
    for other in (StringType(), DoubleType()):
        with pytest.raises(RcqOptionError, match=rf"'priority' column .* must be an integer .*not {other.simpleString()}"):
            check_writer_schema(schema(other))


# -------------------------------------------------------------------------------- on a cluster
def _configure_queue(urls: str, token: str, queue: str, **settings: Any) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with RcqClient(urls.split(","), retry_timeout_s=30.0, token=token) as client:
            return await client.configure_queue(queue, **settings)

    return asyncio.run(main())


@pytest.mark.spark
def test_rows_written_with_priorities_are_read_back_highest_first_with_their_priority(
        spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    queue, consumer = unique_queue("prio"), unique_queue("consumer")
    _configure_queue(urls, token, queue, max_priority=9)
    rows = 300
    expected = {i: 0 if i % 25 == 7 else i % 10 for i in range(rows)}  # a null priority is 0
    df = spark.range(0, rows, 1, 3).selectExpr(
        "cast(id as string) AS value", "CASE WHEN id % 25 = 7 THEN NULL ELSE cast(id % 10 AS TINYINT) END AS priority")
    started_ms = time.time() * 1000
    df.write.format("rcq").option("url", urls).option("token", token).option("queue", queue) \
        .option("delayS", "0").option("ttlS", "3600").mode("append").save()

    seen: list[tuple[int, Any]] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend((batch_id, row) for row in batch.collect())

    stream = (spark.readStream.format("rcq").option("url", urls).option("token", token).option("queue", queue)
              .option("consumerId", consumer).option("valueType", "string").option("numPartitions", "1")
              .option("maxItemsPerPartition", "40").load())
    assert stream.schema.simpleString() == (
        "struct<queue:string,item_id:bigint,value:string,delivery_count:int,priority:int,enqueued_at:timestamp,"
        "dead_letter_reason:string,dead_letter_source:string,expires_at:timestamp,headers:map<string,string>>")
    query = (stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240), "the query did not finish within 240 s"
        assert query.exception() is None
    finally:
        query.stop()
    finished_ms = time.time() * 1000

    values = [int(row.value) for _, row in seen]
    assert duplicates(values) == {} and sorted(values) == list(range(rows))
    assert {int(row.value): row.priority for _, row in seen} == expected
    assert {row.delivery_count for _, row in seen} == {0}
    assert all(row.dead_letter_reason is None and row.dead_letter_source is None for _, row in seen)
    # the sink's ttlS: each row expires an hour after its enqueue
    assert all(row.expires_at - row.enqueued_at == datetime.timedelta(hours=1) for _, row in seen)
    enqueued_ms = [row.enqueued_at.timestamp() * 1000 for _, row in seen]
    assert started_ms - 5000 <= min(enqueued_ms) and max(enqueued_ms) <= finished_ms + 5000
    # one reader task: each micro-batch took the highest priorities left
    batches = sorted({batch_id for batch_id, _ in seen})
    priorities = {b: [row.priority for batch_id, row in seen if batch_id == b] for b in batches}
    for earlier, later in itertools.pairwise(batches):
        assert min(priorities[earlier]) >= max(priorities[later]), priorities
    info = queue_info(urls, token, queue)
    assert (info["count"], info["locked"]) == (0, 0), info
