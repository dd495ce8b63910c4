"""Fixtures for the Spark connector tests: one SparkSession and one 3-node rcq cluster per run.

The JVM reads its environment when it starts, so the variables are set at
import time, before any fixture runs. Without Java the ``spark`` tests are
skipped, and the terminal summary says so in a warning line: a skipped
connector test suite must never look like a passing one.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcq.testing.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
LEADER_TIMEOUT_S = 60.0
JAVA_MISSING = "Java is not installed (no `java` on PATH): the rcq Spark connector tests did NOT run"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# Executors unpickle test-only data sources (tests.spark.faulty) by module reference.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

_skipped_for_java: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("java") is not None:
        return
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.skip(reason=JAVA_MISSING))
            _skipped_for_java.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped_for_java:
        terminalreporter.write_sep("!", f"WARNING: {len(_skipped_for_java)} Spark tests SKIPPED: {JAVA_MISSING}",
                                   yellow=True, bold=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("rcq_cluster")
    if report.failed and isinstance(cluster, LocalCluster):
        report.sections.append((f"rcq node logs ({report.when})", cluster.dump_logs()))


def make_spark_session() -> Any:
    """local[2,3]: two cores, and up to 3 attempts per task so retries happen; quiet and small."""
    from pyspark.sql import SparkSession

    import rcq.spark

    spark = (SparkSession.builder.master("local[2,3]").appName("rcq-spark-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.sql.streaming.pollingDelay", "100ms")
             .config("spark.driver.memory", "1g")
             .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    rcq.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    session = make_spark_session()
    from tests.spark.faulty import FaultyRcqDataSource

    session.dataSource.register(FaultyRcqDataSource)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def rcq_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3) as cluster:
        try:
            cluster.wait_for_leader(LEADER_TIMEOUT_S)
        except TimeoutError:
            print(cluster.dump_logs())
            raise
        yield cluster


@pytest.fixture
def healthy_cluster(rcq_cluster: LocalCluster) -> LocalCluster:
    rcq_cluster.heal()
    rcq_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return rcq_cluster


@pytest.fixture
def urls(healthy_cluster: LocalCluster) -> str:
    return ",".join(healthy_cluster.urls)


@pytest.fixture
def token(rcq_cluster: LocalCluster) -> str:
    """The cluster's admin token: the Spark option ``token`` and the helpers' clients send it."""
    assert rcq_cluster.token is not None, "the test cluster requires tokens"
    return rcq_cluster.token
