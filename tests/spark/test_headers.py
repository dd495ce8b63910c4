"""The connector and item headers: the source's ``headers`` map column, the sink's optional one.

All but the last test need neither Spark's JVM nor a server: they drive the row building and the
writer's requests through a transport that records them. The last one writes rows with headers
to the test cluster with the batch sink, drains them, writes the drained DataFrame on to a second
queue and reads that one with the streaming source: every row comes back with its headers.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

import rcq.spark  # noqa: E402
from rcq.client import Item, RcqClient, Transaction  # noqa: E402
from rcq.client.routes import Routes  # noqa: E402
from rcq.client.transport import Request  # noqa: E402
from rcq.errors import FeatureLevelRequired  # noqa: E402
from rcq.spark.headers import HEADERS_ARROW, batch_headers  # noqa: E402
from rcq.spark.options import RcqOptionError, parse_options  # noqa: E402
from rcq.spark.schema import arrow_schema, check_writer_schema, items_to_batch  # noqa: E402
from rcq.spark.writer import _chunks, enqueue_task  # noqa: E402
from tests.spark.helpers import duplicates, queue_info, unique_queue  # noqa: E402

URL = "http://127.0.0.1:1"


class RecordingTransport:
    """Answers enqueue and abort, records every request; ``refuse``: what an enqueue raises instead."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.routes = Routes(self.ask)  # what a Transaction asks of its transport (rcq.client.routes)
        self.requests: list[Request] = []
        self.refuse = refuse
        self.buffered = 0

    async def ask(self, path: str) -> dict[str, Any]:
        raise AssertionError(f"unexpected lookup {path}")

    async def request(self, request: Request) -> dict[str, Any]:
        self.requests.append(request)
        if request.path.endswith("/enqueue"):
            if self.refuse is not None:
                raise self.refuse
            self.buffered += len((request.body or {})["items"])
            return {"buffered": self.buffered}
        if request.path.endswith("/abort"):
            return {"returned": 0}
        raise AssertionError(f"unexpected request {request}")

    def enqueue_bodies(self) -> list[dict[str, Any]]:
        return [dict(r.body or {}) for r in self.requests if r.path.endswith("/enqueue")]


class RecordingClient:
    def __init__(self, transport: RecordingTransport) -> None:
        self.transport = transport

    async def begin(self, timeout_s: float | None = None, label: str | None = None) -> Transaction:
        return Transaction(self.transport, "1." + "0" * 24, label=label)  # type: ignore[arg-type]


def _options(**extra: str) -> Any:
    return parse_options({"url": URL, "queue": "jobs", **{k.lower(): v for k, v in extra.items()}})


def _batch(values: list[Any], headers: list[Any] | None = None, value_type: Any = None) -> Any:
    arrays = [pa.array(values, value_type or pa.string())]
    names = ["value"]
    if headers is not None:
        arrays.append(pa.array(headers, HEADERS_ARROW))
        names.append("Headers")  # column names are matched without case, as Spark does
    return pa.RecordBatch.from_arrays(arrays, names=names)


# ------------------------------------------------------------------------------------ the read
def test_a_read_row_carries_its_items_headers_and_an_empty_map_without() -> None:
    items = [Item(1, "q", b"a", headers={"traceparent": "00-ab-cd-01", "k": ""}), Item(2, "q", b"b"),
             Item(3, "q", b"c", headers={"\u00e9": "\u00fc"})]
    rows = items_to_batch(items, arrow_schema("string")).to_pylist()
    assert [row["headers"] for row in rows] == [[("traceparent", "00-ab-cd-01"), ("k", "")], [], [("\u00e9", "\u00fc")]]
    plain = items_to_batch([Item(4, "q", b"d"), Item(5, "q", b"e")], arrow_schema("binary"))
    assert plain.column("headers").to_pylist() == [[], []] and plain.column("headers").null_count == 0
    assert items_to_batch([], arrow_schema("binary")).num_rows == 0


# ----------------------------------------------------------------------------------- the sink
def test_the_headers_column_is_read_per_row_and_none_when_no_row_has_any() -> None:
    def column(headers: list[Any]) -> Any:
        return _batch(["x"] * len(headers), headers).column(1)

    assert batch_headers(None) is None
    assert batch_headers(column([None, [], None])) is None  # only nulls and empty maps: plain rows
    assert batch_headers(column([])) is None
    assert batch_headers(column([None, [("a", "1"), ("b", "2")], []])) == [None, {"a": "1", "b": "2"}, None]
    # a slice of a column counts only its own maps
    assert batch_headers(column([[("a", "1")], None, []]).slice(1, 2)) is None
    with pytest.raises(ValueError, match=r"null value for key 'a' \(row 0 of a batch\)"):
        batch_headers(column([[("a", None)]]))


def test_rows_with_headers_travel_as_item_objects_and_plain_chunks_as_before() -> None:
    transport = RecordingTransport()
    batches = [_batch(["p0", "p1"]),  # no headers column at all
               _batch(["n0", "n1"], [None, []]),  # a column with no headers in it
               _batch(["h0", "h1", "h2"], [[("t", "0")], None, [("t", "2"), ("u", "\u00fc")]])]
    ids, rows = asyncio.run(enqueue_task(RecordingClient(transport), _options(batchSize="2"), batches, "l"))  # type: ignore[arg-type]
    assert rows == 7 and len(ids) == 1
    bodies = transport.enqueue_bodies()
    assert [body["items"] for body in bodies] == [
        ["p0", "p1"], ["n0", "n1"],  # the plain requests of before: strings, no other field
        [{"value": "h0", "headers": {"t": "0"}}, "h1"],
        [{"value": "h2", "headers": {"t": "2", "u": "\u00fc"}}]]
    assert all(set(body) == {"queue", "items", "encoding", "key"} for body in bodies)
    assert len({body["key"] for body in bodies}) == 4  # each one keyed, hence retry-safe


