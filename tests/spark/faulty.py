"""``rcq_faulty``: the rcq data source with injected task failures, for the tests only.

Options on top of rcq's: ``failPartition`` (which partition fails; default 0),
``failAttempts`` (attempts 0 .. n-1 of it fail; default 1, so the retry
succeeds), ``failBatch`` (streaming reads: only this micro-batch fails).
A writer task fails after handing every row to the real writer, so most of
them are already enqueued; a reader task fails after yielding its first
rows, so its items are already dequeued.

``failCommitOfBatch`` (the stream sink on a spread queue): that micro-batch's commit commits the
first partition's transactions alone, then fails, as a driver dying between the partitions'
commits would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext

from rcq.spark.fragments import by_partition
from rcq.spark.source import RcqDataSource
from rcq.spark.stream_reader import RcqStreamReader
from rcq.spark.writer import RcqBatchWriter, RcqStreamWriter, commit_by_partition, transaction_ids


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
    def __init__(self, options: Any, raw: dict[str, str], fragments: Any) -> None:
        super().__init__(options, fragments)
        self.raw = raw

    def write(self, iterator: Iterator[Any]) -> Any:
        def rows() -> Iterator[Any]:
            yield from iterator
            if _should_fail(self.raw):
                raise InjectedFailure("injected writer failure after every row was handed over")

        return super().write(rows())


class FaultyStreamWriter(RcqStreamWriter):
    def __init__(self, options: Any, sink_id: str, fragments: Any, raw: dict[str, str]) -> None:
        super().__init__(options, sink_id, fragments)
        self.raw = raw

    def commit(self, messages: list[Any], batchId: int) -> None:
        if str(batchId) != self.raw.get("failcommitofbatch"):
            super().commit(messages, batchId)
            return
        first, *_ = by_partition(transaction_ids(messages)).items()
        commit_by_partition(self.options, dict([first]), f"{self.sink_id}:{batchId}")
        raise InjectedFailure(f"injected driver failure after committing partition {first[0]} of batch {batchId}")


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
        return FaultyBatchWriter(writer.options, dict(self.options), writer.fragments)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        writer = super().streamWriter(schema, overwrite)
        return FaultyStreamWriter(writer.options, writer.sink_id, writer.fragments, dict(self.options))

    def streamReader(self, schema: Any) -> Any:
        reader = super().streamReader(schema)
        return FaultyStreamReader(reader.options, reader.consumer_id, dict(self.options))
