"""``RcqDataSource``: the ``rcq`` format of the PySpark Python Data Source API.

Spark builds this object in short-lived planning workers and pickles it; it
only parses options (:mod:`rcq.spark.options`) and hands them to the piece
that does the work: :mod:`rcq.spark.writer` (batch and streaming sinks),
:mod:`rcq.spark.stream_reader` (streaming source), :mod:`rcq.spark.drain`
(batch read). Options are checked here, on the driver, so a bad option fails
``save()``/``load()``/``start()`` before any task runs. The sinks read the queue's placement here
too, once (:mod:`rcq.spark.fragments`: a spread queue's tasks each write into one fragment).

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter

from rcq.spark.options import RcqOptions, parse_options, require_consumer_id, sink_id_of
from rcq.spark.schema import check_writer_schema, read_schema_ddl

FORMAT = "rcq"


class RcqDataSource(DataSource):
    """``spark.dataSource.register(RcqDataSource)``, then ``format("rcq")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _options(self) -> RcqOptions:
        return parse_options(self.options)

    def schema(self) -> str:
        return read_schema_ddl(self._options().value_type)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from rcq.spark.fragments import placement
        from rcq.spark.writer import RcqBatchWriter

        check_writer_schema(schema)
        options = self._options()
        return RcqBatchWriter(options, placement(options))

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        from rcq.spark.fragments import placement
        from rcq.spark.writer import RcqStreamWriter

        check_writer_schema(schema)
        options = self._options()
        return RcqStreamWriter(options, sink_id_of(options, self.options), placement(options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from rcq.spark.stream_reader import RcqStreamReader

        options = self._options()
        return RcqStreamReader(options, require_consumer_id(options))

    def reader(self, schema: Any) -> DataSourceReader:
        from rcq.spark.drain import RcqDrainReader

        return RcqDrainReader(self._options())
