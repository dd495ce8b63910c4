"""The rcq connector on a Spark standalone cluster: executors in their own JVMs, one of them killed.

Local mode runs the executors inside the driver's JVM; here a master and a worker run as separate
JVMs (:class:`bench.spark_standalone.SparkStandalone`), the worker starts the application's
executor as a third, and that executor forks the Python workers that run the connector. To kill
an executor in the middle of a task, not between tasks, the pipelines pass their rows through
:func:`_hold_once`: the first attempt of one task, part way through its rows, says which process
it is (a marker file) and waits; the test SIGKILLs the executor JVM above that process. Spark
retries the task on the replacement executor the worker starts.

What the contract promises there (README, Spark): the batch sink is exactly once per job (the
killed attempt's transactions are never committed); the streaming source is at least once, and
re-delivers only across a leader failover (one micro-batch per new term) — a lost executor is a
task retry, which reuses the killed task's transaction and dequeue keys and so reads the same
items; the rcq stream sink is exactly once per micro-batch, also when Spark replays one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.spark_standalone import SparkStandalone
from rcq.local.cluster import LocalCluster
from rcq.testing import wait_until
from tests.helpers import SPARK_STANDALONE_WAIT_S
from tests.spark.helpers import (
    check_stream_sink_replay_adds_nothing_twice,
    duplicates,
    enqueue_values,
    open_transactions,
    queue_info,
    take_all,
    unique_queue,
)

pytestmark = pytest.mark.spark
HOLD_S = 180.0  # how long a held task waits to be killed (a failing test releases it sooner)
ROWS = 20_000
ITEMS = 12_000
PER_PARTITION = 1000  # streaming: items per task per micro-batch; 2 tasks: 2000 per batch, 6 batches
HELD_BATCH = 2  # the micro-batch whose task is killed: batches 0 and 1 are committed by then
WRITE_BATCH = 100  # rows per enqueue request of the batch sink


def _hold_once(markers: Path, partition: int, batch_id: int | None = None, after_rows: int = 1) -> Any:
    """A Python UDF returning its string argument, except that in attempt 0 of task ``partition`` (of
    micro-batch ``batch_id``), at its ``after_rows``-th row, it writes ``held-<pid>`` into ``markers``
    and waits until it is killed, or ``markers/release`` appears, or HOLD_S pass. A plain pickled UDF
    (not ``mapInArrow``, not Arrow-optimized): those need pandas, which rcq does not install.
    Defined in a function, so cloudpickle ships it by value: executors need not import this module."""
    from pyspark.sql.functions import udf

    directory = str(markers)
    rows = [0]  # unpickled afresh for every task: counts that task's rows

    def hold(value: str | None) -> str | None:
        rows[0] += 1
        if rows[0] != after_rows:
            return value
        import contextlib
        import os

        from pyspark import TaskContext

        from rcq.testing import WaitTimeout, wait_until

        context = TaskContext.get()
        if (context is None or context.partitionId() != partition or context.attemptNumber() != 0
                or (batch_id is not None and context.getLocalProperty("streaming.sql.batchId") != str(batch_id))):
            return value
        partial = os.path.join(directory, f"writing-{os.getpid()}")  # a name _held_pid does not look at
        with open(partial, "w") as file:
            file.write(str(os.getpid()))
        os.rename(partial, os.path.join(directory, f"held-{os.getpid()}"))  # whole, or not there
        with contextlib.suppress(WaitTimeout):  # held at most HOLD_S, then it goes on
            wait_until(lambda: os.path.exists(os.path.join(directory, "release")), HOLD_S,
                       what="the test to release the held task")
        return value

    return udf(hold, "string", useArrow=False)


def _held_pid(markers: Path, running: Callable[[], bool]) -> int:
    """The pid of the held task's Python worker, once it says it holds (bounded; the job must still run)."""
    def attempt() -> int | None:
        pids = sorted(int(pid) for path in markers.glob("held-*") if (pid := path.name.removeprefix("held-")).isdigit())
        if pids:  # a marker appears whole (renamed from its writing- name), never half-written
            return pids[0]
        assert running(), "the job ended before any task held"
        return None

    return wait_until(attempt, SPARK_STANDALONE_WAIT_S, what=f"a held task in {markers}", interval_s=0.05)


