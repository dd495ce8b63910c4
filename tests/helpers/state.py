"""The state machine as a replica sees it, for the state machine's tests.

:class:`Node` is one replica's :class:`QueueStateMachine` fed encoded commands at increasing log
indices (as pysyncobj would); ``tx`` and ``unit`` build what a commit carries; the rest are views
of a machine's state for comparing two machines, and a restore through a snapshot's encoding.

Must not import: a test module or a conftest; pysyncobj, lmdb (the core is pure).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

from rcq.server.core.commands import (
    ApplyResult,
    Barrier,
    BatchResult,
    CommitBatch,
    CommitUnit,
    EnqueuedRange,
    TransactionWrite,
    UnitOutcome,
    encode,
)
from rcq.server.core.state_machine import QueueStateMachine


# ------------------------------------------------------------------ commands
def tx(transaction_id: str, enqueue: Iterable[tuple[str, Sequence[bytes]]] = (),
       dequeue: Iterable[tuple[str, Sequence[int]]] = ()) -> TransactionWrite:
    return TransactionWrite(
        transaction_id,
        enqueues=tuple((q, tuple(values)) for q, values in enqueue),
        dequeues=tuple((q, tuple(ids)) for q, ids in dequeue),
    )


def unit(*transactions: TransactionWrite, key: str | None = None) -> CommitUnit:
    return CommitUnit(tuple(transactions), key)


def to_lists(value: Any) -> Any:
    """What a JSON- or msgpack-like serializer gives back: every tuple becomes a list."""
    if isinstance(value, tuple):
        return [to_lists(v) for v in value]
    return value


# ------------------------------------------------------------------ a replica
class Node:
    """One replica's state machine, fed encoded commands at increasing log indices."""

    def __init__(self, machine: QueueStateMachine | None = None) -> None:
        self.sm = machine if machine is not None else QueueStateMachine()
        self.index = self.sm.last_index
        self.term = 1
        self.now_ms = 0

    def apply_raw(self, raw: Any, index: int | None = None) -> ApplyResult:
        self.index = self.index + 1 if index is None else index
        return self.sm.apply(raw, self.index)

    def commit(self, *units: CommitUnit, term: int | None = None, now_ms: int | None = None,
               index: int | None = None) -> tuple[UnitOutcome, ...]:
        batch = CommitBatch(self.term if term is None else term,
                            self.now_ms if now_ms is None else now_ms, tuple(units))
        result = self.apply_raw(encode(batch), index)
        assert isinstance(result, BatchResult), result
        assert len(result.outcomes) == len(units)
        return result.outcomes

    def commit_one(self, unit_: CommitUnit, **kwargs: Any) -> UnitOutcome:
        (outcome,) = self.commit(unit_, **kwargs)
        return outcome

    def barrier(self, term: int, now_ms: int | None = None) -> ApplyResult:
        self.term = term
        return self.apply_raw(encode(Barrier(term, self.now_ms if now_ms is None else now_ms)))

    def enqueue(self, queue: str, *values: bytes, tid: str | None = None) -> EnqueuedRange:
        outcome = self.commit_one(unit(tx(tid or f"enq-{self.index + 1}", [(queue, values)])))
        assert outcome.status == "committed", outcome
        (enqueued,) = outcome.enqueued
        return enqueued


# ------------------------------------------------------------------ views and snapshots
def replicated_state(sm: QueueStateMachine, *ignore: str) -> tuple[Any, ...]:
    """The whole replicated state, minus the meta fields named in ``ignore``."""
    meta = {k: v for k, v in sm.snapshot_meta().items() if k not in ignore}
    return meta, list(sm.snapshot_items())


PLAIN_SCALARS = (int, str, type(None))


def assert_plain(value: Any, where: str = "meta") -> None:
    if isinstance(value, (list, tuple)):
        assert type(value) in (list, tuple), f"{where}: {type(value).__name__}"
        for i, element in enumerate(value):
            assert_plain(element, f"{where}[{i}]")
    else:
        assert type(value) in PLAIN_SCALARS, f"{where} = {value!r} ({type(value).__name__}) is not plain"


def assert_plain_meta(meta: Any) -> None:
    assert type(meta) is dict
    for key, value in meta.items():
        assert type(key) is str
        assert_plain(value, key)


def round_trip_meta(meta: dict[str, Any], via: str) -> dict[str, Any]:
    if via == "json":
        return json.loads(json.dumps(meta))
    if via == "pickle":
        return pickle.loads(pickle.dumps(meta))
    return meta


def restored_copy(sm: QueueStateMachine, via: str = "pickle",
                  into: QueueStateMachine | None = None) -> QueueStateMachine:
    meta = round_trip_meta(sm.snapshot_meta(), via)
    items = pickle.loads(pickle.dumps(list(sm.snapshot_items())))
    fresh = into if into is not None else QueueStateMachine()
    fresh.restore(meta, iter(items))
    return fresh
