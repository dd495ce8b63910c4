"""The history: every operation of a chaos run, one JSON object per line.

Each client operation is an ``invoke`` line followed by exactly one
completion line from the same process: ``ok`` (it happened), ``fail`` (it
definitely did not happen) or ``info`` (outcome unknown). The nemesis and
the final checks add ``info`` lines of their own (processes ``"nemesis"`` and
``"checker-input"``). A line looks like::

    {"index": 7, "time_s": 1.25, "process": 3, "type": "ok", "f": "dequeue",
     "value": {"queue": "q0", "values": ["v-3-17"]}, "error": null}

The writer flushes every line, so a harness that crashes leaves a history a
checker can still read; the reader tolerates the half-written last line such
a crash may leave, and ``pair_ops`` treats an invoke that never completed as
``info`` (unknown) — never as ``fail``.

Pure Python and json: imports nothing from rcq.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NEMESIS_PROCESS = "nemesis"
CHECKER_INPUT_PROCESS = "checker-input"
COMPLETION_TYPES = ("ok", "fail", "info")
OP_TYPES = ("invoke", *COMPLETION_TYPES)

Process = int | str


class HistoryError(ValueError):
    """The history breaks its contract (a completion without an invoke, a bad line)."""


@dataclass(frozen=True, slots=True)
class Op:
    """One line of the history."""

    index: int
    time_s: float
    process: Process
    type: str
    f: str
    value: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_client_process(process: Any) -> bool:
    """Client workers are every process but the nemesis and the checker inputs."""
    return process not in (NEMESIS_PROCESS, CHECKER_INPUT_PROCESS)


class HistoryWriter:
    """Appends ops to a JSONL file with increasing indexes and times since start.

    Safe to share between threads and asyncio tasks: each call takes a lock,
    writes one whole line and flushes it, and never awaits.
    ``complete(op, type)`` with no value records the invoke's value again,
    as Jepsen does, so every completion line stands on its own.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._clock = clock
        self._start_s = clock()
        self._lock = threading.Lock()
        self._next_index = 0
        self._open_invokes: dict[Process, Op] = {}
        self._file = self.path.open("w", encoding="utf-8")

    def invoke(self, process: Process, f: str, value: Any = None) -> Op:
        if not is_client_process(process):
            raise HistoryError(f"process {process!r} is reserved for info lines; use info()")
        with self._lock:
            if process in self._open_invokes:
                pending = self._open_invokes[process]
                raise HistoryError(f"process {process!r} invoked {f!r} while op {pending.index} ({pending.f!r}) is open")
            op = self._append_locked(process, "invoke", f, value, None)
            self._open_invokes[process] = op
            return op

    def complete(self, op: Op, type: str, value: Any = None, error: str | None = None) -> Op:
        if type not in COMPLETION_TYPES:
            raise HistoryError(f"completion type must be one of {COMPLETION_TYPES}, not {type!r}")
        with self._lock:
            if self._open_invokes.get(op.process) is not op:
                raise HistoryError(f"op {op.index} ({op.f!r} by {op.process!r}) is not open: completed twice?")
            completion = self._append_locked(op.process, type, op.f, op.value if value is None else value, error)
            del self._open_invokes[op.process]
            return completion

    def info(self, process: Process, f: str, value: Any = None, error: str | None = None) -> Op:
        """A standalone info line: nemesis events and checker inputs."""
        with self._lock:
            return self._append_locked(process, "info", f, value, error)

    def open_ops(self) -> list[Op]:
        """Invokes still waiting for their completion."""
        with self._lock:
            return sorted(self._open_invokes.values(), key=lambda op: op.index)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _append_locked(self, process: Process, type: str, f: str, value: Any, error: str | None) -> Op:
        op = Op(
            index=self._next_index,
            time_s=round(self._clock() - self._start_s, 6),
            process=process,
            type=type,
            f=f,
            value=value,
            error=error,
        )
        # Serialise before counting the index, so a value json refuses leaves no gap.
        line = json.dumps(op.to_dict(), separators=(",", ":"), ensure_ascii=False)
        self._file.write(line + "\n")
        self._file.flush()
        self._next_index += 1
        return op


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """Every op in the file; a truncated last line (a crash mid-write) is dropped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    history: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            op = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise HistoryError(f"{path}: line {number} is not JSON: {exc}") from exc
        if not isinstance(op, dict):
            raise HistoryError(f"{path}: line {number} is not a JSON object")
        history.append(op)
    return history


@dataclass(frozen=True, slots=True)
class PairedOp:
    """A client operation: its invoke and its completion.

    ``type`` is the completion's type, or ``"info"`` when the invoke never
    completed (``completion`` is then None). ``value`` is the completion's
    value, falling back to the invoke's.
    """

    process: Process
    f: str
    type: str
    invoke: dict[str, Any]
    completion: dict[str, Any] | None
    value: Any
    error: str | None

    @property
    def invoke_index(self) -> int:
        return int(self.invoke["index"])

    @property
    def invoke_time_s(self) -> float:
        return float(self.invoke["time_s"])

    @property
    def complete_index(self) -> int | None:
        return None if self.completion is None else int(self.completion["index"])

    @property
    def complete_time_s(self) -> float | None:
        return None if self.completion is None else float(self.completion["time_s"])

    @property
    def latency_s(self) -> float | None:
        end_s = self.complete_time_s
        return None if end_s is None else end_s - self.invoke_time_s


def pair_ops(history: Iterable[dict[str, Any]]) -> list[PairedOp]:
    """Client operations in invoke order, each joined to its completion.

    An invoke that never completed — or whose process invoked again before
    completing it — counts as ``info``: its outcome is unknown.
    Raises HistoryError for a completion that matches no open invoke.
    """
    pending: dict[Process, dict[str, Any]] = {}
    pairs: dict[int, PairedOp] = {}
    for op in history:
        process = op.get("process")
        if process is None or not is_client_process(process):
            continue
        op_type = op.get("type")
        if op_type == "invoke":
            if process in pending:
                _set_unknown(pairs, pending.pop(process))
            pending[process] = op
            continue
        if op_type not in COMPLETION_TYPES:
            raise HistoryError(f"op {op.get('index')}: unknown type {op_type!r}")
        invoke = pending.pop(process, None)
        if invoke is None or invoke.get("f") != op.get("f"):
            raise HistoryError(f"op {op.get('index')}: {op_type} of {op.get('f')!r} by {process!r} matches no open invoke")
        value = op.get("value")
        pairs[int(invoke["index"])] = PairedOp(
            process=process,
            f=str(op.get("f")),
            type=str(op_type),
            invoke=invoke,
            completion=op,
            value=invoke.get("value") if value is None else value,
            error=op.get("error"),
        )
    for invoke in pending.values():
        _set_unknown(pairs, invoke)
    return [pairs[index] for index in sorted(pairs)]


def _set_unknown(pairs: dict[int, PairedOp], invoke: dict[str, Any]) -> None:
    pairs[int(invoke["index"])] = PairedOp(
        process=invoke.get("process", ""),
        f=str(invoke.get("f")),
        type="info",
        invoke=invoke,
        completion=None,
        value=invoke.get("value"),
        error="no completion recorded",
    )
