"""Item headers in the ``rcq`` data source: the ``headers`` map column both ways, and the enqueue of
rows whose items carry headers of their own.

* **Read**: every row has a ``headers`` column, ``MAP<STRING, STRING>``, the item's headers (an
  empty map when it has none; never null from this source).
* **Write**: an optional ``headers`` column of type ``MAP<STRING, STRING>``; null or an empty map:
  the row's item has no headers. A null header *value* fails the task (headers are strings).

The client's :meth:`~rcq.client.Transaction.enqueue_batch` gives one set of headers to every item
of a call, but a sink's rows each have their own (a per-row ``traceparent`` is the usual case).
Grouping rows by their headers would cost one request per row there, so a chunk in which some
row has headers is sent as one enqueue whose items are objects ``{"value", "headers"}`` (the
HTTP API's per-item form, docs/http-api.md), plain items staying strings. A chunk without
headers never comes here: it is the very ``enqueue_batch`` request of a write without headers.

Must not import: pyspark (executors import this cheaply), pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from rcq.client import Transaction
from rcq.client.wire import ItemValue
from rcq.spark.options import RcqOptionError

HEADERS_COLUMN = "headers"
HEADERS_DDL = "MAP<STRING, STRING>"
HEADERS_ARROW = pa.map_(pa.string(), pa.string())  # what Spark's MapType(string, string) is in Arrow

Headers = dict[str, str]
_NO_STRINGS = pa.array([], pa.string())


# ------------------------------------------------------------------------------------ read
def headers_array(headers: Sequence[Headers]) -> pa.MapArray:
    """The ``headers`` column of a read batch: one map per item, empty when it has none. Built
    from flat offsets, keys and values; a batch of plain items is one array of zeros (under
    0.1 us an item, against about 0.5 us for the rest of its row)."""
    if not any(headers):
        return pa.MapArray.from_arrays(pa.array([0] * (len(headers) + 1), pa.int32()), _NO_STRINGS, _NO_STRINGS)
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for item_headers in headers:
        if item_headers:
            keys.extend(item_headers)
            values.extend(item_headers.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()))


# ----------------------------------------------------------------------------------- write
def check_headers_type(field: Any) -> None:
    """Refuse, on the driver, a ``headers`` column (a pyspark StructField) that is not a map of
    strings to strings."""
    from pyspark.sql.types import MapType, StringType

    data_type = field.dataType
    if not (isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType)
            and isinstance(data_type.valueType, StringType)):
        raise RcqOptionError(f"the rcq sink's 'headers' column is each row's item headers and must be "
                             f"MAP<STRING, STRING>, not {data_type.simpleString()}: build one, e.g. "
                             "map_from_entries(...) or create_map(lit('k'), col('v')), or drop or rename it")


def batch_headers(column: pa.Array | None) -> list[Headers | None] | None:
    """Each row's headers (None: none), or None when no row of the batch has any (no column, or
    only nulls and empty maps): then the rows are plain and cost what they cost without the column."""
    if column is None or len(column) == 0:
        return None
    if not isinstance(column, pa.MapArray):
        raise ValueError(f"the rcq sink's 'headers' column must be a map of strings to strings, not {column.type}")
    offsets = column.offsets  # of this slice: the entries of all its maps are offsets[-1] - offsets[0]
    if offsets[-1].as_py() == offsets[0].as_py():
        return None
    rows: list[Headers | None] = []
    for position, entries in enumerate(column.to_pylist()):
        if not entries:
            rows.append(None)
            continue
        row: Headers = {}
        for key, value in entries:
            if value is None:
                raise ValueError(f"the rcq sink's 'headers' column holds a null value for key {key!r} "
                                 f"(row {position} of a batch): header values are strings; drop the key "
                                 "or coalesce the value")
            row[key] = value
        rows.append(row)
    return rows


def headers_bytes(headers: Headers | None) -> int:
    """The UTF-8 bytes of a row's header keys and values, for the sink's request and transaction sizes."""
    if not headers:
        return 0
    return sum(len(key.encode("utf-8")) + len(value.encode("utf-8")) for key, value in headers.items())


async def enqueue_with_headers(transaction: Transaction, queue: str, values: Sequence[ItemValue],
                               headers: Sequence[Headers | None], *, priority: int | None,
                               delay_s: float | None, ttl_s: float | None) -> int:
    """Buffer ``values`` in ``transaction``, each with its own headers (None: none), in one enqueue
    request (:meth:`~rcq.client.Transaction.enqueue_items`: keyed, retried, traced as every
    enqueue); returns the buffered item count. A cluster below feature level 2 refuses it
    (FeatureLevelRequired)."""
    return await transaction.enqueue_items(queue, zip(values, headers, strict=True), priority=priority,
                                           delay_s=delay_s, ttl_s=ttl_s)