def test_chunk_sizes_count_header_bytes_and_headers_do_not_split_a_priority() -> None:
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["aa", "bb", "cc"]), pa.array([1, 1, 1], pa.int32()),
         pa.array([[("k", "\u00fc")], None, []], HEADERS_ARROW)], names=["value", "priority", "headers"])
    [chunk] = list(_chunks([batch], items_max=10, bytes_max=1 << 20))
    assert (chunk.priority, chunk.values, chunk.headers) == (1, ["aa", "bb", "cc"], [{"k": "\u00fc"}, None, None])
    assert chunk.size == 6 + 1 + 2  # values, then the key and the value's UTF-8 bytes


def test_binary_values_with_headers_travel_in_base64_objects() -> None:
    transport = RecordingTransport()
    batch = _batch([b"\xff\x00", b"ok"], [[("h", "v")], None], pa.binary())
    asyncio.run(enqueue_task(RecordingClient(transport), _options(delayS="0", ttlS="60"), [batch], "l"))  # type: ignore[arg-type]
    [body] = transport.enqueue_bodies()
    assert body["encoding"] == "base64" and body["delay_s"] == 0 and body["ttl_s"] == 60
    assert body["items"] == [{"value": base64.b64encode(b"\xff\x00").decode(), "headers": {"h": "v"}},
                             base64.b64encode(b"ok").decode()]


def test_a_cluster_below_level_2_fails_the_task_and_the_task_aborts_its_transaction() -> None:
    transport = RecordingTransport(refuse=FeatureLevelRequired("item headers need feature level 2"))
    with pytest.raises(FeatureLevelRequired):
        asyncio.run(enqueue_task(RecordingClient(transport), _options(), [_batch(["a"], [[("h", "v")]])], "l"))  # type: ignore[arg-type]
    assert [r.path.rsplit("/", 1)[-1] for r in transport.requests] == ["enqueue", "abort"]


def test_the_writer_takes_a_map_of_strings_as_headers_and_refuses_anything_else() -> None:
    from pyspark.sql.types import ArrayType, IntegerType, MapType, StringType, StructField, StructType

    def schema(headers_type: Any) -> Any:
        return StructType([StructField("value", StringType()), StructField("HEADERS", headers_type)])

    check_writer_schema(schema(MapType(StringType(), StringType(), True)))
    check_writer_schema(schema(MapType(StringType(), StringType(), False)))
    for other in (StringType(), MapType(StringType(), IntegerType()), ArrayType(StringType())):
        with pytest.raises(RcqOptionError, match=rf"'headers' column .* must be MAP<STRING, STRING>, not "
                                                 rf"{other.simpleString()}"):
            check_writer_schema(schema(other))


# -------------------------------------------------------------------------------- on a cluster
def _raise_level(urls: str, token: str) -> None:
    async def main() -> None:
        async with RcqClient(urls.split(","), retry_timeout_s=30.0, token=token) as client:
            # headers need level 2; the cluster may have raised itself to its highest already
            assert (await client.raise_feature_level())["level"] >= 2

    asyncio.run(main())


def _expected_headers(i: int) -> dict[str, str]:
    """Row i's headers: none (a null map or an empty one) for two rows in three, else two of its own."""
    return {} if i % 3 != 2 else {"traceparent": f"00-{i:032x}-{i:016x}-01", "n\u00e9": str(i)}


@pytest.mark.spark
def test_rows_written_with_headers_are_read_back_with_them(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    _raise_level(urls, token)  # the cluster raises itself soon after it starts; at once here
    first, second, consumer = unique_queue("hdr"), unique_queue("hdr2"), unique_queue("consumer")
    rows = 150
    df = spark.range(0, rows, 1, 2).selectExpr(
        "cast(id as string) AS value",
        "CASE WHEN id % 3 = 0 THEN NULL WHEN id % 3 = 1 THEN cast(map() AS map<string,string>) "
        "ELSE map('traceparent', concat('00-', lpad(lower(hex(id)), 32, '0'), '-', lpad(lower(hex(id)), 16, '0'), '-01'), "
        "'n\u00e9', cast(id AS string)) END AS headers")
    df.write.format("rcq").option("url", urls).option("token", token).option("queue", first) \
        .option("batchSize", "40").mode("append").save()

    # the drain (batch source) reads the headers, and the sink writes them on as they were read
    with rcq.spark.drain(spark, urls, first, max_items=rows, token=token, valueType="string") as drained:
        assert drained.schema["headers"].dataType.simpleString() == "map<string,string>"
        drained.select("value", "headers").write.format("rcq").option("url", urls).option("token", token) \
            .option("queue", second).mode("append").save()
    assert queue_info(urls, token, first)["count"] == 0

    seen: list[Any] = []
    stream = (spark.readStream.format("rcq").option("url", urls).option("token", token).option("queue", second)
              .option("consumerId", consumer).option("valueType", "string").option("maxItemsPerPartition", "50")
              .load())
    query = (stream.writeStream.foreachBatch(lambda batch, _: seen.extend(batch.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240), "the query did not finish within 240 s"
        assert query.exception() is None
    finally:
        query.stop()
    values = [int(row.value) for row in seen]
    assert duplicates(values) == {} and sorted(values) == list(range(rows))
    assert {int(row.value): row.headers for row in seen} == {i: _expected_headers(i) for i in range(rows)}
