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

``--spread N`` measures on a **spread queue** (docs/partitions.md, "Spread queues"): the fresh
cluster gets partitions p0 .. p{N-1} and every queue of the bench is spread over them, so the
sink's tasks each write into one fragment and commit per partition, and the source reads every
fragment (``ceil(--partitions / N)`` tasks per fragment; Spark alone gets as many tasks, so the
two queries keep the same shape). rcq's own figures are then measured on a spread queue too
(one-request enqueues of 100 items going round the fragments; transactions dequeuing 100 that
start in the next fragment in turn) and printed next to the plain ``enqueue-100``/``dequeue-100``,
which stay the yardstick of the targets.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cpu import local_pids
from bench.machine_cpu import measured
from bench.partitions import spread_leaders
from bench.scenarios import (
    Target,
    dequeue_hundred,
    enqueue_hundred,
    fresh_cluster,
    prefill,
    run_scenario,
)
from rcq.client import RcqClient
from rcq.local.cluster import ADMIN_TOKEN_NAME, LocalCluster
from rcq.spark.fragments import reader_fragments


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
                    options: dict[str, str], server_pids: Callable[[], list[int]] = list) -> float:
    df = spark.range(0, rows, 1, partitions).selectExpr("repeat('x', 100) AS value")
    with measured(server_pids) as cpu:
        df.write.format("rcq").option("url", urls).option("queue", queue).option("batchSize", batch_size) \
            .options(**options).mode("append").save()
    print(f"  batch sink: {cpu.line(rows)}", flush=True)
    return rows / cpu.wall_s


def source_rows_per_s(spark: Any, urls: str, queue: str, rows: int, partitions: int, batch_size: int,
                      per_partition: int, checkpoint: Path, options: dict[str, str], fmt: str = "rcq",
                      server_pids: Callable[[], list[int]] = list) -> float:
    """``fmt``: ``rcq``, or ``rcq_baseline`` (:mod:`bench.spark_baseline`: the same rows made up, no I/O)."""
    stream = (spark.readStream.format(fmt).option("url", urls).option("queue", queue)
              .option("consumerId", f"bench-{uuid.uuid4().hex[:8]}").option("batchSize", batch_size)
              .option("numPartitions", partitions).option("maxItemsPerPartition", per_partition)
              .option("rows", rows).options(**options).load())
    with measured(server_pids) as cpu:
        query = (stream.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        if not query.awaitTermination(900):
            query.stop()
            raise TimeoutError("the streaming read did not finish within 900 s")
    elapsed = cpu.wall_s
    read = sum(int(p["numInputRows"]) for p in query.recentProgress)
    batches_s = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in query.recentProgress) / 1000
    print(f"  streaming read ({fmt}): {len(query.recentProgress)} micro-batches, {batches_s:.1f} s of {elapsed:.1f} s "
          f"inside them ({read / max(batches_s, 1e-9):.0f} rows/s without the query's start-up)", flush=True)
    print(f"  streaming read ({fmt}): {cpu.line(read)}", flush=True)
    if read < rows:
        raise RuntimeError(f"the streaming read saw {read} of {rows} rows")
    return read / elapsed


async def rcq_bench(target: Target, concurrency: int, duration_s: float, spread: list[str] | None = None) -> dict[str, float]:
    async with target.client() as client:
        await client.wait_for_leader(60)
    figures = {}
    for name in ("enqueue-100", "dequeue-100"):
        result = await run_scenario(target, name, "separate", concurrency, duration_s, 200.0)
        figures[name] = result.items_per_s
    if spread:
        figures.update(await spread_rcq_bench(target, spread, concurrency, duration_s))
    return figures


async def make_spread(target: Target, queue: str, spread: list[str] | None) -> None:
    """Create ``queue`` spread over ``spread`` (nothing for a plain queue: a first enqueue makes it)."""
    if spread:
        async with target.client() as client:
            await client.configure_queue(queue, partitions=spread)


async def spread_rcq_bench(target: Target, spread: list[str], concurrency: int, duration_s: float) -> dict[str, float]:
    """rcq's own items/s on a spread queue: ``enqueue-100`` (one-request enqueues, each client's turn
    round the fragments) and ``dequeue-100`` (transactions of 100 dequeued, each in the next fragment
    in turn), ``concurrency`` callers with a client each."""

    figures = {}
    for name, operation, items in (("spread-enqueue-100", enqueue_hundred, 0),
                                   ("spread-dequeue-100", dequeue_hundred, 150_000)):
        queue = f"bench-{name}-{uuid.uuid4().hex[:8]}"
        await make_spread(target, queue, spread)
        if items:
            await prefill(target, queue, items)
        clients = [target.client() for _ in range(concurrency)]
        moved = 0

        async def caller(client: RcqClient, stop_at: float, operation: Any = operation, queue: str = queue) -> None:
            nonlocal moved
            while time.monotonic() < stop_at:
                done = await operation(client, queue)  # not `moved += await ...`: it reads moved before
                moved += done  # the await, and concurrent callers' counts would be lost

        try:
            started = time.monotonic()
            await asyncio.gather(*(caller(c, started + duration_s) for c in clients))
            figures[name] = moved / (time.monotonic() - started)
        finally:
            for client in clients:
                await client.close()
    return figures


