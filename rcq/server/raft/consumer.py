"""The replicated entry point: pysyncobj's consumer holding the QueueStateMachine.

Its one replicated method, ``apply_command(raw)``, is the log's only entry point (replicated calls
are pickled method calls; rcq's commands travel as plain tuples, rcq.server.core.commands). It
also records whether each entry it applies was applied by the leader of that entry's own term:
the replicator answers a proposal "committed" only then (docs/raft-hazards.md, H6).

Must not import: lmdb, aiohttp.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj, SyncObjConsumer, replicated

from rcq.server.core.commands import UNREADABLE_ENTRY, ApplyFailed, ApplyResult, Command
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.internals import entry_term, is_leader
from rcq.server.raft.unreadable import entry_message, stop_unreadable

logger = logging.getLogger(__name__)


def _leads_term_of_entry(sync_obj: SyncObj, index: int) -> bool:
    """Is this node the leader of the term of its log entry ``index``, now?

    A leader of term T appended every term-T entry itself and moved its commit index only by
    counting its followers' acknowledgements, so an entry it applies while still leading T is
    committed. Any other node applying an entry it once proposed depends on the commit index a
    leader sent it; a proposal answered from there is answered "unknown" (safe: the client asks
    again and the new leader answers from the replicated outcome), never "committed".
    """
    return is_leader(sync_obj) and entry_term(sync_obj, index) == int(sync_obj.raftCurrentTerm)


class QueueConsumer(SyncObjConsumer):  # type: ignore[misc]  # pysyncobj ships no types: its base is Any
    """Holds the state machine; its one replicated method is the log's only entry point.

    A consumer rather than a SyncObj subclass: it is complete before SyncObj
    starts the tick thread, which may replay the journal into it at once.
    Replicated calls are pickled method calls, so the log carries only
    ``apply_command(raw)`` with our own plain-tuple encoding (rcq.server.core.commands).
    """

    def __init__(self, state_machine: QueueStateMachine, lock: threading.Lock,
                 on_applied: Callable[[int, Command | None, ApplyResult], None], node_id: str = "?") -> None:
        super().__init__()
        self._node_id = node_id
        self._state_machine = state_machine
        self._lock = lock
        self._on_applied = on_applied
        # Whether the entry applied last was applied by the leader of its own term. pysyncobj
        # calls a proposal's callback right after applying the proposal's entry, so the submit
        # callback reads this for its own entry (both on the tick thread).
        self.applied_by_its_leader = False

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj's, untyped: the method is called as replicated
    def apply_command(self, raw: Any) -> ApplyResult:
        # raftLastApplied is incremented only after this returns, so +1 is the
        # index of the entry being applied.
        index = self._syncObj.raftLastApplied + 1
        self.applied_by_its_leader = _leads_term_of_entry(self._syncObj, index)
        # H2: an exception escaping a replicated method is re-applied on every
        # tick for ever and wedges the node (on every node, if deterministic).
        # sm.apply never raises; this guard is for the lock or a future bug.
        try:
            with self._lock:
                command, result = self._state_machine.decode_and_apply(raw, index)
        except Exception as exc:
            logger.exception("apply of entry %d raised", index)
            command, result = None, ApplyFailed(reason="apply_error", details={"error": repr(exc)})
        if isinstance(result, ApplyFailed) and result.reason == UNREADABLE_ENTRY:
            stop_unreadable(self._node_id, entry_message(index, result.details))  # never skip it: diverging
        self._on_applied(index, command, result)
        return result


# ------------------------------------------------------------- the replicator
