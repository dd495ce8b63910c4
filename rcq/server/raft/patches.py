"""Fixes installed on pysyncobj's SyncObj class: how a follower handles append_entries.

* H5: keep log entries that match a repeated message instead of deleting and re-adding them;
* H6: bound the commit index to what the message verified, and answer "unknown" to proposals a
  received snapshot skipped;
* H8: with durability=fsync, sync the journal before a follower acknowledges and right after a
  leader appends;
* and one economy: a leader's new commit index travels with its next append_entries message (the
  next entry's, or a heartbeat brought forward to a few milliseconds) instead of one of its own.

Both are explained in docs/raft-hazards.md, and tested in tests/integration
(test_matching_entries_fix.py, test_deposed_leader_commit.py), each with a test showing what
pysyncobj does without them. ``install`` also installs the transport's fixes (H13..H15,
rcq.server.raft.transport_patches) and those of a large entry's reassembly (H14, H20,
rcq.server.raft.reassembly).

Must not import: anything of rcq's but rcq.server.raft.internals, rcq.server.raft.membership,
rcq.server.raft.reassembly and rcq.server.raft.transport_patches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj

from rcq.server.raft import membership, reassembly, transport_patches
from rcq.server.raft.internals import (
    heartbeat_within,
    journal_of,
    last_applied,
    proposals_waiting,
    replace_syncobj_method,
    set_commit_index,
    syncobj_method,
    wrap_commands_to_apply,
)

logger = logging.getLogger(__name__)


# H5 (docs/raft-hazards.md): pysyncobj's follower deletes every entry after prevLogIdx on each append_entries message
# and re-adds the message's entries, even when they match (it logs CRITICAL "truncating
# already-applied log entries" when it does). A duplicate or reordered message then leaves the
# follower with a log *shorter* than what it already acknowledged; if the leader counted those
# entries towards a commit and dies in that window, an acknowledged commit can be lost. The chaos
# harness saw the truncation 90 times in one 240 s run. Raft (§5.3) only deletes from the first
# *conflicting* entry. The fix, in this one place: the delete is deferred, and the journal's add
# keeps an entry that matches (same index and term), deletes from the first conflict, and appends
# what is new. Entries beyond the message are kept, as Raft requires; the acknowledgement still
# names only the message's last entry.
_TRUNCATE_FROM = "_rcq_truncate_from"


def _deferred_delete_entries_from(self: SyncObj, from_index: int) -> None:
    # pysyncobj calls this only on the append_entries path, right before adding the new entries.
    _guard_journal(self)
    setattr(self, _TRUNCATE_FROM, from_index)


def _guard_journal(sync_obj: SyncObj) -> None:
    journal = journal_of(sync_obj)
    if getattr(journal, "_rcq_guarded", False):
        return
    add = journal.add

    def add_keeping_matching_entries(command: Any, index: int, term: int) -> None:
        start = getattr(sync_obj, _TRUNCATE_FROM, None)
        if start is not None and len(journal) and index >= start:
            first, last = journal[0][1], journal[-1][1]
            if index < first:
                return  # inside the snapshot: committed, hence matching
            if index <= last:
                if journal[index - first][2] == term:
                    return  # the same entry: keep it
                if index <= sync_obj.raftLastApplied:
                    logger.critical("deleting applied log entries from index %d after a term conflict "
                                    "(last applied %d): this replica may have diverged",
                                    index, sync_obj.raftLastApplied)
                journal.deleteEntriesFrom(index - first)
        add(command, index, term)

    journal.add = add_keeping_matching_entries
    journal._rcq_guarded = True


# ---------------------------------------------------------------------------------------------
# A follower's commit index may only cover entries the leader has shown to be in its own log.
# Raft (Figure 2, AppendEntries step 5): commitIndex = min(leaderCommit, index of the last *new*
# entry), and only after the consistency check on prevLogIndex/prevLogTerm passed. pysyncobj
# instead sets it to min(leaderCommit, last index of the local log) at the end of every accepted
# append_entries message, including the chunks of a snapshot transfer, which carry no
# prevLogIdx and check nothing. A deposed leader still holding its own uncommitted entries then
# *applies* them as soon as the new leader starts sending it a snapshot, and the callbacks of
# those entries report success (same index, same term as proposed): the commit is acknowledged,
# then the snapshot replaces the state and the entries are gone for good (chaos seed 90413; see
# docs/raft-hazards.md, H6). The keep-matching-entries fix (H5) widens
# the same hole on the regular path: entries beyond the message are kept, unverified.
# Here, after pysyncobj has handled the message, the commit index is brought back to what the
# message verified; and proposals a received snapshot skipped are answered "unknown" (pysyncobj
# would never call them back).
def _verified_index(sync_obj: SyncObj, message: dict[str, Any], applied_before: int) -> int | None:
    """The last index an accepted append_entries message proved to match the leader's log."""
    if "prevLogIdx" in message:
        transmission = message.get("transmission")
        if transmission in ("start", "process"):
            return None  # pysyncobj returned before touching the commit index
        if transmission == "finish":
            return int(message["prevLogIdx"]) + 1  # one large entry, reassembled
        entries = message.get("entries") or ()
        return int(entries[-1][1]) if entries else int(message["prevLogIdx"])
    last_applied = int(sync_obj.raftLastApplied)
    if "serialized" in message and last_applied != applied_before:
        return last_applied  # a snapshot was installed: the log is now exactly the snapshot
    return None  # a snapshot chunk (not the last) or a heartbeat of one: nothing verified


def _bound_commit_index(sync_obj: SyncObj, verified: int | None, commit_before: int) -> None:
    commit_now = int(sync_obj.raftCommitIndex)
    if commit_now <= commit_before:
        return
    bound = max(commit_before, verified if verified is not None else 0)
    if commit_now > bound:
        set_commit_index(sync_obj, bound)


