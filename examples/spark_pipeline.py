"""An rcq data pipeline on Spark: a CSV dataset -> an rcq queue -> a streaming job -> Parquet.

    python examples/spark_pipeline.py                         # starts its own local 3-node cluster
    RCQ_TOKEN=... python examples/spark_pipeline.py --urls http://127.0.0.1:7001,http://127.0.0.1:7002 --rows 50000
    python examples/spark_pipeline.py --standalone --kill-executor   # on a Spark standalone cluster it starts

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

Spark runs in ``local[2]`` (driver and executors in this process's JVM) unless told otherwise:
``--standalone`` starts a Spark standalone cluster from the pyspark package (a master and a
worker, each its own JVM, on 127.0.0.1: :mod:`bench.spark_standalone` of the checkout) and runs both jobs
on its executor; ``--kill-executor`` then SIGKILLs that executor once the streaming job has
finished its first micro-batch, and the counts show that the worker's replacement carried on
with nothing lost or duplicated. ``--master spark://host:port`` uses a cluster of yours (its
workers need this Python with rcq installed: ``spark.pyspark.python``).

Needs Java 17+ and ``pip install 'rcq[spark]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import random
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ORDER_SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE"
KILL_WAIT_S = 300.0  # for the first micro-batch, and for the worker's replacement executor
BATCH_WRITE_ATTEMPTS = 3


def make_spark(master: str = "local[2]", config: Mapping[str, str] | None = None) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("rcq-spark-pipeline")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.pyspark.python", sys.executable))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
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
                 options: Mapping[str, str] | None = None, items_per_partition: int = 5000,
                 during_stream: Callable[[Any], None] | None = None) -> dict[str, int]:
    """``options``: more rcq options for both jobs (``token``, ``tokenFile``, ``caFile``);
    ``items_per_partition``: per reader task per micro-batch (2 tasks); ``during_stream(query)``
    runs once the streaming job has started (it finishes on its own)."""
    import rcq.spark

    rcq.spark.register(spark)
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    csv_path, out, checkpoint = work_dir / "orders.csv", work_dir / "orders.parquet", work_dir / "checkpoint"
    generate_orders(csv_path, rows)

    # Batch job: CSV rows -> one JSON item each.
    orders = spark.read.option("header", True).schema(ORDER_SCHEMA).csv(str(csv_path))
    write_again_after_a_failover(lambda: (
        orders.selectExpr("to_json(struct(*)) AS value")
        .write.format("rcq").option("url", urls).option("queue", queue).options(**(options or {})).mode("append")
        .save()))

    # Streaming job: the queue -> parsed orders -> Parquet.
    stream = (spark.readStream.format("rcq").option("url", urls).option("queue", queue)
              .option("consumerId", f"pipeline-{queue}").option("valueType", "string")
              .option("maxItemsPerPartition", str(items_per_partition)).options(**(options or {})).load())
    parsed = stream.selectExpr(f"from_json(value, '{ORDER_SCHEMA}') AS order").select("order.*")
    query = (parsed.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    if during_stream is not None:
        try:
            during_stream(query)
        except BaseException:
            query.stop()
            raise
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


def write_again_after_a_failover(write: Callable[[], None], attempts: int = BATCH_WRITE_ATTEMPTS) -> None:
    """Run a batch write into rcq, again when it failed with ``rcq leader_changed``: the tasks'
    transactions lived on a leader that lost leadership before the job's commit, so they were
    aborted and nothing of the write was committed — running it again adds every row once."""
    for attempt in range(1, attempts + 1):
        try:
            write()
            return
        except Exception as exc:
            if "rcq leader_changed" not in str(exc) or attempt == attempts:
                raise
            print(f"the batch write met a leader change before its commit (nothing committed); attempt {attempt + 1}",
                  file=sys.stderr)


def kill_executor_after_first_batch(standalone: Any, spark: Any) -> Callable[[Any], None]:
    """``during_stream``: once the query has finished a micro-batch that read rows, SIGKILL the
    application's executor and wait for the worker to start its replacement; says what it did."""
    from rcq.local.polls import deadline_loop

    def during(query: Any) -> None:
        app_id = spark.sparkContext.applicationId
        for _ in deadline_loop(KILL_WAIT_S, 0.1):
            done = [p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0]
            if done or not query.isActive:
                break
        else:
            raise TimeoutError(f"the streaming job finished no micro-batch within {KILL_WAIT_S} s")
        victims = standalone.executors(app_id)
        if not query.isActive or not victims:
            print("the streaming job was over before an executor could be killed: use more --rows")
            return
        standalone.kill_executor(victims[0])
        replacement = standalone.wait_for_executor(app_id, exclude={victims[0].pid}, timeout_s=KILL_WAIT_S)
        print(f"killed executor {victims[0].executor_id} (pid {victims[0].pid}, SIGKILL) after micro-batch {done[-1]}; "
              f"the worker started executor {replacement.executor_id} (pid {replacement.pid})", flush=True)

    return during


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", help="comma-separated rcq node URLs (default: start a local 3-node cluster)")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--work-dir", type=Path, help="where the CSV, Parquet and checkpoint go (default: a temp dir)")
    spark_where = parser.add_mutually_exclusive_group()
    spark_where.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    spark_where.add_argument("--standalone", action="store_true",
                             help="start a Spark standalone cluster (a master and a worker JVM) and run on it")
    parser.add_argument("--kill-executor", action="store_true",
                        help="with --standalone: SIGKILL the executor after the stream's first micro-batch")
    args = parser.parse_args(argv)
    if args.kill_executor and not args.standalone:
        parser.error("--kill-executor needs --standalone (it kills an executor of the cluster it started)")

    cluster = None
    options: dict[str, str] = {}
    if args.urls is None:
        from rcq.local.cluster import ADMIN_TOKEN_NAME, LocalCluster

        cluster = LocalCluster(nodes=3)
        options["tokenFile"] = str(cluster.base_dir / ADMIN_TOKEN_NAME)
    try:
        if cluster is not None:
            cluster.start()
            cluster.wait_for_leader(60)
            print(f"started a local 3-node rcq cluster: {','.join(cluster.urls)}")
        urls = args.urls or ",".join(cluster.urls)  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory(prefix="rcq-spark-pipeline-") as temp, contextlib.ExitStack() as stack:
            work_dir = args.work_dir or Path(temp)
            work_dir.mkdir(parents=True, exist_ok=True)
            standalone = None
            if args.standalone:
                sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench is not installed
                from bench.spark_standalone import SparkStandalone

                standalone = stack.enter_context(SparkStandalone(cores=2, memory="1g"))
                print(f"started a Spark standalone cluster: {standalone.master_url} (1 worker, 2 cores)")
                spark = make_spark(standalone.master_url, standalone.session_config())
            else:
                spark = make_spark(args.master)
            stack.callback(spark.stop)  # before the standalone cluster stops: its application ends first
            during = kill_executor_after_first_batch(standalone, spark) if args.kill_executor else None
            # Killing needs a stream of several micro-batches: about 10 of them.
            per_partition = max(100, args.rows // 20) if args.kill_executor else 5000
            counts = run_pipeline(spark, urls, work_dir, args.rows, options, per_partition, during)
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
