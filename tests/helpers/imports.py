"""What a Python source imports, read with ``ast``: for the architecture rules and the suite's rules.

Every import statement counts, wherever it is (inside functions, under ``if TYPE_CHECKING:``, in
``try:``), and so do ``__import__("x")`` and ``importlib.import_module("x")`` with a literal name.

Must not import: a test module or a conftest; rcq (this reads source, it runs none).
"""

from __future__ import annotations

import ast
from pathlib import PurePosixPath


def module_name(path: str) -> str:
    """'rcq/server/core/state_machine.py' -> 'rcq.server.core.state_machine'; 'chaos/__init__.py' -> 'chaos'."""
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
