"""Fixtures for the Spark connector tests: one SparkSession at a time and one 3-node rcq cluster per run.

The JVM reads its environment when it starts, so the variables are set at
import time, before any fixture runs. Without Java the ``spark`` tests are
skipped, and the terminal summary says so in a warning line: a skipped
connector test suite must never look like a passing one.

PySpark allows one SparkContext per process, so :class:`SparkSessions` holds
the one session and switches masters when a test asks for another: ``spark``
is ``local[2,3]``; ``standalone_spark`` drives a Spark standalone cluster (a
master and a worker JVM, :mod:`bench.spark_standalone`) that a module
starts for itself and stops when it is done.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from bench.spark_standalone import SparkStandalone
from rcq.local.cluster import LocalCluster
from tests.helpers import LEADER_TIMEOUT_S
from tests.helpers.cluster import healed
from tests.helpers.spark_reruns import WORKER_CONNECT_BACK, WORKER_CONNECT_RERUNS

ROOT = Path(__file__).resolve().parents[2]
LOCAL_MASTER = "local[2,3]"  # two cores, and up to 3 attempts per task so retries happen
JAVA_MISSING = "Java is not installed (no `java` on PATH): the rcq Spark connector tests did NOT run"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# Executors unpickle test-only data sources (tests.spark.faulty) by module reference.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

_skipped_for_java: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    java = shutil.which("java") is not None
    for item in items:
        if item.get_closest_marker("spark") is None:
            continue
        if java:  # one rerun, for Spark's fixed wait on a Python worker only (tests.helpers.spark_reruns)
            item.add_marker(pytest.mark.flaky(reruns=WORKER_CONNECT_RERUNS, only_rerun=[WORKER_CONNECT_BACK]))
        else:
            item.add_marker(pytest.mark.skip(reason=JAVA_MISSING))
            _skipped_for_java.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped_for_java:
        terminalreporter.write_sep("!", f"WARNING: {len(_skipped_for_java)} Spark tests SKIPPED: {JAVA_MISSING}",
                                   yellow=True, bold=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """A failed test's report gets the Spark standalone logs (the rcq node logs come from the
    suite's hook, in tests/conftest.py)."""
    outcome = yield
    report = outcome.get_result()
    standalone = getattr(item, "funcargs", {}).get("spark_standalone")
    if report.failed and isinstance(standalone, SparkStandalone):
        report.sections.append((f"Spark standalone logs ({report.when})", standalone.dump_logs()))


# The JVMs' java.io.tmpdir: Spark's codecs unpack native libraries there (liblz4-java, snappy) and
# a killed executor never deletes its copy; a directory of the test run's own, removed at exit.
JVM_TMPDIR = Path(tempfile.mkdtemp(prefix="rcq-spark-jvm-"))
atexit.register(shutil.rmtree, JVM_TMPDIR, True)
JVM_OPTIONS = f"-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.io.tmpdir={JVM_TMPDIR}"


def make_spark_session(master: str = LOCAL_MASTER, config: Mapping[str, str] | None = None) -> Any:
    """A quiet, small session on ``master`` with ``rcq`` and the tests' ``rcq_faulty`` registered."""
    from pyspark.sql import SparkSession

    import rcq.spark
    from tests.spark.faulty import FaultyRcqDataSource

    builder = (SparkSession.builder.master(master).appName("rcq-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.streaming.pollingDelay", "100ms")
               .config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", JVM_OPTIONS))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    rcq.spark.register(spark)
    spark.dataSource.register(FaultyRcqDataSource)
    return spark


class SparkSessions:
    """The process's one SparkSession, made for the master last asked for (another master: the
    current session is stopped first; the driver JVM stays, so a switch costs seconds)."""

    def __init__(self) -> None:
        self.master: str | None = None
        self.session: Any = None

    def get(self, master: str = LOCAL_MASTER, config: Mapping[str, str] | None = None) -> Any:
        if self.session is None or self.master != master:
            self.stop()
            self.session = make_spark_session(master, config)
            self.master = master
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            session, self.session, self.master = self.session, None, None
            session.stop()


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    sessions = SparkSessions()
    try:
        yield sessions
    finally:
        sessions.stop()


@pytest.fixture
def spark(spark_sessions: SparkSessions) -> Any:
    """A ``local[2,3]`` session (kept across tests until one asks for another master)."""
    return spark_sessions.get(LOCAL_MASTER)


@pytest.fixture(scope="module")
def spark_standalone(spark_sessions: SparkSessions) -> Iterator[SparkStandalone]:
    """A Spark standalone cluster for one module: a master and a worker (2 cores, 1 GiB) on loopback."""
    with SparkStandalone(cores=2, memory="1g") as cluster:
        try:
            yield cluster
        finally:
            if spark_sessions.master == cluster.master_url:  # its application ends before its cluster
                spark_sessions.stop()


@pytest.fixture
def standalone_spark(spark_sessions: SparkSessions, spark_standalone: SparkStandalone) -> Any:
    """A session whose executors run on ``spark_standalone``: up to 4 attempts per task (Spark's
    default outside local mode), Arrow batches of 1000 rows (so a task hands rows on while it runs)."""
    return spark_sessions.get(spark_standalone.master_url, {
        **spark_standalone.session_config(),
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
    })


@pytest.fixture(scope="session")
def rcq_cluster() -> Iterator[LocalCluster]:
    # partition ports for two partitions besides p0: tests/spark/test_partitions.py creates p1, test_spread.py p2;
    # no balancer: a leader it moves aborts the open transactions of a write in progress (docs/spark.md, "Limits")
    with LocalCluster(nodes=3, partitions_max=2, node_overrides={"balance_leaders": False}) as cluster:
        try:
            cluster.wait_for_leader(LEADER_TIMEOUT_S)
        except TimeoutError:
            print(cluster.dump_logs())
            raise
        yield cluster


@pytest.fixture
def healthy_rcq_cluster(rcq_cluster: LocalCluster) -> LocalCluster:
    """``rcq_cluster`` with every node resumed or restarted and a serving leader again."""
    return healed(rcq_cluster)


@pytest.fixture
def urls(healthy_rcq_cluster: LocalCluster) -> str:
    return ",".join(healthy_rcq_cluster.urls)


@pytest.fixture
def token(rcq_cluster: LocalCluster) -> str:
    """The cluster's admin token: the Spark option ``token`` and the helpers' clients send it."""
    assert rcq_cluster.token is not None, "the test cluster requires tokens"
    return rcq_cluster.token
