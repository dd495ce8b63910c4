"""Architecture rules, checked on the source with ``ast``.

* the pure core (rcq/state_machine.py, rcq/commands.py) imports no I/O, clock,
  randomness or concurrency module;
* only rcq/replicator.py knows pysyncobj, only rcq/snapshots.py knows lmdb;
* the chaos harness talks to rcq as any user would: rcq.client and rcq.errors only.

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

PURE_MODULES = ("rcq/state_machine.py", "rcq/commands.py")
PURE_FORBIDDEN = frozenset({"asyncio", "aiohttp", "pysyncobj", "lmdb", "time", "random", "uuid", "os",
                            "threading", "socket"})
EXCLUSIVE = {"pysyncobj": "rcq/replicator.py", "lmdb": "rcq/snapshots.py"}
CHAOS_ALLOWED_RCQ = ("rcq.client", "rcq.errors")


# ====================================================================== the checker
def module_name(path: str) -> str:
    """'rcq/state_machine.py' -> 'rcq.state_machine'; 'chaos/__init__.py' -> 'chaos'."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, path: str) -> set[str]:
    """Every module ``source`` (the file at ``path``, relative to the repo) may import, fully qualified.

    ``from X import a`` yields ``X.a`` (a may be a submodule), so ``from rcq import state_machine``
    is seen as ``rcq.state_machine`` and ``from time import monotonic`` as ``time.monotonic``.
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
        if path in PURE_MODULES:
            for name in sorted(tops & PURE_FORBIDDEN):
                problems.append(f"{path}: pure module imports {name}")
        for name, owner in EXCLUSIVE.items():
            if name in tops and path != owner:
                problems.append(f"{path}: imports {name} (only {owner} may)")
        if path.startswith("chaos/"):
            for module in sorted(imports):
                if within(module, "rcq") and not any(within(module, ok) for ok in CHAOS_ALLOWED_RCQ):
                    problems.append(f"{path}: chaos imports {module} (only rcq.client and rcq.errors)")
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
def test_the_project_follows_the_module_rules():
    files = project_files()
    for path in PURE_MODULES:
        assert path in files, f"{path} is missing: the rules would pass vacuously"
    assert violations(files) == []


@pytest.mark.parametrize("path", PURE_MODULES)
def test_the_pure_modules_import_no_io_clock_randomness_or_concurrency(path):
    imports = imported_modules((ROOT / path).read_text(encoding="utf-8"), path)
    assert imports, "the checker found no import at all: it is probably broken"
    assert {top_level(m) for m in imports} & PURE_FORBIDDEN == set()


def test_the_checker_sees_the_imports_the_pure_modules_really_have():
    source = (ROOT / "rcq/state_machine.py").read_text(encoding="utf-8")
    assert "rcq.commands.decode" in imported_modules(source, "rcq/state_machine.py")


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
    ("from . import errors", {"rcq.errors"}),
    ("from .commands import encode", {"rcq.commands.encode"}),
    ("x = 'import os'  # import time", set()),
])
def test_imported_modules_finds_every_kind_of_import(source, expected):
    assert imported_modules(source, "rcq/state_machine.py") == expected


def test_relative_imports_resolve_against_the_right_package():
    assert imported_modules("from . import state_machine", "chaos/checker.py") == {"chaos.state_machine"}
    assert imported_modules("from .. import state_machine", "chaos/nemesis/kill.py") == {"chaos.state_machine"}
    assert imported_modules("from ..rcq import x", "chaos/a.py") == {"rcq.x"}
    assert imported_modules("from .workload import run", "chaos/__init__.py") == {"chaos.workload.run"}
    assert module_name("rcq/__init__.py") == "rcq"


CLEAN = {
    "rcq/state_machine.py": "import hashlib\nfrom rcq.commands import decode\n",
    "rcq/commands.py": "from dataclasses import dataclass\n",
    "rcq/replicator.py": "import pysyncobj\nfrom pysyncobj import SyncObj\n",
    "rcq/snapshots.py": "import lmdb\n",
    "chaos/workload.py": "from rcq.client import Client\nfrom rcq import errors\nimport rcq.errors\nimport asyncio\n",
}


def test_a_clean_tree_has_no_violations():
    assert violations(CLEAN) == []


@pytest.mark.parametrize("path, source, expected", [
    ("rcq/state_machine.py", "import time", "rcq/state_machine.py: pure module imports time"),
    ("rcq/state_machine.py", "def f():\n    from random import random\n", "pure module imports random"),
    ("rcq/commands.py", "import os.path", "rcq/commands.py: pure module imports os"),
    ("rcq/commands.py", "from threading import Lock", "pure module imports threading"),
    ("rcq/commands.py", "import uuid, socket", "pure module imports socket"),
    ("rcq/state_machine.py", "import asyncio", "pure module imports asyncio"),
    ("rcq/state_machine.py", "import aiohttp.web", "pure module imports aiohttp"),
    ("rcq/state_machine.py", "lmdb = __import__('lmdb')", "pure module imports lmdb"),
    ("rcq/server.py", "import pysyncobj", "rcq/server.py: imports pysyncobj (only rcq/replicator.py may)"),
    ("rcq/transactions.py", "from pysyncobj.batteries import ReplDict", "imports pysyncobj"),
    ("cluster/launcher.py", "import pysyncobj", "cluster/launcher.py: imports pysyncobj"),
    ("rcq/replicator.py", "import lmdb", "rcq/replicator.py: imports lmdb (only rcq/snapshots.py may)"),
    ("rcq/snapshots.py", "import pysyncobj", "rcq/snapshots.py: imports pysyncobj"),
    ("chaos/checker.py", "from rcq.state_machine import QueueStateMachine",
     "chaos/checker.py: chaos imports rcq.state_machine.QueueStateMachine"),
    ("chaos/checker.py", "from rcq import commands", "chaos imports rcq.commands"),
    ("chaos/checker.py", "import rcq.server", "chaos imports rcq.server"),
    ("chaos/checker.py", "import rcq", "chaos imports rcq "),
    ("chaos/checker.py", "import rcq.clientele", "chaos imports rcq.clientele"),
    ("chaos/nemesis/kill.py", "from ...rcq import transactions", "chaos imports rcq.transactions"),
])
def test_each_broken_rule_is_reported(path, source, expected):
    files = {**CLEAN, path: source}
    problems = violations(files)
    assert any(expected in (p + " ") for p in problems), problems
