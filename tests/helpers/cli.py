"""The ``rcq`` command run by the tests: ``rcq.cli.main`` in a thread, its output captured.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import asyncio

import pytest

from rcq.cli import main


async def rcq(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``rcq ARGV...`` (its own event loop, in a thread); return (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err
