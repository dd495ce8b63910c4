"""An rcq data pipeline on Spark: a CSV dataset -> an rcq queue -> a streaming job -> Parquet.

    python examples/spark_pipeline.py                         # starts its own local 3-node cluster
    RCQ_TOKEN=... python examples/spark_pipeline.py --urls http://127.0.0.1:7001,http://127.0.0.1:7002 --rows 50000

1. generates ``orders.csv`` (``--rows`` rows) in a work directory;
2. a **batch job** reads it and enqueues one JSON item per row into a queue
   (exactly once: every row is one item, even if a task is retried);
3. a **streaming job** (``trigger(availableNow=True)``) reads the queue, parses
   the JSON and appends Parquet files; the queue items are committed only after
   Spark has recorded each micro-batch (at least once, nothing lost);
4. prints counts proving that every order arrived once: nothing lost, nothing
   duplicated.

Its own cluster requires tokens, as a production one does: the jobs read its admin token
from the private file that holds it (option ``tokenFile``), so the token is in no Spark option
or plan. With ``--urls``, the jobs send ``$RCQ_TOKEN`` (the connector reads it on the driver).

Needs Java 17+ and ``pip install 'rcq[spark]'``.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ORDER_SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE"


def make_spark() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("rcq-spark-pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def generate_orders(path: Path, rows: int, seed: int = 7) -> None:
    generator = random.Random(seed)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["order_id", "customer", "amount"])
        for order_id in range(rows):
            writer.writerow([order_id, f"customer-{generator.randrange(1000)}", round(generator.uniform(1, 500), 2)])


def run_pipeline(spark: Any, urls: str, work_dir: Path, rows: int,
                 options: Mapping[str, str] | None = None) -> dict[str, int]:
    """``options``: more rcq options for both jobs (``token``, ``tokenFile``, ``caFile``)."""
    import rcq.spark

    rcq.spark.register(spark)
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    csv_path, out, checkpoint = work_dir / "orders.csv", work_dir / "orders.parquet", work_dir / "checkpoint"
    generate_orders(csv_path, rows)

    # Batch job: CSV rows -> one JSON item each.
    orders = spark.read.option("header", True).schema(ORDER_SCHEMA).csv(str(csv_path))
    (orders.selectExpr("to_json(struct(*)) AS value")
     .write.format("rcq").option("url", urls).option("queue", queue).options(**(options or {})).mode("append")
     .save())

    # Streaming job: the queue -> parsed orders -> Parquet.
    stream = (spark.readStream.format("rcq").option("url", urls).option("queue", queue)
              .option("consumerId", f"pipeline-{queue}").option("valueType", "string")
              .option("maxItemsPerPartition", "5000").options(**(options or {})).load())
    parsed = stream.selectExpr(f"from_json(value, '{ORDER_SCHEMA}') AS order").select("order.*")
    query = (parsed.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    if not query.awaitTermination(600):
        query.stop()
        raise TimeoutError("the streaming job did not finish within 600 s")

    result = spark.read.parquet(str(out))
    counts = {
        "csv_rows": orders.count(),
        "parquet_rows": result.count(),
        "distinct_orders": result.select("order_id").distinct().count(),
        "duplicated_orders": result.groupBy("order_id").count().where("count > 1").count(),
    }
    counts["lost_orders"] = counts["csv_rows"] - counts["distinct_orders"]
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", help="comma-separated rcq node URLs (default: start a local 3-node cluster)")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--work-dir", type=Path, help="where the CSV, Parquet and checkpoint go (default: a temp dir)")
    args = parser.parse_args(argv)

    cluster = None
    options: dict[str, str] = {}
    if args.urls is None:
        from rcq.testing.cluster import ADMIN_TOKEN_NAME, LocalCluster

        cluster = LocalCluster(nodes=3)
        cluster.start()
        cluster.wait_for_leader(60)
        options["tokenFile"] = str(cluster.base_dir / ADMIN_TOKEN_NAME)
        print(f"started a local 3-node rcq cluster: {','.join(cluster.urls)}")
    try:
        urls = args.urls or ",".join(cluster.urls)  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory(prefix="rcq-spark-pipeline-") as temp:
            work_dir = args.work_dir or Path(temp)
            work_dir.mkdir(parents=True, exist_ok=True)
            spark = make_spark()
            try:
                counts = run_pipeline(spark, urls, work_dir, args.rows, options)
            finally:
                spark.stop()
    finally:
        if cluster is not None:
            cluster.close()
    for key, value in counts.items():
        print(f"{key:>18}: {value}")
    ok = counts["lost_orders"] == 0 and counts["duplicated_orders"] == 0
    print("OK: every order arrived exactly once" if ok else "FAILED: orders were lost or duplicated")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