def spark_figures(spark: Any, urls: str, args: argparse.Namespace, options: dict[str, str],
                  temp: Path, target: Target, server_pids: Callable[[], list[int]] = list) -> dict[str, float]:
    """Warm this session up (its executors are new JVMs and Python workers), then measure."""
    from bench.spark_baseline import FORMAT as BASELINE_FORMAT
    spread = spread_partitions(args)
    # Spark alone reads with as many tasks as the rcq source has (a spread queue: a multiple of its fragments)
    baseline_tasks = len(reader_fragments(tuple(spread) if spread else None, args.partitions))
    warm = f"bench-warm-{uuid.uuid4().hex[:8]}"
    asyncio.run(make_spread(target, warm, spread))
    sink_rows_per_s(spark, urls, warm, 2000, args.partitions, args.batch_size, options)
    source_rows_per_s(spark, urls, warm, 2000, args.partitions, args.batch_size, 1000, temp / f"w-{warm}", options)
    source_rows_per_s(spark, urls, warm, 2000, baseline_tasks, args.batch_size, 1000, temp / f"wb-{warm}", {},
                      fmt=BASELINE_FORMAT)
    queue = f"bench-spark-{uuid.uuid4().hex[:8]}"
    asyncio.run(make_spread(target, queue, spread))
    figures = {"spark_sink_rows_per_s": sink_rows_per_s(spark, urls, queue, args.rows, args.partitions,
                                                         args.batch_size, options, server_pids)}
    print(f"batch sink:        {figures['spark_sink_rows_per_s']:10.0f} rows/s", flush=True)
    if spread:
        print(f"  the sink's rows by fragment: {asyncio.run(fragment_counts(target, queue))}", flush=True)
    figures["spark_source_rows_per_s"] = source_rows_per_s(
        spark, urls, queue, args.rows, args.partitions, args.batch_size, args.items_per_partition,
        temp / f"checkpoint-{queue}", options, server_pids=server_pids)
    print(f"streaming source:  {figures['spark_source_rows_per_s']:10.0f} rows/s", flush=True)
    figures["spark_baseline_rows_per_s"] = source_rows_per_s(
        spark, urls, queue, args.rows, baseline_tasks, args.batch_size, args.items_per_partition,
        temp / f"checkpoint-baseline-{queue}", {}, fmt=BASELINE_FORMAT, server_pids=server_pids)
    print(f"Spark alone:       {figures['spark_baseline_rows_per_s']:10.0f} rows/s (a source that reads nothing)",
          flush=True)
    return figures


async def fragment_counts(target: Target, queue: str) -> dict[str, int]:
    async with target.client() as client:
        info = await client.queue_info(queue)
    return {p: int(row["count"]) for p, row in (info.get("by_partition") or {}).items()}


def server_pids(cluster: LocalCluster | None, urls: str) -> list[int]:
    """rcq's server processes on this machine: each node's and its partitions' (``--urls``: the
    processes listening on the nodes' ports, partition processes not found)."""
    if cluster is None:
        return list(local_pids(urls.split(",")).values())
    pids = list(cluster.pids().values())
    for i in range(len(cluster.nodes)):
        with contextlib.suppress(OSError, ValueError):
            pids += [pid for name, pid in cluster.partition_processes(i).items() if name != "p0"]
    return sorted(set(pids))


def spread_partitions(args: argparse.Namespace) -> list[str] | None:
    return [f"p{i}" for i in range(args.spread)] if args.spread > 1 else None


def spread_cluster(partitions: int) -> LocalCluster:
    """A fresh 3-node cluster (as :func:`bench.scenarios.fresh_cluster`) with partitions p0 .. p{partitions-1}."""
    # leaders placed by hand, each partition's on a node of its own: the balancer left off, so none moves (and
    # aborts the open transactions of a write) while the bench runs
    cluster = LocalCluster(3, log_level="WARNING", node_overrides={"durability": "fsync", "balance_leaders": False},
                           partitions_max=partitions - 1)
    try:
        cluster.start()
        cluster.wait_for_leader(60)
        cluster.ensure_partitions(partitions, 180)
        if partitions <= 3:  # one a node
            leaders = asyncio.run(spread_leaders(Target.of(cluster), [f"p{i}" for i in range(partitions)]))
            print("partition leaders:", leaders, flush=True)
    except BaseException:
        cluster.close()
        raise
    return cluster


def yardsticks(rcq_figures: dict[str, float]) -> tuple[float, float]:
    """rcq's own enqueue and dequeue items/s the Spark figures are set against: the plain queue's
    ``enqueue-100``/``dequeue-100``, also with ``--spread`` (the spread queue's one-request figures
    are printed beside them, but they measure the client's round of the fragments, not the
    transactions the connector uses)."""
    return rcq_figures["enqueue-100"], rcq_figures["dequeue-100"]


