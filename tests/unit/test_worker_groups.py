"""The suite's parallel groups (:mod:`tests.helpers.worker_groups`): which tests share a worker,
the files the workers write them to, the scheduler that keeps a group on one worker; and, when
this module itself runs under ``./run tests``'s workers, that its tests did share one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import worker_groups
from tests.helpers.worker_groups import (
    FIXED_PORTS_GROUP,
    SPARK_GROUP,
    TESTS_ROOT,
    make_scheduler,
    read_groups,
    worker_group,
    write_groups,
)


def fake_item(path: Path, nodeid: str, scopes: tuple[str, ...] = (), marker: str | None = None,
              *marker_args: str) -> Any:
    definitions = {f"fixture{i}": [SimpleNamespace(scope=scope)] for i, scope in enumerate(scopes)}
    return SimpleNamespace(path=path, nodeid=nodeid, _fixtureinfo=SimpleNamespace(name2fixturedefs=definitions),
                           get_closest_marker=lambda name: SimpleNamespace(args=marker_args) if name == marker else None)


INTEGRATION = TESTS_ROOT / "integration" / "test_x.py"
# What xdist's scheduler reads of the controller's config: two local workers (-n 2).
CONTROLLER_CONFIG: Any = SimpleNamespace(getvalue=lambda name: ["2*popen"] if name == "tx" else None)


@pytest.mark.parametrize("item, group", [
    (fake_item(INTEGRATION, "a", ("function", "module")), "tests/integration/test_x.py"),
    (fake_item(INTEGRATION, "b", ("class",)), "tests/integration/test_x.py"),
    (fake_item(INTEGRATION, "c", ("function", "session")), None),
    (fake_item(INTEGRATION, "d"), None),
    (fake_item(TESTS_ROOT / "spark" / "test_y.py", "e"), SPARK_GROUP),
    (fake_item(INTEGRATION, "f", ("module",), "fixed_ports"), FIXED_PORTS_GROUP),
    (fake_item(INTEGRATION, "g", ("function",), "one_worker", "floods"), "one-worker:floods"),
])
def test_a_test_is_grouped_by_what_it_shares(item: Any, group: str | None) -> None:
    assert worker_group(item) == group


def test_the_groups_the_workers_write_are_what_the_scheduler_splits_by(tmp_path: Path) -> None:
    items = [fake_item(INTEGRATION, "tests/integration/test_x.py::a", ("module",)),
             fake_item(INTEGRATION, "tests/integration/test_x.py::b"),
             fake_item(TESTS_ROOT / "spark" / "test_y.py", "tests/spark/test_y.py::e")]
    write_groups(items, tmp_path, "gw0")
    write_groups(items, tmp_path, "gw1")
    assert read_groups(tmp_path) == {"tests/integration/test_x.py::a": "tests/integration/test_x.py",
                                     "tests/spark/test_y.py::e": SPARK_GROUP}
    scheduler = make_scheduler(CONTROLLER_CONFIG, None, tmp_path)
    assert [scheduler._split_scope(item.nodeid) for item in items] == [
        "tests/integration/test_x.py", "tests/integration/test_x.py::b", SPARK_GROUP]


def test_a_scheduler_with_no_groups_written_says_so(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no worker wrote its test groups"):
        make_scheduler(CONTROLLER_CONFIG, None, tmp_path)._split_scope("tests/unit/test_z.py::t")


# ---------------------------------------------------------------- this module, under the workers
@pytest.fixture(scope="module")
def module_setups(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Set up once per worker that runs this module's tests; each such worker leaves its name in
    a directory of the run (the controller's, which it removes at the end; alone: a temporary one)."""
    workerinput = getattr(request.config, "workerinput", {})
    run_directory = workerinput.get(worker_groups.WORKER_INPUT_KEY)
    directory = (Path(run_directory) if run_directory else tmp_path_factory.mktemp("alone")) / "setups"
    directory.mkdir(exist_ok=True)
    me = workerinput.get("workerid", "alone")
    (directory / me).touch()
    yield directory, me
    assert sorted(path.name for path in directory.iterdir()) == [me], "this module's tests ran on several workers"


@pytest.mark.parametrize("n", range(6))
def test_the_tests_sharing_a_module_fixture_run_on_one_worker(module_setups: Any, n: int) -> None:
    directory, me = module_setups
    assert sorted(path.name for path in directory.iterdir()) == [me], "this module's tests ran on several workers"