def _kill_the_holder(cluster: SparkStandalone, app_id: str, pid: int) -> tuple[int, int]:
    """SIGKILL the executor JVM running the held task ``pid``; wait for the worker's replacement. (old, new) pids."""
    victim = cluster.executor_of(pid)
    assert victim is not None and victim.app_id == app_id, f"the held task runs in no executor of {app_id}"
    cluster.kill_executor(victim)
    replacement = cluster.wait_for_executor(app_id, exclude={victim.pid}, timeout_s=SPARK_STANDALONE_WAIT_S)
    return victim.pid, replacement.pid


def _sink_transactions_since(urls: str, token: str, since_ms: int, partition: int | None = None) -> list[dict[str, Any]]:
    """Open transactions of rcq sink tasks (labels ``rcq-sink:...:<partition>``) begun since ``since_ms``."""
    return [t for t in open_transactions(urls, token, "rcq-sink:") if int(t["created_ms"]) >= since_ms
            and (partition is None or str(t["label"]).endswith(f":{partition}"))]


def _abort(urls: str, token: str, transactions: list[dict[str, Any]]) -> None:
    """Tidy up what a killed attempt left open (it would expire after transactionTimeoutSeconds)."""
    import asyncio

    from rcq.client import RcqClient

    async def main() -> None:
        async with RcqClient(urls.split(","), token=token) as client:
            for described in transactions:
                await client.attach(described["transaction_id"]).abort_quietly()

    asyncio.run(main())


def _term(cluster: LocalCluster) -> int:
    return max(int(status["term"]) for status in cluster.statuses().values())


