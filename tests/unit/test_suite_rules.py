"""The test suite's own rules, checked on the source with ``ast``.

* Tests share helpers from helper modules (:mod:`tests.helpers`, ``tests/integration/workload.py``,
  ``tests/spark/helpers.py``, ...) and fixtures from conftest files: no module of the repository
  imports a test module (``test_*.py``) or a conftest, whether by ``import``, ``from``, a relative
  import or ``importlib.import_module`` with a literal name. A test module importing another runs
  or collects it twice, and ties one module's private helpers to another's tests.
* The bounds tests wait with live in one place, :mod:`tests.helpers`: no other module of the
  suite declares a module-level ``..._TIMEOUT_S``, ``..._TIMEOUT_MS``, ``..._WAIT_S`` or
  ``..._WAIT_MS``; and no wait of the suite is given a number as its bound (``wait_until(p, 5)``,
  ``asyncio.wait_for(f, 10)``, ``cluster.wait_for_leader(timeout_s=30)``), but a name for one.
* Tests wait for conditions, not for time: a sleep of the suite (``time.sleep``,
  ``asyncio.sleep``, Playwright's ``wait_for_timeout``) for longer than ``0`` (one turn of the
  loop) says on its line, or the line above, why time is what it waits for, in a comment
  ``# pace: ...`` (the pace of a load or a slowloris, a scenario's own timing, a window in which
  something must not happen).
* A fixture is defined once: no two conftests define a fixture of the same name, and no two
  fixtures of the suite have the same name, decorator, arguments and body (docstrings aside).
  A module may still override a conftest's fixture with a body of its own: several integration
  modules give themselves a module-scoped ``cluster`` with other node settings, and the fixtures
  that ask for ``cluster`` (``healthy_cluster``) get the module's.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
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


# A wait's bound: the position of its argument (and any keyword timeout or timeout_s).
BOUND_POSITIONS = {"wait_until": 1, "async_wait_until": 1, "wait_for": 1, "deadline_loop": 0, "wait_for_leader": 0,
                   "wait_for_applied": 0, "wait_for_convergence": 0, "wait_for_http": 1}
BOUND_KEYWORDS = frozenset({"timeout", "timeout_s"})
SLEEPS = frozenset({"sleep", "wait_for_timeout"})  # time.sleep, asyncio.sleep, a bare sleep; Playwright's
PACE_MARK = "# pace:"


def callee(call: ast.Call) -> tuple[str | None, str | None]:
    """(name, the name it is an attribute of): ``asyncio.wait_for`` -> ("wait_for", "asyncio")."""
    if isinstance(call.func, ast.Name):
        return call.func.id, None
    if isinstance(call.func, ast.Attribute):
        owner = call.func.value
        return call.func.attr, owner.id if isinstance(owner, ast.Name) else owner.attr \
            if isinstance(owner, ast.Attribute) else None
    return None, None


def is_number(node: ast.expr) -> bool:
    """A number written out, or arithmetic of numbers only (``2 * 30``); but 0, no time at all (a
    wait that asks once), which is no bound to name."""
    if isinstance(node, ast.Constant) and node.value == 0:
        return False
    return _is_number(node)


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    return isinstance(node, ast.BinOp) and _is_number(node.left) and _is_number(node.right)


def wait_bounds(call: ast.Call) -> list[ast.expr]:
    """The bounds ``call`` gives a wait (none if it is no wait)."""
    name, owner = callee(call)
    if name is None:
        return []
    position = BOUND_POSITIONS.get(name)
    if owner == "asyncio" and name == "timeout":
        position = 0
    elif owner == "mark" or not (position is not None or name.startswith("wait") or (owner, name) == ("asyncio", "timeout")):
        return []
    bounds = [call.args[position]] if position is not None and len(call.args) > position else []
    return bounds + [keyword.value for keyword in call.keywords if keyword.arg in BOUND_KEYWORDS]


def numeric_wait_bounds(files: dict[str, str]) -> list[str]:
    """Each wait of the suite whose bound is a number, not a name, as 'path:line: call'."""
    return [f"{path}:{node.lineno}: {ast.unparse(node.func)}({ast.unparse(bound)})"
            for path, source in sorted(files.items()) if path.startswith("tests/")
            for node in ast.walk(ast.parse(source, filename=path)) if isinstance(node, ast.Call)
            for bound in wait_bounds(node) if is_number(bound)]


def comments_by_line(source: str) -> dict[int, str]:
    return {token.start[0]: token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT}


def unpaced_sleeps(files: dict[str, str]) -> list[str]:
    """Each sleep of the suite longer than a turn of the loop without a ``# pace:`` comment on its
    line(s) or the line above, as 'path:line: call'."""
    found: list[str] = []
    for path, source in sorted(files.items()):
        if not path.startswith("tests/"):
            continue
        comments = comments_by_line(source)
        for node in ast.walk(ast.parse(source, filename=path)):
            if not isinstance(node, ast.Call):
                continue
            name, owner = callee(node)
            if name not in SLEEPS or (name == "sleep" and owner not in (None, "time", "asyncio")):
                continue  # a fake clock's sleep (clock.sleep) passes no time
            if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0:
                continue
            lines = range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)
            if not any(PACE_MARK in comments.get(line, "") for line in lines):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "fixture") or \
        (isinstance(target, ast.Name) and target.id == "fixture")


def without_docstring(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return ast.dump(ast.Module(body=[*function.decorator_list, function.args, *body], type_ignores=[]))


def twice_defined_fixtures(files: dict[str, str]) -> list[str]:
    """Fixtures of one name in two conftests, and fixtures of the suite alike in name, decorator,
    arguments and body (docstrings aside), as 'name: path:line, path:line'."""
    by_name: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for path, source in sorted(files.items()):
        if not path.startswith("tests/"):
            continue
        for node in ast.walk(ast.parse(source, filename=path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(map(is_fixture, node.decorator_list)):
                by_name[node.name].append((path, node.lineno, without_docstring(node)))
    found: list[str] = []
    for name, definitions in sorted(by_name.items()):
        in_conftests = [(path, line) for path, line, _ in definitions if path.rsplit("/", 1)[-1] == "conftest.py"]
        if len(in_conftests) > 1:
            found.append(f"{name} in two conftests: " + ", ".join(f"{path}:{line}" for path, line in in_conftests))
        bodies: dict[str, list[str]] = defaultdict(list)
        for path, line, body in definitions:
            bodies[body].append(f"{path}:{line}")
        found += [f"{name} defined alike: " + ", ".join(places) for places in bodies.values() if len(places) > 1]
    return found


# ====================================================================== the rules
def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    assert imports_of_tests(python_files()) == []


def test_timeouts_are_declared_only_in_tests_helpers() -> None:
    assert timeouts_outside_their_home(python_files()) == []


def test_every_wait_of_the_suite_is_bounded_by_a_name_not_a_number() -> None:
    assert numeric_wait_bounds(python_files()) == []


def test_every_sleep_of_the_suite_longer_than_a_turn_of_the_loop_says_why_it_paces() -> None:
    assert unpaced_sleeps(python_files()) == []


def test_every_fixture_is_defined_once() -> None:
    assert twice_defined_fixtures(python_files()) == []


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
    "from tests.helpers.manual_raft import ManualRaft",
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


@pytest.mark.parametrize("source", [
    "await wait_until(ready, 5, what='ready')",
    "await async_wait_until(ready, timeout_s=30.0, what='ready')",
    "await asyncio.wait_for(task, 10)",
    "await asyncio.wait_for(task, timeout=2 * 30)",
    "cluster.wait_for_leader(30)",
    "cluster.wait_for_convergence(timeout_s=0.3)",
    "local.wait_for_http([0], 60)",
    "async with asyncio.timeout(10):\n    pass",
    "await asyncio.wait({task}, timeout=5)",
    "cluster.wait_converged(nodes, timeout_s=20)",
    "for _ in deadline_loop(5.0):\n    pass",
])
def test_a_wait_bounded_by_a_number_is_caught(source: str) -> None:
    assert len(numeric_wait_bounds({"tests/integration/test_new.py": source})) == 1


@pytest.mark.parametrize("source", [
    "await wait_until(ready, LOCAL_WAIT_S, what='ready', interval_s=0.05)",
    "await asyncio.wait_for(task, 2 * CLUSTER_WAIT_S)",
    "cluster.wait_for_leader(LEADER_TIMEOUT_S)",
    "cluster.wait_for_convergence(timeout_s=UNREAD_CLOSE_AFTER_S + LOCAL_WAIT_S)",
    "async with asyncio.timeout(LOCAL_WAIT_S):\n    pass",
    "for _ in deadline_loop(0.0):\n    pass",  # no time at all: asked once
    "await wait_for_count(cluster, queue, 3)",  # a count, not a bound
    "@pytest.mark.timeout(240)\ndef test_long():\n    pass",  # pytest-timeout's limit, not a wait
    "h.wait(1.5)  # a history's clock",
    "await client.begin(timeout_s=30)",  # a transaction's timeout, not a wait
])
def test_a_wait_bounded_by_a_name_and_other_numbers_are_allowed(source: str) -> None:
    assert numeric_wait_bounds({"tests/integration/test_new.py": source}) == []
    assert numeric_wait_bounds({"chaos/runner.py": "await wait_until(ready, 5, what='ready')"}) == []


@pytest.mark.parametrize("source", [
    "time.sleep(0.05)",
    "await asyncio.sleep(1.05)",
    "await asyncio.sleep(LOCAL_WAIT_S)",
    "await asyncio.sleep(2 * HAND_OVER_POLL_S)  # the hand-over's own polls, in real time",
    "from time import sleep\nsleep(1)",
    "page.wait_for_timeout(3000)",
    "# pace: on the line above the one before\n\ntime.sleep(1)",
])
def test_a_sleep_that_does_not_say_it_paces_is_caught(source: str) -> None:
    assert len(unpaced_sleeps({"tests/unit/test_new.py": source})) == 1


@pytest.mark.parametrize("source", [
    "await asyncio.sleep(0)  # one turn of the loop",
    "await asyncio.sleep(0.05)  # pace: an answer every 50 ms keeps the channel busy",
    "# pace: the load runs this long before the backup\nawait asyncio.sleep(LOAD_S)",
    "await asyncio.sleep(\n    LOAD_S)  # pace: the load's",
    "clock.sleep(5)  # a fake clock: no time passes",
    "program = 'import time; time.sleep(120)'  # a child's source, not a sleep of the suite",
])
def test_a_sleep_that_paces_or_takes_no_time_is_allowed(source: str) -> None:
    assert unpaced_sleeps({"tests/unit/test_new.py": source}) == []
    assert unpaced_sleeps({"chaos/runner.py": "time.sleep(1)"}) == []


CLUSTER_FIXTURE = ('@pytest.fixture{scope}\ndef cluster(request):\n    """{doc}"""\n'
                   '    with running_cluster(overrides={overrides}) as local_cluster:\n        yield local_cluster\n')


def cluster_fixture(doc: str = "A cluster.", scope: str = "", overrides: str = "None") -> str:
    return CLUSTER_FIXTURE.format(doc=doc, scope=scope, overrides=overrides)


def test_a_fixture_defined_alike_twice_or_in_two_conftests_is_caught() -> None:
    assert twice_defined_fixtures({
        "tests/integration/test_failover.py": cluster_fixture("Of this test's own (it will be broken)."),
        "tests/integration/test_restart.py": cluster_fixture("Of this test's own."),
    }) == ["cluster defined alike: tests/integration/test_failover.py:2, tests/integration/test_restart.py:2"]
    healthy = "@pytest.fixture\ndef healthy_cluster(cluster):\n    return healed(cluster)\n"
    assert twice_defined_fixtures({
        "tests/integration/conftest.py": healthy,
        "tests/spark/conftest.py": "import pytest\n\n" + healthy.replace("(cluster)", "(rcq_cluster)"),
    }) == ["healthy_cluster in two conftests: tests/integration/conftest.py:2, tests/spark/conftest.py:4"]


def test_a_module_overriding_a_fixture_with_a_body_of_its_own_is_allowed() -> None:
    assert twice_defined_fixtures({
        "tests/integration/conftest.py": cluster_fixture(scope='(scope="module")'),
        "tests/integration/test_session_channel_limits.py": cluster_fixture(scope='(scope="module")',
                                                                            overrides="LIMITED_NODE_SETTINGS"),
        "tests/integration/test_session_channel_fuzz.py": cluster_fixture(scope='(scope="module")',
                                                                          overrides="FUZZED_NODE_SETTINGS"),
        "tests/integration/test_failover.py": cluster_fixture(),  # another scope: not alike
        "chaos/conftest.py": cluster_fixture(scope='(scope="module")'),  # not the suite's
    }) == []