def print_modes(by_mode: dict[str, dict[str, float]], rcq_figures: dict[str, float]) -> None:
    """One row per Spark mode: rows/s and the share of rcq's own items/s (and the source's of Spark alone)."""
    enqueue_yardstick, dequeue_yardstick = yardsticks(rcq_figures)
    width = max(len("Spark mode"), len("rcq bench, spread queue, 100-item requests"), *(len(mode) for mode in by_mode))
    print(f"\n{'Spark mode':<{width}}  {'batch sink rows/s':>24}  {'streaming source rows/s':>24}  "
          f"{'Spark alone (no I/O) rows/s':>28}")
    for mode, figures in by_mode.items():
        sink = figures["spark_sink_rows_per_s"]
        source = figures["spark_source_rows_per_s"]
        alone = figures["spark_baseline_rows_per_s"]
        sink_share = sink / max(enqueue_yardstick, 1e-9)
        source_share = source / max(dequeue_yardstick, 1e-9)
        alone_share = alone / max(dequeue_yardstick, 1e-9)
        print(f"{mode:<{width}}  {f'{sink:,.0f} ({sink_share:.0%})':>24}  {f'{source:,.0f} ({source_share:.0%})':>24}  "
              f"{f'{alone:,.0f} ({alone_share:.0%})':>28}   source / Spark alone: {source / max(alone, 1e-9):.0%}")
    print(f"{'rcq bench, 100-item requests':<{width}}  {rcq_figures['enqueue-100']:>24,.0f}  "
          f"{rcq_figures['dequeue-100']:>24,.0f}")
    if "spread-enqueue-100" in rcq_figures:
        print(f"{'rcq bench, spread queue, 100-item requests':<{width}}  {rcq_figures['spread-enqueue-100']:>24,.0f}  "
              f"{rcq_figures['spread-dequeue-100']:>24,.0f}")


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
    parser.add_argument("--spread", type=int, default=0, metavar="N",
                        help="spread every queue over partitions p0 .. p{N-1} (a fresh cluster gets them; with --urls "
                             "they must exist)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    cluster = None if args.urls else (spread_cluster(args.spread) if args.spread > 1 else fresh_cluster(3))
    urls = ",".join(cluster.urls) if cluster is not None else args.urls
    target = Target.of(cluster) if cluster is not None else Target.from_environment(urls.split(","))
    # Spark's own options for the cluster: its admin token by the file that holds it ($RCQ_TOKEN with --urls)
    options = {"tokenFile": str(cluster.base_dir / ADMIN_TOKEN_NAME)} if cluster is not None else {}
    config = {"rows": args.rows, "item_bytes": 100, "batch_size": args.batch_size, "partitions": args.partitions,
              "items_per_partition": args.items_per_partition, "master": args.master, "standalone": args.standalone,
              "nodes": len(urls.split(",")), "cpus": os.cpu_count(), "python": platform.python_version(),
              "load_average": os.getloadavg()[0], "rcq_concurrency": args.rcq_concurrency, "spread": args.spread}
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
                    by_mode[mode] = spark_figures(spark, urls, args, options, Path(temp), target,
                                                  lambda: server_pids(cluster, urls))
                finally:
                    spark.stop()
        rcq_figures = asyncio.run(rcq_bench(target, args.rcq_concurrency, args.rcq_duration_s, spread_partitions(args)))
    finally:
        if cluster is not None:
            cluster.close()
    figures = {**by_mode[args.master], "rcq_enqueue_100_items_per_s": rcq_figures["enqueue-100"],
               "rcq_dequeue_100_items_per_s": rcq_figures["dequeue-100"]}
    if "spread-enqueue-100" in rcq_figures:
        figures["rcq_spread_enqueue_100_items_per_s"] = rcq_figures["spread-enqueue-100"]
        figures["rcq_spread_dequeue_100_items_per_s"] = rcq_figures["spread-dequeue-100"]
    print_modes(by_mode, rcq_figures)
    enqueue_yardstick, dequeue_yardstick = yardsticks(rcq_figures)
    shares = [f[key] / max(yardstick, 1e-9) for f in by_mode.values()
              for key, yardstick in (("spark_sink_rows_per_s", enqueue_yardstick),
                                     ("spark_source_rows_per_s", dequeue_yardstick))]
    print("target (>= 50% of rcq's items/s in every mode):", "met" if min(shares) >= 0.5 else "NOT met")
    to_alone = [f["spark_source_rows_per_s"] / max(f["spark_baseline_rows_per_s"], 1e-9) for f in by_mode.values()]
    print("target (streaming source >= 90% of Spark alone in every mode):", "met" if min(to_alone) >= 0.9 else "NOT met")
    if args.json:
        args.json.write_text(json.dumps({"config": config, "figures": figures, "modes": by_mode}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
