"""``rcq_faulty``: the rcq data source with injected task failures, for the tests only.

Options on top of rcq's: ``failPartition`` (which partition fails; default 0),
``failAttempts`` (attempts 0 .. n-1 of it fail; default 1, so the retry
succeeds), ``failBatch`` (streaming reads: only this micro-batch fails).
A writer task fails after handing every row to the real writer, so most of
them are already enqueued; a reader task fails after yielding its first
rows, so its items are already dequeued.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext

from rcq.spark.source import RcqDataSource
from rcq.spark.stream_reader import RcqStreamReader
from rcq.spark.writer import RcqBatchWriter


class InjectedFailure(RuntimeError):
    pass


def _should_fail(options: dict[str, str]) -> bool:
    context = TaskContext.get()
    assert context is not None
    if context.partitionId() != int(options.get("failpartition", "0")):
        return False
    batch = options.get("failbatch")
    if batch is not None and context.getLocalProperty("streaming.sql.batchId") != batch:
        return False
    return context.attemptNumber() < int(options.get("failattempts", "1"))


class FaultyBatchWriter(RcqBatchWriter):
    def __init__(self, options: Any, raw: dict[str, str]) -> None:
        super().__init__(options)
        self.raw = raw

    def write(self, iterator: Iterator[Any]) -> Any:
        def rows() -> Iterator[Any]:
            yield from iterator
            if _should_fail(self.raw):
                raise InjectedFailure("injected writer failure after every row was handed over")

        return super().write(rows())


class FaultyStreamReader(RcqStreamReader):
    def __init__(self, options: Any, consumer_id: str, raw: dict[str, str]) -> None:
        super().__init__(options, consumer_id)
        self.raw = raw

    def read(self, partition: Any) -> Iterator[Any]:
        fail = _should_fail(self.raw)
        for number, batch in enumerate(super().read(partition)):
            yield batch
            if fail and number == 0:
                raise InjectedFailure("injected reader failure after the first rows")
        if fail:
            raise InjectedFailure("injected reader failure after an empty read")


class FaultyRcqDataSource(RcqDataSource):
    @classmethod
    def name(cls) -> str:
        return "rcq_faulty"

    def writer(self, schema: Any, overwrite: bool) -> Any:
        writer = super().writer(schema, overwrite)
        return FaultyBatchWriter(writer.options, dict(self.options))

    def streamReader(self, schema: Any) -> Any:
        reader = super().streamReader(schema)
        return FaultyStreamReader(reader.options, reader.consumer_id, dict(self.options))
