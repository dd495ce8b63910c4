"""A failed chaos run's report names the INVALID checkers on its first and last lines."""

from __future__ import annotations

import pytest

from tests.helpers.chaos_runs import describe, invalid_lines, require_valid

SUMMARY = """rcq chaos run: INVALID  (seed 7)
  target=local, nodes=3
  ok      atomicity: fine
  INVALID total_queue: acknowledged 10, lost 2
  INVALID membership: not voting members in node-0's view: node-2"""


def document(valid: bool, summary: str = SUMMARY) -> dict:
    return {"valid": valid, "summary": summary, "results": {
        "atomicity": {"valid": True}, "total_queue": {"valid": valid}, "runtime": {"drain": {"complete": True}}}}


def test_the_invalid_lines_open_and_close_the_report() -> None:
    lines = describe(document(False)).splitlines()
    assert invalid_lines(document(False)) == [
        "rcq chaos run: INVALID  (seed 7)", "INVALID total_queue: acknowledged 10, lost 2",
        "INVALID membership: not voting members in node-0's view: node-2"]
    assert lines[0] == lines[-1] and "lost 2" in lines[0] and "node-2" in lines[-1]


def test_require_valid_fails_naming_the_checker_and_passes_a_valid_run() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"INVALID \(total_queue\).*lost 2"):
        require_valid(document(False), ("atomicity", "total_queue"))
    require_valid(document(True, "rcq chaos run: VALID"), ("atomicity", "total_queue"))
    assert "no checker found it INVALID" in describe(document(True, "rcq chaos run: VALID"))
