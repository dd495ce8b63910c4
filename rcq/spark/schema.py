"""Rows of the ``rcq`` data source: the read schema and the writer's ``value`` column.

Read schema (one row per item)::

    queue    STRING   NOT NULL  the queue the item came from
    item_id  BIGINT   NOT NULL  rcq's id of the item (unique per queue; not an order)
    value    BINARY or STRING   the item (option valueType; default binary)

rcq does not store when an item was enqueued, so there is no enqueue-time
column: add one to the value itself if you need it.

Writers take a DataFrame with a ``value`` column of type STRING or BINARY
(other columns are ignored); a null value fails the task.

Must not import: pyspark at module level (executors import this cheaply), pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from rcq.client import Item
from rcq.spark.options import RcqOptionError

VALUE_COLUMN = "value"


def read_schema_ddl(value_type: str) -> str:
    return f"queue STRING NOT NULL, item_id BIGINT NOT NULL, value {value_type.upper()}"


def arrow_schema(value_type: str) -> pa.Schema:
    return pa.schema([pa.field("queue", pa.string(), nullable=False), pa.field("item_id", pa.int64(), nullable=False),
                      pa.field("value", pa.binary() if value_type == "binary" else pa.string())])


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
    return pa.RecordBatch.from_arrays(
        [pa.array([item.queue for item in items], pa.string()), pa.array([item.item_id for item in items], pa.int64()),
         pa.array(values, schema.field("value").type)], schema=schema)


def check_writer_schema(schema: Any) -> None:
    """Refuse, on the driver and before any task runs, a DataFrame without a usable value column."""
    from pyspark.sql.types import BinaryType, StringType

    fields = {field.name.lower(): field for field in schema.fields}
    field = fields.get(VALUE_COLUMN)
    if field is None:
        raise RcqOptionError(f"the rcq sink writes the column 'value' (STRING or BINARY), but the DataFrame has "
                             f"only {', '.join(schema.fieldNames()) or 'no columns'}: "
                             "select or alias one, e.g. df.selectExpr('to_json(struct(*)) AS value')")
    if not isinstance(field.dataType, StringType | BinaryType):
        raise RcqOptionError(f"the rcq sink's 'value' column must be STRING or BINARY, not {field.dataType.simpleString()}: "
                             "cast it, e.g. col('value').cast('string')")


def batch_values(batch: pa.RecordBatch) -> list[str | bytes]:
    """The ``value`` column of an Arrow batch as Python str/bytes; a null fails clearly."""
    names = [name.lower() for name in batch.schema.names]
    column = batch.column(names.index(VALUE_COLUMN))
    if column.null_count:
        raise ValueError(f"the rcq sink's 'value' column holds {column.null_count} null(s); "
                         "filter them out or coalesce them first")
    return column.to_pylist()
