"""rcq's version: the package version in pyproject.toml, as the installed metadata has it.

The version moves with every release and every format change (docs/upgrades.md). A checkout run
without being installed (``PYTHONPATH=...``) reads pyproject.toml beside the package instead.

Must not import: rcq.server, aiohttp.
"""

from __future__ import annotations

import functools
import importlib.metadata
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@functools.cache
def rcq_version() -> str:
    """This code's version, e.g. ``0.2.0``."""
    if PYPROJECT.is_file():  # a checkout: its own pyproject.toml is the truth (an installed copy may be stale)
        with open(PYPROJECT, "rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    return importlib.metadata.version("rcq")
