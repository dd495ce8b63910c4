"""examples/spark_pipeline.py end to end, small, on the shared SparkSession and cluster; its flags."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.spark
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_example_pipeline_delivers_every_row_exactly_once(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    counts = _example().run_pipeline(spark, urls, tmp_path, rows=3000, options={"token": token})
    assert counts == {"csv_rows": 3000, "parquet_rows": 3000, "distinct_orders": 3000, "duplicated_orders": 0,
                      "lost_orders": 0}


@pytest.mark.parametrize(("argv", "message"), [
    (["--kill-executor"], "--kill-executor needs --standalone"),
    (["--standalone", "--master", "local[1]"], "not allowed with argument"),
])
def test_example_refuses_flags_that_do_not_go_together(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before anything starts: no rcq cluster, no JVM."""
    with pytest.raises(SystemExit) as exit_info:
        _example().main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_batch_write_that_met_a_leader_change_is_written_again_and_other_errors_are_not() -> None:
    """The tasks' transactions die with their leader before the job's commit: nothing committed, so
    the example runs the write again; any other failure, or a third leader change, is raised."""
    example = _example()
    attempts: list[int] = []

    def failing_with(*messages: str) -> Any:
        def write() -> None:
            attempts.append(1)
            if len(attempts) <= len(messages):
                raise RuntimeError(messages[len(attempts) - 1])
        return write

    leader_changed = "Failed to commit ... rcq leader_changed: committing 2 transactions ..."
    example.write_again_after_a_failover(failing_with(leader_changed))
    assert len(attempts) == 2
    attempts.clear()
    with pytest.raises(RuntimeError, match="rcq commit_conflict"):
        example.write_again_after_a_failover(failing_with("rcq commit_conflict: ..."))
    assert len(attempts) == 1
    attempts.clear()
    with pytest.raises(RuntimeError, match="leader_changed"):
        example.write_again_after_a_failover(failing_with(leader_changed, leader_changed, leader_changed))
    assert len(attempts) == example.BATCH_WRITE_ATTEMPTS
