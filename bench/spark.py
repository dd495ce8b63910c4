"""``python -m bench.spark``: rows/s of the rcq Spark sink and source, next to rcq's own bench.

Starts a local 3-node cluster (or uses ``--urls``) and a ``local[2]``
SparkSession, warms both up, then measures, with 100-byte items:

* **batch sink**: ``df.write.format("rcq")`` of ``--rows`` rows, wall time of
  ``save()`` (tasks enqueue, the driver commits once);
* **streaming source**: ``readStream.format("rcq")`` with
  ``trigger(availableNow=True)`` into the ``noop`` sink, draining those rows;
  wall time from ``start()`` to the end of the query;

each with enqueue/dequeue requests of ``--batch-size`` items; then, as the yardstick of what
Spark itself costs, the same streaming read from a source that makes its rows up
(:mod:`bench.spark_baseline`: no network, no rcq, no commit; "Spark alone"); and then
``python -m bench``'s ``enqueue-100`` and ``dequeue-100`` scenarios (separate
callers) on the same cluster. The issue's target: the Spark path reaches at
least 50% of rcq's items/s.

``--standalone`` measures the Spark figures a second time on a Spark standalone
cluster it starts (a master and a worker of ``--partitions`` cores, each its own
JVM: :mod:`bench.spark_standalone`), so the executors run in a JVM of
their own instead of the driver's, and prints both rows side by side.

The fresh cluster requires tokens: Spark reads its admin token from the private file
(option ``tokenFile``, so the token itself is in no Spark option or plan), and the
comparison's clients send it too. With ``--urls``, both take ``$RCQ_TOKEN``.

Must not import: pysyncobj, lmdb, rcq.server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.scenarios import Target, fresh_cluster, run_scenario
from rcq.local.cluster import ADMIN_TOKEN_NAME


def make_spark(master: str, config: dict[str, str] | None = None) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import rcq.spark
    from bench.spark_baseline import register as register_baseline

    builder = (SparkSession.builder.master(master).appName("rcq-spark-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
               .config("spark.sql.streaming.pollingDelay", "100ms"))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    rcq.spark.register(spark)
    register_baseline(spark)
    return spark


def sink_rows_per_s(spark: Any, urls: str, queue: str, rows: int, partitions: int, batch_size: int,
                    options: dict[str, str]) -> float:
    df = spark.range(0, rows, 1, partitions).selectExpr("repeat('x', 100) AS value")
    started = time.perf_counter()
    df.write.format("rcq").option("url", urls).option("queue", queue).option("batchSize", batch_size) \
        .options(**options).mode("append").save()
    return rows / (time.perf_counter() - started)


def source_rows_per_s(spark: Any, urls: str, queue: str, rows: int, partitions: int, batch_size: int,
                      per_partition: int, checkpoint: Path, options: dict[str, str], fmt: str = "rcq") -> float:
    """``fmt``: ``rcq``, or ``rcq_baseline`` (:mod:`bench.spark_baseline`: the same rows made up, no I/O)."""
    stream = (spark.readStream.format(fmt).option("url", urls).option("queue", queue)
              .option("consumerId", f"bench-{uuid.uuid4().hex[:8]}").option("batchSize", batch_size)
              .option("numPartitions", partitions).option("maxItemsPerPartition", per_partition)
              .option("rows", rows).options(**options).load())
    started = time.perf_counter()
    query = (stream.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    if not query.awaitTermination(900):
        query.stop()
        raise TimeoutError("the streaming read did not finish within 900 s")
    elapsed = time.perf_counter() - started
    read = sum(int(p["numInputRows"]) for p in query.recentProgress)
    batches_s = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in query.recentProgress) / 1000
    print(f"  streaming read ({fmt}): {len(query.recentProgress)} micro-batches, {batches_s:.1f} s of {elapsed:.1f} s "
          f"inside them ({read / max(batches_s, 1e-9):.0f} rows/s without the query's start-up)", flush=True)
    if read < rows:
        raise RuntimeError(f"the streaming read saw {read} of {rows} rows")
    return read / elapsed


async def rcq_bench(target: Target, concurrency: int, duration_s: float) -> dict[str, float]:
    async with target.client() as client:
        await client.wait_for_leader(60)
    figures = {}
    for name in ("enqueue-100", "dequeue-100"):
        result = await run_scenario(target, name, "separate", concurrency, duration_s, 200.0)
        figures[name] = result.items_per_s
    return figures


def spark_figures(spark: Any, urls: str, args: argparse.Namespace, options: dict[str, str],
                  temp: Path) -> dict[str, float]:
    """Warm this session up (its executors are new JVMs and Python workers), then measure."""
    from bench.spark_baseline import FORMAT as BASELINE_FORMAT
    warm = f"bench-warm-{uuid.uuid4().hex[:8]}"
    sink_rows_per_s(spark, urls, warm, 2000, args.partitions, args.batch_size, options)
    source_rows_per_s(spark, urls, warm, 2000, args.partitions, args.batch_size, 1000, temp / f"w-{warm}", options)
    source_rows_per_s(spark, urls, warm, 2000, args.partitions, args.batch_size, 1000, temp / f"wb-{warm}", {},
                      fmt=BASELINE_FORMAT)
    queue = f"bench-spark-{uuid.uuid4().hex[:8]}"
    figures = {"spark_sink_rows_per_s": sink_rows_per_s(spark, urls, queue, args.rows, args.partitions,
                                                         args.batch_size, options)}
    print(f"batch sink:        {figures['spark_sink_rows_per_s']:10.0f} rows/s", flush=True)
    figures["spark_source_rows_per_s"] = source_rows_per_s(
        spark, urls, queue, args.rows, args.partitions, args.batch_size, args.items_per_partition,
        temp / f"checkpoint-{queue}", options)
    print(f"streaming source:  {figures['spark_source_rows_per_s']:10.0f} rows/s", flush=True)
    figures["spark_baseline_rows_per_s"] = source_rows_per_s(
        spark, urls, queue, args.rows, args.partitions, args.batch_size, args.items_per_partition,
        temp / f"checkpoint-baseline-{queue}", {}, fmt=BASELINE_FORMAT)
    print(f"Spark alone:       {figures['spark_baseline_rows_per_s']:10.0f} rows/s (a source that reads nothing)",
          flush=True)
    return figures


def print_modes(by_mode: dict[str, dict[str, float]], rcq_figures: dict[str, float]) -> None:
    """One row per Spark mode: rows/s and the share of rcq's own items/s."""
    width = max(len("Spark mode"), *(len(mode) for mode in by_mode))
    print(f"\n{'Spark mode':<{width}}  {'batch sink rows/s':>24}  {'streaming source rows/s':>24}  "
          f"{'Spark alone (no I/O) rows/s':>28}")
    for mode, figures in by_mode.items():
        sink = figures["spark_sink_rows_per_s"]
        source = figures["spark_source_rows_per_s"]
        alone = figures["spark_baseline_rows_per_s"]
        sink_share = sink / max(rcq_figures["enqueue-100"], 1e-9)
        source_share = source / max(rcq_figures["dequeue-100"], 1e-9)
        alone_share = alone / max(rcq_figures["dequeue-100"], 1e-9)
        print(f"{mode:<{width}}  {f'{sink:,.0f} ({sink_share:.0%})':>24}  {f'{source:,.0f} ({source_share:.0%})':>24}  "
              f"{f'{alone:,.0f} ({alone_share:.0%})':>28}")
    print(f"{'rcq bench, 100-item requests':<{width}}  {rcq_figures['enqueue-100']:>24,.0f}  "
          f"{rcq_figures['dequeue-100']:>24,.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", help="comma-separated node URLs of a running cluster (default: start one)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=100, help="items per enqueue/dequeue request")
    parser.add_argument("--partitions", type=int, default=2, help="Spark tasks writing / reading per batch")
    parser.add_argument("--items-per-partition", type=int, default=10_000, help="streaming: per task per micro-batch")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--standalone", action="store_true",
                        help="also measure on a Spark standalone cluster it starts (a master and a worker JVM with "
                             "--partitions cores), next to --master")
    parser.add_argument("--rcq-concurrency", type=int, default=32, help="callers of the rcq bench comparison")
    parser.add_argument("--rcq-duration-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    cluster = None if args.urls else fresh_cluster(3)
    urls = ",".join(cluster.urls) if cluster is not None else args.urls
    target = Target.of(cluster) if cluster is not None else Target.from_environment(urls.split(","))
    # Spark's own options for the cluster: its admin token by the file that holds it ($RCQ_TOKEN with --urls)
    options = {"tokenFile": str(cluster.base_dir / ADMIN_TOKEN_NAME)} if cluster is not None else {}
    config = {"rows": args.rows, "item_bytes": 100, "batch_size": args.batch_size, "partitions": args.partitions,
              "items_per_partition": args.items_per_partition, "master": args.master, "standalone": args.standalone,
              "nodes": len(urls.split(",")), "cpus": os.cpu_count(), "python": platform.python_version(),
              "load_average": os.getloadavg()[0], "rcq_concurrency": args.rcq_concurrency}
    print("configuration:", json.dumps(config), flush=True)
    by_mode: dict[str, dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="rcq-spark-bench-") as temp, contextlib.ExitStack() as stack:
            modes: list[tuple[str, str, dict[str, str]]] = [(args.master, args.master, {})]
            if args.standalone:  # started first: a cluster that cannot start fails the run before minutes of work
                from bench.spark_standalone import SparkStandalone

                standalone = stack.enter_context(SparkStandalone(cores=args.partitions, memory="1g"))
                modes.append((f"standalone (1 worker, {args.partitions} cores)", standalone.master_url,
                              standalone.session_config()))
            for mode, master, spark_config in modes:
                print(f"Spark on {mode}:", flush=True)
                spark = make_spark(master, spark_config)
                try:
                    by_mode[mode] = spark_figures(spark, urls, args, options, Path(temp))
                finally:
                    spark.stop()
        rcq_figures = asyncio.run(rcq_bench(target, args.rcq_concurrency, args.rcq_duration_s))
    finally:
        if cluster is not None:
            cluster.close()
    figures = {**by_mode[args.master], "rcq_enqueue_100_items_per_s": rcq_figures["enqueue-100"],
               "rcq_dequeue_100_items_per_s": rcq_figures["dequeue-100"]}
    print_modes(by_mode, rcq_figures)
    shares = [f[key] / max(rcq_figures[name], 1e-9) for f in by_mode.values()
              for key, name in (("spark_sink_rows_per_s", "enqueue-100"), ("spark_source_rows_per_s", "dequeue-100"))]
    print("target (>= 50% of rcq's items/s in every mode):", "met" if min(shares) >= 0.5 else "NOT met")
    if args.json:
        args.json.write_text(json.dumps({"config": config, "figures": figures, "modes": by_mode}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
