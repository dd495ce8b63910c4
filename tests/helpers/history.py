"""Chaos histories written by hand, op by op, for the checkers' tests.

A test builds the story it checks with :class:`History` (who enqueued what, who took it out, what
the nemesis did) and gives ``History.lines`` to a checker, as the harness gives it a history file.

Must not import: a test module or a conftest; rcq (a history is plain data).
"""

from __future__ import annotations

from typing import Any


class History:
    """Builds a history line by line; every op is invoked and completed at once unless asked."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.time_s = 0.0

    def _line(self, process: Any, type: str, f: str, value: Any, error: str | None = None) -> dict[str, Any]:
        self.time_s += 0.1
        line = {"index": len(self.lines), "time_s": round(self.time_s, 3), "process": process, "type": type,
                "f": f, "value": value, "error": error}
        self.lines.append(line)
        return line

    def op(self, process: int, type: str, f: str, value: Any, invoke_value: Any = None) -> History:
        self._line(process, "invoke", f, value if invoke_value is None else invoke_value)
        self._line(process, type, f, value, None if type == "ok" else "boom")
        return self

    def invoke(self, process: int, f: str, value: Any) -> History:
        self._line(process, "invoke", f, value)
        return self

    def complete(self, process: int, type: str, f: str, value: Any) -> History:
        self._line(process, type, f, value)
        return self

    # Shorthands for the workload's verbs.
    def enqueue(self, process: int, type: str, queue: str, *values: str) -> History:
        return self.op(process, type, "enqueue", {"writes": [{"queue": queue, "values": list(values)}]})

    def dequeue(self, process: int, type: str, queue: str, *values: str) -> History:
        return self.op(process, type, "dequeue", {"queue": queue, "values": list(values)},
                       invoke_value={"queue": queue, "max": max(1, len(values))})

    def abort(self, process: int, queue: str, *values: str, head_rank: Any = None) -> History:
        value: dict[str, Any] = {"queue": queue, "values": list(values)}
        if head_rank is not None:
            value["head_rank"] = head_rank
        return self.op(process, "ok", "dequeue-abort", value, invoke_value={"queue": queue, "max": len(values)})

    def vanish(self, process: int, queue: str, *values: str) -> History:
        return self.op(process, "ok", "vanish", {"queue": queue, "values": list(values)})

    def peek(self, process: int, queue: str, value: str | None) -> History:
        return self.op(process, "ok", "peek", {"queue": queue, "value": value}, invoke_value={"queue": queue})

    def move(self, process: int, type: str, source: str, target: str, *values: str) -> History:
        return self.op(process, type, "move", {"from": source, "to": target, "values": list(values)},
                       invoke_value={"from": source, "to": target, "max": len(values)})

    def drain(self, queue: str, *values: str) -> History:
        return self.op(99, "ok", "drain", {"queue": queue, "values": list(values)}, invoke_value={"queue": queue})

    def nemesis(self, f: str, phase: str, *nodes: str, **details: Any) -> History:
        self._line("nemesis", "info", f, {"phase": phase, "nodes": list(nodes), **details})
        return self

    def checker_input(self, f: str, value: Any) -> History:
        self._line("checker-input", "info", f, value)
        return self
