"""Suite-wide hooks: assertion rewriting in the shared helpers.

The shared helpers (:mod:`tests.helpers`, ``tests/spark/helpers.py``, ``tests/integration/workload.py``)
hold assertions; pytest rewrites them as it does the tests', so that their failures show the values
compared.

Must not import: a test module or another conftest.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.helpers", "tests.integration.workload", "tests.spark.helpers")
