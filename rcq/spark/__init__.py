"""rcq on Spark: the ``rcq`` data source of the PySpark Python Data Source API (pyspark >= 4.1, pyarrow).

::

    import rcq.spark
    rcq.spark.register(spark)
    df.write.format("rcq").option("url", urls).option("queue", "in").mode("append").save()
    stream = spark.readStream.format("rcq").option("url", urls).option("queue", "in") \\
        .option("consumerId", "etl-1").load()
    with rcq.spark.drain(spark, urls, "in", max_items=1000) as df: ...

The queue features of docs/queue-features.md: rows read carry ``delivery_count``, ``priority``,
``enqueued_at``, ``expires_at``, ``headers`` (a string map, empty when none) and, from a dead-letter
queue, ``dead_letter_reason``/``dead_letter_source``; a sink enqueues each row with its integer
``priority`` column and its ``headers`` map column (if any) and every item with options
``delayS``/``ttlS`` (see :mod:`rcq.spark.schema`, :mod:`rcq.spark.headers` and :mod:`rcq.spark.options`).

Nodes that require tokens take the token from option ``tokenFile`` (a private file on the
driver), option ``token``, or else the driver's ``$RCQ_TOKEN``; option ``caFile`` verifies HTTPS
nodes against a private CA. Both are read once, on the driver, and travel to the executors in
the options (see :mod:`rcq.spark.options`).

Install with ``pip install 'rcq[spark]'``. The guarantees, options and schema
are in :mod:`rcq.spark.source` and the modules it names.
"""

from __future__ import annotations

from typing import Any

from rcq.spark.drain import drain
from rcq.spark.options import RcqOptionError
from rcq.spark.remote import RcqSparkError
from rcq.spark.source import FORMAT, RcqDataSource

__all__ = ["FORMAT", "RcqDataSource", "RcqOptionError", "RcqSparkError", "drain", "register"]


def register(spark: Any) -> None:
    """Make ``format("rcq")`` available in this SparkSession."""
    spark.dataSource.register(RcqDataSource)
