"""``rcq_baseline``: a Spark streaming source that reads nothing from anywhere — what Spark itself costs.

``python -m bench.spark`` runs it next to the rcq source, with the same rows, schema, partitions,
rows per task per micro-batch and Arrow batch size, into the same ``noop`` sink: the rows it
makes up (100-byte values) cost no network, no rcq and no commit. The time its query takes is
Spark's alone — starting the query and its Python source runner, planning, scheduling and
checkpointing each micro-batch, moving the rows from the Python workers into the JVM — so it is
the most any Spark source can reach in that sitting, and the rcq source's distance to it is what
the connector and rcq cost.

Options: ``rows`` (in all), ``numPartitions``, ``maxItemsPerPartition``, ``batchSize`` (rows per
Arrow batch, as the rcq source yields them). Executors unpickle it by value (the bench registers
this module with cloudpickle), since ``bench`` is not importable where they run.

Must not import: rcq.client, rcq.server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from rcq.spark.schema import arrow_schema, read_schema_ddl

FORMAT = "rcq_baseline"
VALUE_BYTES = 100


def made_up_batch(rows: int) -> pa.RecordBatch:
    """``rows`` rows of the rcq source's binary schema: 100-byte values, zero counts, no times."""
    schema = arrow_schema("binary")
    columns: list[pa.Array] = []
    for field in schema:
        if field.name == "value":
            columns.append(pa.array([b"x" * VALUE_BYTES] * rows, field.type))
        elif field.name == "queue":
            columns.append(pa.array(["baseline"] * rows, field.type))
        elif field.name == "item_id":
            columns.append(pa.array(range(rows), field.type))
        elif pa.types.is_integer(field.type):
            columns.append(pa.array([0] * rows, field.type))
        else:
            columns.append(pa.nulls(rows, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class BaselineStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch ``n`` holds rows ``(n-1) * per_batch .. n * per_batch`` of ``rows``."""

    def __init__(self, options: Any) -> None:
        self.rows = int(options.get("rows", "0"))
        self.partitions_count = int(options.get("numPartitions", "2"))
        self.per_partition = int(options.get("maxItemsPerPartition", "1000"))
        self.batch_size = int(options.get("batchSize", "1000"))

    def initialOffset(self) -> dict[str, int]:
        return {"batch": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        per_batch = self.partitions_count * self.per_partition
        done = int(start["batch"])
        return {"batch": done + 1} if done * per_batch < self.rows else start

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        batch = int(end["batch"])
        if batch == int(start["batch"]):
            return []
        first = (batch - 1) * self.partitions_count * self.per_partition
        shares = [max(0, min(self.per_partition, self.rows - first - i * self.per_partition))
                  for i in range(self.partitions_count)]
        return [InputPartition(share) for share in shares if share > 0]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rows = int(partition.value)
        batch = made_up_batch(rows)
        for start in range(0, rows, self.batch_size):
            yield batch.slice(start, self.batch_size)

    def commit(self, end: dict[str, int]) -> None:
        pass


class BaselineDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return read_schema_ddl("binary")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return BaselineStreamReader(self.options)  # Spark's options: keys case-insensitive


def register(spark: Any) -> None:
    """``format("rcq_baseline")`` in this session, this module pickled by value for the executors."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(BaselineDataSource)
