"""Rows of the ``rcq`` data source: the read schema and the writer's ``value`` and ``priority`` columns.

Read schema (one row per item; the first three columns are the original ones, in their order)::

    queue               STRING     NOT NULL  the queue the item came from
    item_id             BIGINT     NOT NULL  rcq's id of the item (unique per queue; not an order)
    value               BINARY or STRING     the item (option valueType; default binary)
    delivery_count      INT        NOT NULL  earlier deliveries of the item that ended without a commit
    priority            INT        NOT NULL  the priority it was enqueued with (0: none)
    enqueued_at         TIMESTAMP            when its enqueue committed (the leader's clock)
    dead_letter_reason  STRING               in a dead-letter queue: max_deliveries, expired or rejected
    dead_letter_source  STRING               in a dead-letter queue: the queue it died in
    expires_at          TIMESTAMP            when it expires unless a commit takes it first (null: never)
    headers             MAP<STRING, STRING>  the item's headers (an empty map when it has none)

The columns are the fields of the client's :class:`~rcq.client.Item` (docs/queue-features.md).
A server older than those fields sends none of them: the row then says delivery count 0,
priority 0, no enqueue time, not dead and no expiry.

Writers take a DataFrame with a ``value`` column of type STRING or BINARY; a null value fails
the task. An integer ``priority`` column (TINYINT to BIGINT), if there is one, is each row's
priority (null: 0; 0 to 255, and at most the queue's ``max_priority``, else the write fails);
a ``headers`` column of type MAP<STRING, STRING>, if there is one, is each row's item headers
(null or empty: none; :mod:`rcq.spark.headers`); other columns are ignored. So a DataFrame read
from one rcq queue keeps its priorities and headers when written to another.

Must not import: pyspark at module level (executors import this cheaply), pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rcq.client import Item
from rcq.limits import PRIORITY_MAX
from rcq.spark.headers import (
    HEADERS_ARROW,
    HEADERS_COLUMN,
    HEADERS_DDL,
    Headers,
    batch_headers,
    check_headers_type,
    headers_array,
)
from rcq.spark.options import RcqOptionError

VALUE_COLUMN = "value"
PRIORITY_COLUMN = "priority"
TIMESTAMP = pa.timestamp("us", tz="UTC")  # what Spark's TimestampType is in Arrow

# (name, Spark DDL type, Arrow type, nullable) after queue, item_id and value
_NEW_COLUMNS: tuple[tuple[str, str, pa.DataType, bool], ...] = (
    ("delivery_count", "INT", pa.int32(), False),
    ("priority", "INT", pa.int32(), False),
    ("enqueued_at", "TIMESTAMP", TIMESTAMP, True),
    ("dead_letter_reason", "STRING", pa.string(), True),
    ("dead_letter_source", "STRING", pa.string(), True),
    ("expires_at", "TIMESTAMP", TIMESTAMP, True),
    # declared nullable, but this source always sends a map (empty when an item has none), so
    # consumers never test for null
    (HEADERS_COLUMN, HEADERS_DDL, HEADERS_ARROW, True),
)


def read_schema_ddl(value_type: str) -> str:
    new = ", ".join(f"{name} {ddl}" + ("" if nullable else " NOT NULL") for name, ddl, _, nullable in _NEW_COLUMNS)
    return f"queue STRING NOT NULL, item_id BIGINT NOT NULL, value {value_type.upper()}, {new}"


def arrow_schema(value_type: str) -> pa.Schema:
    """The read schema in Arrow, exactly as Spark expects it (nullability included)."""
    return pa.schema([pa.field("queue", pa.string(), nullable=False), pa.field("item_id", pa.int64(), nullable=False),
                      pa.field("value", pa.binary() if value_type == "binary" else pa.string()),
                      *(pa.field(name, arrow, nullable=nullable) for name, _, arrow, nullable in _NEW_COLUMNS)])


def items_to_batch(items: Sequence[Item], schema: pa.Schema) -> pa.RecordBatch:
    """Items -> one Arrow batch of the read schema; string values must be UTF-8."""
    values: list[Any] = [item.value for item in items]
    if pa.types.is_string(schema.field("value").type):
        for position, value in enumerate(values):
            try:
                values[position] = value.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"item {items[position].item_id} of queue {items[position].queue!r} is not UTF-8 "
                                 "text: read with option valueType=binary") from None
    enqueued_at_us = [None if item.enqueued_at_ms is None else item.enqueued_at_ms * 1000 for item in items]
    expires_at_us = [None if item.expires_at_ms is None else item.expires_at_ms * 1000 for item in items]
    return pa.RecordBatch.from_arrays(
        [pa.array([item.queue for item in items], pa.string()), pa.array([item.item_id for item in items], pa.int64()),
         pa.array(values, schema.field("value").type),
         pa.array([item.delivery_count for item in items], pa.int32()),
         pa.array([item.priority for item in items], pa.int32()),
         pa.array(enqueued_at_us, TIMESTAMP),
         pa.array([None if item.dead_letter is None else item.dead_letter.reason for item in items], pa.string()),
         pa.array([None if item.dead_letter is None else item.dead_letter.source_queue for item in items],
                  pa.string()),
         pa.array(expires_at_us, TIMESTAMP),
         headers_array([item.headers for item in items])], schema=schema)


def check_writer_schema(schema: Any) -> None:
    """Refuse, on the driver and before any task runs, a DataFrame without a usable value column
    or with a priority column that is not an integer."""
    from pyspark.sql.types import BinaryType, IntegralType, StringType

    fields = {field.name.lower(): field for field in schema.fields}
    field = fields.get(VALUE_COLUMN)
    if field is None:
        raise RcqOptionError(f"the rcq sink writes the column 'value' (STRING or BINARY), but the DataFrame has "
                             f"only {', '.join(schema.fieldNames()) or 'no columns'}: "
                             "select or alias one, e.g. df.selectExpr('to_json(struct(*)) AS value')")
    if not isinstance(field.dataType, StringType | BinaryType):
        raise RcqOptionError(f"the rcq sink's 'value' column must be STRING or BINARY, not {field.dataType.simpleString()}: "
                             "cast it, e.g. col('value').cast('string')")
    priority = fields.get(PRIORITY_COLUMN)
    if priority is not None and not isinstance(priority.dataType, IntegralType):
        raise RcqOptionError(f"the rcq sink's 'priority' column is each row's priority and must be an integer "
                             f"(TINYINT, SMALLINT, INT or BIGINT), not {priority.dataType.simpleString()}: cast it, "
                             "e.g. col('priority').cast('int'), or drop or rename it to enqueue at priority 0")
    headers = fields.get(HEADERS_COLUMN)
    if headers is not None:
        check_headers_type(headers)


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    names = [n.lower() for n in batch.schema.names]
    return batch.column(names.index(name)) if name in names else None


def batch_values(batch: pa.RecordBatch) -> list[str | bytes]:
    """The ``value`` column of an Arrow batch as Python str/bytes; a null fails clearly."""
    column = _column(batch, VALUE_COLUMN)
    assert column is not None, "check_writer_schema let a DataFrame without a value column through"
    if column.null_count:
        raise ValueError(f"the rcq sink's 'value' column holds {column.null_count} null(s); "
                         "filter them out or coalesce them first")
    return column.to_pylist()


def batch_priorities(batch: pa.RecordBatch) -> list[int] | None:
    """The ``priority`` column of an Arrow batch (null: 0), or None when there is none."""
    column = _column(batch, PRIORITY_COLUMN)
    if column is None:
        return None
    if not pa.types.is_integer(column.type):
        raise ValueError(f"the rcq sink's 'priority' column must be an integer, not {column.type}")
    if column.null_count:
        column = pc.fill_null(column, 0)
    if len(column):
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low < 0 or high > PRIORITY_MAX:
            wrong = low if low < 0 else high
            raise ValueError(f"the rcq sink's 'priority' column holds {wrong}: priorities are 0 to {PRIORITY_MAX} "
                             "(and at most the queue's max_priority)")
    return column.to_pylist()


def batch_item_headers(batch: pa.RecordBatch) -> list[Headers | None] | None:
    """The ``headers`` column of an Arrow batch, one dict (or None: no headers) per row, or None when
    there is no such column or no row of the batch has headers."""
    return batch_headers(_column(batch, HEADERS_COLUMN))
