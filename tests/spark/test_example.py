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
