"""The one rerun a Spark test gets (tests/helpers/spark_reruns.py, marked by tests/spark/conftest.py):
when Spark's Python worker did not connect back in its fixed 10 s, and for nothing else. Without
the rerun marker this test fails: its first run fails as such a Spark job does."""

from __future__ import annotations

import pytest

from tests.helpers.spark_reruns import WORKER_CONNECT_BACK

_runs: list[int] = []


@pytest.mark.spark
def test_a_spark_test_whose_python_worker_did_not_connect_back_runs_once_more() -> None:
    _runs.append(1)
    if len(_runs) == 1:
        raise RuntimeError("[STREAM_FAILED] Query terminated with exception: Python worker failed to connect back.")
    assert len(_runs) == 2


def test_only_spark_tests_are_rerun_and_only_for_that_message(request: pytest.FixtureRequest) -> None:
    spark_test = next(item for item in request.session.items
                      if item.name == "test_a_spark_test_whose_python_worker_did_not_connect_back_runs_once_more")
    flaky = spark_test.get_closest_marker("flaky")
    assert flaky is not None and flaky.kwargs == {"reruns": 1, "only_rerun": [WORKER_CONNECT_BACK]}
    assert request.node.get_closest_marker("flaky") is None