def _answer_proposals_skipped_by_snapshot(sync_obj: SyncObj, applied_before: int) -> None:
    last_applied = int(sync_obj.raftLastApplied)
    if last_applied == applied_before:
        return
    waiting = proposals_waiting(sync_obj)
    for index in [i for i in waiting if i <= last_applied]:
        for _term, callback in waiting.pop(index):
            callback(None, FAIL_REASON.UNKNOWN_OUTCOME)


def _on_message_received_with_fixes(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_message_received(self: SyncObj, node: Any, message: Any) -> Any:
        setattr(self, _TRUNCATE_FROM, None)
        is_append = isinstance(message, dict) and message.get("type") == "append_entries"
        commit_before = int(self.raftCommitIndex)
        applied_before = int(self.raftLastApplied)
        try:
            return original(self, node, message)
        finally:
            setattr(self, _TRUNCATE_FROM, None)
            if is_append:
                verified = _verified_index(self, message, applied_before)
                _bound_commit_index(self, verified, commit_before)
                _answer_proposals_skipped_by_snapshot(self, applied_before)
                membership.after_append_entries(self, verified)  # H17

    return on_message_received


class _DropMisleadingTruncationLine(logging.Filter):
    """pysyncobj logs CRITICAL before every deferred delete; with the fix nothing matching is
    deleted, and a real conflict is logged by add_keeping_matching_entries instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("truncating already-applied log entries")


# ---------------------------------------------------------------------------------------------
# H8: with rcq's DurableJournal (durability=fsync), an entry is durable before anyone counts it:
# a follower syncs before it acknowledges (every successful next_node_idx leaves through
# __sendNextNodeIdx), and a leader syncs right after appending (its no-op on election, the
# commands it picked up in _checkCommandsToApply), before the next tick counts its own log toward
# a majority. One sync covers everything appended since the last (group fsync). pysyncobj's
# FileJournal has no sync(): with durability=os these are no-ops.
ON_SYNC_FAILURE = "_rcq_on_sync_failure"  # an instance attribute the replicator sets


def _sync_journal(sync_obj: SyncObj) -> None:
    sync = getattr(journal_of(sync_obj), "sync", None)
    if sync is None:
        return
    try:
        sync()
    except OSError as exc:
        # Never acknowledge what is not durable: the exception stops this message or tick, and
        # the replicator's handler (fail-stop) decides the rest.
        on_failure = getattr(sync_obj, ON_SYNC_FAILURE, None)
        if on_failure is not None:
            on_failure(exc)
        raise


def _syncing_before_acknowledgement(original: Callable[..., Any]) -> Callable[..., Any]:
    def send_next_node_index(self: SyncObj, node: Any, reset: bool = False, nextNodeIdx: Any = None,
                             success: bool = False) -> Any:
        if success:
            _sync_journal(self)
        return original(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)

    return send_next_node_index


def _syncing_after_append(original: Callable[..., Any]) -> Callable[..., Any]:
    def append_then_sync(self: SyncObj, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _sync_journal(self)
        return result

    return append_then_sync


# Economy, not a fix: with appendEntriesUseBatch off, pysyncobj's leader sends every follower an
# append_entries message after each batch it applies, only to tell it the new commit index; the
# follower decodes it, and acknowledges it with a message the leader decodes in turn. Under load
# that doubled the Raft messages per entry (each: pickle, zlib, Fernet, a syscall on both sides),
# while the next entry's message, a few milliseconds later, carries the index anyway. Here the
# leader's next append_entries is only brought forward to COMMIT_NOTICE_DELAY_S after an apply:
# under load the next entry's message goes first and carries the index (sending it sets the next
# heartbeat a period later); when no entry follows, a heartbeat carries it that much later. A
# follower thus applies what is committed within a few milliseconds either way (``rcq backup``
# waits for that before it asks a follower: rcq.cli.backup), without a message of its own per entry.
COMMIT_NOTICE_DELAY_S = 0.005


def _commit_notice_with_the_next_message(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_log_entries(self: SyncObj) -> bool:
        applied_before = last_applied(self)
        original(self)
        if last_applied(self) != applied_before and self._isLeader():
            heartbeat_within(self, COMMIT_NOTICE_DELAY_S)
        return False

    return apply_log_entries


# Class-level patches: pysyncobj binds __onMessageReceived as a transport callback at
# construction, so they must be in place before any SyncObj is built (import time, once).
def install() -> None:
    """Patch SyncObj once (idempotent); the replicator calls it when imported."""
    if getattr(SyncObj, "_rcq_fixes_installed", False):
        return
    replace_syncobj_method("deleteEntriesFrom", _deferred_delete_entries_from)
    replace_syncobj_method("onMessageReceived", _on_message_received_with_fixes(syncobj_method("onMessageReceived")))
    replace_syncobj_method("sendNextNodeIdx", _syncing_before_acknowledgement(syncobj_method("sendNextNodeIdx")))
    replace_syncobj_method("onBecomeLeader", _syncing_after_append(syncobj_method("onBecomeLeader")))
    replace_syncobj_method("applyLogEntries", _commit_notice_with_the_next_message(syncobj_method("applyLogEntries")))
    wrap_commands_to_apply(_syncing_after_append)
    SyncObj._rcq_fixes_installed = True
    logging.getLogger("pysyncobj.syncobj").addFilter(_DropMisleadingTruncationLine())
    membership.install()  # H16
    transport_patches.install()  # H13..H15
    reassembly.install()  # H14, H20; after the above: it wraps their message handler


