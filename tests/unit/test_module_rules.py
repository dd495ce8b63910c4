"""Architecture rules, as folder rules, checked on the source with ``ast``.

* ``rcq/server/core`` (commands, state machine) is pure: it imports only itself, ``rcq.errors``
  and standard modules without I/O, clock, randomness or concurrency;
* only ``rcq/server/raft`` imports pysyncobj and lmdb;
* the client side (``rcq/client``, ``rcq/errors.py``, ``rcq/names.py``, ``rcq/encoding.py``,
  ``rcq/limits.py``, and the Spark connector, which runs where only the client is installed)
  imports nothing from ``rcq.server``: ``pip install rcq`` has no server;
* the chaos harness talks to rcq as any user would: ``rcq.client``, ``rcq.errors`` and the
  cluster harness of ``rcq.testing`` only.

Every import statement counts, wherever it is (inside functions, under
``if TYPE_CHECKING:``, in ``try:``), and so do ``__import__("x")`` and
``importlib.import_module("x")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rcq", "cluster", "chaos")  # the project's own code (tests excluded)

PURE_FOLDER = "rcq/server/core/"
PURE_ALLOWED_RCQ = ("rcq.server.core", "rcq.errors")
PURE_FORBIDDEN = frozenset({"asyncio", "aiohttp", "pysyncobj", "lmdb", "time", "random", "uuid", "os",
                            "threading", "socket", "pydantic"})
EXCLUSIVE = {"pysyncobj": "rcq/server/raft/", "lmdb": "rcq/server/raft/"}
CLIENT_SIDE = ("rcq/client/", "rcq/errors.py", "rcq/names.py", "rcq/encoding.py", "rcq/limits.py", "rcq/spark/")
CHAOS_ALLOWED_RCQ = ("rcq.client", "rcq.errors", "rcq.testing.cluster", "rcq.testing.nodes", "rcq.testing.polls",
                     "rcq.testing.waits", "rcq.testing.powerfs")


# ====================================================================== the checker
def module_name(path: str) -> str:
    """'rcq/state_machine.py' -> 'rcq.server.core.state_machine'; 'chaos/__init__.py' -> 'chaos'."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, path: str) -> set[str]:
    """Every module ``source`` (the file at ``path``, relative to the repo) may import, fully qualified.

    ``from X import a`` yields ``X.a`` (a may be a submodule), so ``from rcq import state_machine``
    is seen as ``rcq.server.core.state_machine`` and ``from time import monotonic`` as ``time.monotonic``.
    """
    tree = ast.parse(source, filename=path)
    package = module_name(path)
    if not path.endswith("__init__.py"):
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                base_parts = base_parts[: max(0, len(base_parts) - (node.level - 1))]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                found.add(base if alias.name == "*" else f"{base}.{alias.name}".strip("."))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ("__import__", "import_module"):
                found.add(node.args[0].value)
    return found


def top_level(module: str) -> str:
    return module.split(".", 1)[0]


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(files: dict[str, str]) -> list[str]:
    """All rule violations in ``files`` (repo-relative posix path -> source)."""
    problems: list[str] = []
    for path, source in sorted(files.items()):
        imports = imported_modules(source, path)
        tops = {top_level(m) for m in imports}
        if path.startswith(PURE_FOLDER):
            for name in sorted(tops & PURE_FORBIDDEN):
                problems.append(f"{path}: pure module imports {name}")
            for module in sorted(imports):
                if within(module, "rcq") and not any(within(module, ok) for ok in PURE_ALLOWED_RCQ):
                    problems.append(f"{path}: pure module imports {module}")
        for name, owner in EXCLUSIVE.items():
            if name in tops and not path.startswith(owner):
                problems.append(f"{path}: imports {name} (only {owner} may)")
        if path.startswith(CLIENT_SIDE):
            for module in sorted(imports):
                if within(module, "rcq.server"):
                    problems.append(f"{path}: client side imports {module}")
        if path.startswith("chaos/"):
            for module in sorted(imports):
                if within(module, "rcq") and not any(within(module, ok) for ok in CHAOS_ALLOWED_RCQ):
                    problems.append(f"{path}: chaos imports {module} (only {', '.join(CHAOS_ALLOWED_RCQ)})")
    return problems


def project_files() -> dict[str, str]:
    files = {}
    for package in PACKAGES:
        directory = ROOT / package
        if directory.is_dir():
            for file in sorted(directory.rglob("*.py")):
                files[file.relative_to(ROOT).as_posix()] = file.read_text(encoding="utf-8")
    return files


# ====================================================================== the real tree
PURE_MODULES = ("rcq/server/core/state_machine.py", "rcq/server/core/commands.py")


def test_the_project_follows_the_module_rules():
    files = project_files()
    for path in (*PURE_MODULES, "rcq/server/raft/replicator.py", "rcq/client/__init__.py"):
        assert path in files, f"{path} is missing: the rules would pass vacuously"
    assert violations(files) == []


@pytest.mark.parametrize("path", PURE_MODULES)
def test_the_pure_modules_import_no_io_clock_randomness_or_concurrency(path):
    imports = imported_modules((ROOT / path).read_text(encoding="utf-8"), path)
    assert imports, "the checker found no import at all: it is probably broken"
    assert {top_level(m) for m in imports} & PURE_FORBIDDEN == set()


def test_the_checker_sees_the_imports_the_pure_modules_really_have():
    path = "rcq/server/core/state_machine.py"
    assert "rcq.server.core.commands.decode" in imported_modules((ROOT / path).read_text(encoding="utf-8"), path)