def test_batch_sink_adds_every_row_once_though_the_executor_dies_mid_write(
        standalone_spark: Any, spark_standalone: SparkStandalone, urls: str, token: str, tmp_path: Path) -> None:
    app_id = standalone_spark.sparkContext.applicationId
    assert standalone_spark.sparkContext.master == spark_standalone.master_url
    queue = unique_queue("standalone-sink")
    started_ms = int(time.time() * 1000)
    hold = _hold_once(tmp_path, partition=1, after_rows=ROWS // 8)  # half way through task 1
    # 100-byte values: the rows read before the hold fill the JVM's buffers, so they reach the writer task.
    rows = (standalone_spark.range(0, ROWS, 1, 4).selectExpr("lpad(cast(id as string), 100, '0') AS id")
            .select(hold("id").alias("value")))
    # The job runs in this thread (a Python data source is found only from the thread whose JVM
    # side has the session active); the kill comes from another.
    job_done = threading.Event()
    kills: list[tuple[int, int]] = []
    problems: list[BaseException] = []

    def kill() -> None:
        try:
            pid = _held_pid(tmp_path, lambda: not job_done.is_set())
            # Kill once the held task has enqueued rows, uncommitted.
            wait_until(lambda: sum(t["enqueued"] for t in _sink_transactions_since(urls, token, started_ms, 1))
                       >= WRITE_BATCH, SPARK_STANDALONE_WAIT_S, what="rows enqueued by the held task")
            kills.append(_kill_the_holder(spark_standalone, app_id, pid))
        except BaseException as exc:  # shown by the assertion below
            problems.append(exc)
        finally:
            (tmp_path / "release").touch()  # a held task that was not killed goes on

    killer = threading.Thread(target=kill, name="standalone-executor-killer")
    killer.start()
    try:
        # One request in flight: each enqueue is done before the task reads on, so the rows a held
        # task has read are enqueued (with more, the last ones wait for the task's next rows).
        rows.write.format("rcq").option("url", urls).option("token", token).option("queue", queue) \
            .option("batchSize", str(WRITE_BATCH)).option("requestsInFlight", "1").mode("append").save()
    finally:
        job_done.set()
        killer.join(SPARK_STANDALONE_WAIT_S)
    assert problems == [] and not killer.is_alive()
    [(killed, replacement)] = kills
    values = [int(v) for v in take_all(urls, token, queue)]
    assert duplicates(values) == {}
    assert sorted(values) == list(range(ROWS))
    # The killed attempt's rows went into transactions nobody committed: still open, never seen.
    left_open = _sink_transactions_since(urls, token, started_ms, 1)
    print(f"batch sink: executor {killed} killed, {replacement} took over; the killed attempt of task 1 left "
          f"{len(left_open)} open transactions holding {sum(t['enqueued'] for t in left_open)} rows")
    assert sum(t["enqueued"] for t in left_open) >= WRITE_BATCH
    _abort(urls, token, _sink_transactions_since(urls, token, started_ms))


def test_stream_sink_replayed_batch_adds_nothing_twice(
        standalone_spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    """A re-run of the same micro-batch commits with the same idempotency key, from executors of their own."""
    check_stream_sink_replay_adds_nothing_twice(standalone_spark, urls, token, tmp_path, timeout_s=SPARK_STANDALONE_WAIT_S)


def test_streaming_source_loses_nothing_when_the_executor_dies_mid_batch(
        standalone_spark: Any, spark_standalone: SparkStandalone, healthy_rcq_cluster: LocalCluster, urls: str,
        token: str, tmp_path: Path) -> None:
    app_id = standalone_spark.sparkContext.applicationId
    source, target = unique_queue("standalone-src"), unique_queue("standalone-dst")
    consumer, sink_id = unique_queue("standalone-consumer"), unique_queue("standalone-sink")
    enqueue_values(urls, token, source, [str(i) for i in range(ITEMS)])
    markers, checkpoint = tmp_path / "markers", tmp_path / "checkpoint"
    markers.mkdir()
    term = _term(healthy_rcq_cluster)
    started_ms = int(time.time() * 1000)
    stream = (standalone_spark.readStream.format("rcq").option("url", urls).option("token", token)
              .option("queue", source).option("consumerId", consumer).option("valueType", "string")
              .option("numPartitions", "2").option("maxItemsPerPartition", str(PER_PARTITION))
              .option("batchSize", "200").load())
    hold = _hold_once(markers, partition=0, batch_id=HELD_BATCH)
    query = (stream.select(hold("value").alias("value")).writeStream.format("rcq").option("url", urls).option("token", token)
             .option("queue", target).option("sinkId", sink_id).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        pid = _held_pid(markers, lambda: bool(query.isActive))
        if _term(healthy_rcq_cluster) == term:  # (an election would have aborted the open transactions)
            # Mid-stream: the batches before the held one are in the target queue, the held one is
            # not, and the held task's transaction has its items locked. (The source's offsets and
            # Spark's batch ids both count from 0: Spark's batch n ends at the source's offset n + 1.)
            assert queue_info(urls, token, target)["count"] == HELD_BATCH * 2 * PER_PARTITION
            [locked] = open_transactions(urls, token, f"rcq-source:{consumer}:{HELD_BATCH + 1}:0")
            assert locked["dequeued"] == PER_PARTITION, locked
        killed, replacement = _kill_the_holder(spark_standalone, app_id, pid)
        assert query.awaitTermination(SPARK_STANDALONE_WAIT_S), \
            f"the query did not finish within {SPARK_STANDALONE_WAIT_S} s of the kill"
        assert query.exception() is None
    finally:
        (markers / "release").touch()
        query.stop()
    new_terms = _term(healthy_rcq_cluster) - term
    values = [int(v) for v in take_all(urls, token, target)]
    print(f"stream: executor {killed} killed in batch {HELD_BATCH}, {replacement} took over; {len(values)} items "
          f"delivered, {len(duplicates(values))} twice; {new_terms} leader elections")
    assert set(values) == set(range(ITEMS)), f"lost: {sorted(set(range(ITEMS)) - set(values))[:20]}"
    # A task retry reads what the killed attempt read; only a failover may re-deliver (a micro-batch per term).
    assert len(values) - ITEMS <= new_terms * 2 * PER_PARTITION, f"delivered twice: {len(duplicates(values))}"
    info = queue_info(urls, token, source)
    assert (info["count"], info["locked"]) == (0, 0), info
    assert open_transactions(urls, token, f"rcq-source:{consumer}:") == []
    _abort(urls, token, _sink_transactions_since(urls, token, started_ms))
