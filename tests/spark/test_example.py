"""examples/spark_pipeline.py end to end, small, on the shared SparkSession and cluster."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def test_example_pipeline_delivers_every_row_exactly_once(spark: Any, urls: str, token: str, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    counts = example.run_pipeline(spark, urls, tmp_path, rows=3000, options={"token": token})
    assert counts == {"csv_rows": 3000, "parquet_rows": 3000, "distinct_orders": 3000, "duplicated_orders": 0,
                      "lost_orders": 0}