# ====================================================================== the checker itself
@pytest.mark.parametrize("source, expected", [
    ("import time", {"time"}),
    ("import os.path as p", {"os.path"}),
    ("from time import monotonic as m", {"time.monotonic"}),
    ("from os import path, sep", {"os.path", "os.sep"}),
    ("from asyncio import *", {"asyncio"}),
    ("def f():\n    import random\n", {"random"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lmdb\n", {"typing.TYPE_CHECKING", "lmdb"}),
    ("try:\n    import uuid\nexcept ImportError:\n    pass\n", {"uuid"}),
    ("socket = __import__('socket')", {"socket"}),
    ("import importlib\nt = importlib.import_module('threading')", {"importlib", "threading"}),
    ("from . import commands", {"rcq.server.core.commands"}),
    ("from .commands import encode", {"rcq.server.core.commands.encode"}),
    ("from ... import errors", {"rcq.errors"}),
    ("x = 'import os'  # import time", set()),
])
def test_imported_modules_finds_every_kind_of_import(source, expected):
    assert imported_modules(source, "rcq/server/core/state_machine.py") == expected


def test_relative_imports_resolve_against_the_right_package():
    assert imported_modules("from . import state_machine", "chaos/checker.py") == {"chaos.state_machine"}
    assert imported_modules("from .. import state_machine", "chaos/nemesis/kill.py") == {"chaos.state_machine"}
    assert imported_modules("from ..rcq import x", "chaos/a.py") == {"rcq.x"}
    assert imported_modules("from .workload import run", "chaos/__init__.py") == {"chaos.workload.run"}
    assert module_name("rcq/__init__.py") == "rcq"


CLEAN = {
    "rcq/server/core/state_machine.py": "import hashlib\nfrom rcq.server.core.commands import decode\nimport rcq.errors\n",
    "rcq/server/core/commands.py": "from dataclasses import dataclass\n",
    "rcq/server/raft/replicator.py": "import pysyncobj\nfrom pysyncobj import SyncObj\n",
    "rcq/server/raft/snapshots.py": "import lmdb\n",
    "rcq/client/__init__.py": "import aiohttp\nfrom rcq.errors import RcqError\nfrom rcq.names import check_queue_name\n",
    "chaos/workload.py": "from rcq.client import Client\nfrom rcq import errors\nimport rcq.errors\nimport asyncio\n",
    "chaos/cluster.py": "from rcq.testing.cluster import LocalCluster\n",
}


def test_a_clean_tree_has_no_violations():
    assert violations(CLEAN) == []


@pytest.mark.parametrize("path, source, expected", [
    ("rcq/server/core/state_machine.py", "import time", "rcq/server/core/state_machine.py: pure module imports time"),
    ("rcq/server/core/state_machine.py", "def f():\n    from random import random\n", "pure module imports random"),
    ("rcq/server/core/commands.py", "import os.path", "rcq/server/core/commands.py: pure module imports os"),
    ("rcq/server/core/commands.py", "from threading import Lock", "pure module imports threading"),
    ("rcq/server/core/commands.py", "import uuid, socket", "pure module imports socket"),
    ("rcq/server/core/state_machine.py", "import asyncio", "pure module imports asyncio"),
    ("rcq/server/core/state_machine.py", "import aiohttp.web", "pure module imports aiohttp"),
    ("rcq/server/core/state_machine.py", "lmdb = __import__('lmdb')", "pure module imports lmdb"),
    ("rcq/server/core/state_machine.py", "from rcq.server.config import NodeConfig",
     "pure module imports rcq.server.config.NodeConfig"),
    ("rcq/server/core/new.py", "from ..leader import transactions", "pure module imports rcq.server.leader"),
    ("rcq/server/node.py", "import pysyncobj", "rcq/server/node.py: imports pysyncobj (only rcq/server/raft/ may)"),
    ("rcq/server/leader/transactions.py", "from pysyncobj.batteries import ReplDict", "imports pysyncobj"),
    ("cluster/launcher.py", "import pysyncobj", "cluster/launcher.py: imports pysyncobj"),
    ("rcq/server/http/api.py", "import lmdb", "rcq/server/http/api.py: imports lmdb (only rcq/server/raft/ may)"),
    ("rcq/client/transport.py", "from rcq.server.http.models import BeginRequest",
     "rcq/client/transport.py: client side imports rcq.server.http.models.BeginRequest"),
    ("rcq/names.py", "import rcq.server.config", "client side imports rcq.server.config"),
    ("chaos/checker.py", "from rcq.server.core.state_machine import QueueStateMachine",
     "chaos/checker.py: chaos imports rcq.server.core.state_machine.QueueStateMachine"),
    ("chaos/checker.py", "from rcq import commands", "chaos imports rcq.commands"),
    ("chaos/checker.py", "import rcq.server", "chaos imports rcq.server"),
    ("chaos/checker.py", "import rcq", "chaos imports rcq "),
    ("chaos/checker.py", "import rcq.clientele", "chaos imports rcq.clientele"),
    ("chaos/checker.py", "from rcq.testing import InMemoryReplicator", "chaos imports rcq.testing.InMemoryReplicator"),
    ("chaos/nemesis/kill.py", "from ...rcq.server.leader import transactions", "chaos imports rcq.server.leader"),
])
def test_each_broken_rule_is_reported(path, source, expected):
    files = {**CLEAN, path: source}
    problems = violations(files)
    assert any(expected in (p + " ") for p in problems), problems
