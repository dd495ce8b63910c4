"""The test suite's own rules, checked on the source with ``ast``.

* Tests share helpers from helper modules (:mod:`tests.helpers`, ``tests/integration/workload.py``,
  ``tests/spark/helpers.py``, ...) and fixtures from conftest files: no module of the repository
  imports a test module (``test_*.py``) or a conftest, whether by ``import``, ``from``, a relative
  import or ``importlib.import_module`` with a literal name. A test module importing another runs
  or collects it twice, and ties one module's private helpers to another's tests.
* The bounds tests wait with live in one place, :mod:`tests.helpers`: no other module of the
  suite declares a module-level ``..._TIMEOUT_S``, ``..._TIMEOUT_MS``, ``..._WAIT_S`` or
  ``..._WAIT_MS``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRECTORIES = frozenset({"build", "dist", "node_modules", "__pycache__"})  # and every hidden one
TIMEOUTS_HOME = "tests/helpers/__init__.py"
TIMEOUT_NAME = re.compile(r"(^|_)(TIMEOUT|WAIT)_M?S$")


def python_files() -> dict[str, str]:
    """Every Python source of the repository (repo-relative posix path -> source)."""
    files: dict[str, str] = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if any(part.startswith(".") or part in SKIPPED_DIRECTORIES for part in relative.parts[:-1]):
            continue
        files[relative.as_posix()] = path.read_text(encoding="utf-8")
    return files


def is_test_module_or_conftest(module: str) -> bool:
    """Whether an imported name is (in) a test module or a conftest: ``tests.unit.test_x``,
    ``tests.unit.test_x.helper``, ``tests.integration.conftest``, ``conftest``."""
    parts = module.split(".")
    if parts[0] == "conftest":
        return True
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts[1:])


def imports_of_tests(files: dict[str, str]) -> list[str]:
    """Each import of a test module or a conftest in ``files``, as 'path: module'."""
    return [f"{path}: imports {module}" for path, source in sorted(files.items())
            for module in sorted(imported_modules(source, path)) if is_test_module_or_conftest(module)]


def timeouts_outside_their_home(files: dict[str, str]) -> list[str]:
    """Each module-level timeout constant of the suite declared elsewhere than tests/helpers."""
    found: list[str] = []
    for path, source in sorted(files.items()):
        if not path.startswith("tests/") or path == TIMEOUTS_HOME:
            continue
        for statement in ast.parse(source, filename=path).body:
            targets = statement.targets if isinstance(statement, ast.Assign) else \
                [statement.target] if isinstance(statement, ast.AnnAssign) else []
            found += [f"{path}:{statement.lineno}: {target.id}" for target in targets
                      if isinstance(target, ast.Name) and TIMEOUT_NAME.search(target.id)]
    return found


# ====================================================================== the rules
def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    assert imports_of_tests(python_files()) == []


def test_timeouts_are_declared_only_in_tests_helpers() -> None:
    assert timeouts_outside_their_home(python_files()) == []


# ====================================================================== the checkers, tested
@pytest.mark.parametrize("source", [
    "from tests.unit.test_client import Wire",
    "import tests.unit.test_client",
    "from tests.unit import test_client",
    "from tests.integration.conftest import running_cluster",
    "from .test_checker import History",
    "from . import conftest",
    "def later():\n    from tests.spark.test_sink import check\n",
    "import importlib\nimportlib.import_module('tests.chaos.test_checker')",
])
def test_an_import_of_a_test_module_or_a_conftest_is_caught(source: str) -> None:
    assert imports_of_tests({"tests/chaos/test_new.py": source}) != []


@pytest.mark.parametrize("source", [
    "from tests.helpers import LEADER_TIMEOUT_S",
    "from tests.helpers.fakes import FakeNode",
    "from tests.integration.workload import History",
    "from tests.integration.manual_raft import ManualRaft",
    "from tests.spark.helpers import take_all",
    "import pytest\nfrom rcq.testing import wait_until",
])
def test_an_import_of_a_helper_module_is_allowed(source: str) -> None:
    assert imports_of_tests({"tests/chaos/test_new.py": source}) == []


def test_a_timeout_declared_in_a_test_module_is_caught_and_other_durations_are_not() -> None:
    source = ("LEADER_TIMEOUT_S = 60.0\nWAIT_S = 5.0\nSTATUS_WAIT_MS: int = 20_000\nHOLD_S = 180.0\n"
              "TIMEOUT_MAX_S = 2.0\n\ndef f():\n    LOCAL_TIMEOUT_S = 1.0\n")
    assert timeouts_outside_their_home({"tests/integration/test_new.py": source}) == [
        "tests/integration/test_new.py:1: LEADER_TIMEOUT_S",
        "tests/integration/test_new.py:2: WAIT_S",
        "tests/integration/test_new.py:3: STATUS_WAIT_MS",
    ]
    assert timeouts_outside_their_home({TIMEOUTS_HOME: source, "chaos/runner.py": source}) == []
