"""What a failed chaos run says in a test report: its summary, and the checkers that found it
INVALID on the first and the last line, so that the one line a CI log keeps of a failure
(pytest's short summary, or the tail of its report) names what went wrong.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

RUNTIME_CHARS_MAX = 3_000


def invalid_lines(document: dict[str, Any]) -> list[str]:
    """The summary's lines of the checkers that found the run INVALID (and its verdict line)."""
    return [line.strip() for line in str(document.get("summary", "")).splitlines()
            if line.strip().startswith("INVALID") or "chaos run: INVALID" in line]


def describe(document: dict[str, Any]) -> str:
    """The run's summary and runtime figures, its INVALID lines first and last."""
    verdict = " | ".join(invalid_lines(document)) or "no checker found it INVALID"
    runtime = json.dumps(document["results"].get("runtime", {}), default=str)[:RUNTIME_CHARS_MAX]
    return f"{verdict}\n{document['summary']}\nruntime: {runtime}\n{verdict}"


def require_valid(document: dict[str, Any], checkers: tuple[str, ...] = ()) -> None:
    """Fail the test (its report: :func:`describe`, no traceback) unless ``checkers`` and the
    whole run are valid."""
    results = document["results"]
    failed = [name for name in checkers if not results[name]["valid"]]
    if failed or not document["valid"]:
        pytest.fail(f"chaos run INVALID ({', '.join(failed) or 'overall'}): {describe(document)}", pytrace=False)
