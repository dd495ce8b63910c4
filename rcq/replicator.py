"""RaftReplicator: the :class:`~rcq.replication.Replicator` protocol on pysyncobj 0.3.17.

Responsibility: propose encoded commands through Raft on the leader, apply
committed entries to the :class:`~rcq.state_machine.QueueStateMachine`, bridge
results and leadership changes from pysyncobj's tick thread to the asyncio
loop, snapshot through :mod:`rcq.snapshots`, and repair what a crash in the
middle of a log compaction leaves behind.

Threads: pysyncobj's own tick thread (``autoTick``) applies entries, runs
callbacks and writes snapshots; everything public here is called on the event
loop's thread. The state machine is guarded by one lock shared by apply,
snapshot restore and :meth:`RaftReplicator.read`.

Every workaround below names its hazard in docs/raft-hazards.md (H1..H12),
which says what pysyncobj does, why it matters and what rcq does about it.

This is the only module that imports pysyncobj. Must not import: lmdb (use
rcq.snapshots), aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pysyncobj import (
    FAIL_REASON,
    SERIALIZER_STATE,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    SyncObjException,
    replicated,
)
from pysyncobj.journal import FileJournal

from rcq.commands import ApplyFailed, ApplyResult, Command, encode
from rcq.config import NodeConfig
from rcq.errors import CommitOutcomeUnknown, InvalidRequest, LeaderChanged, NoLeader, NotLeader, Unavailable
from rcq.replication import ApplyListener, RaftStatus, RoleListener
from rcq.snapshots import (
    ForkingSnapshotWriter,
    SnapshotState,
    read_raft_data,
    remove_stale_files,
    replace_durably,
)
from rcq.state_machine import QueueStateMachine

logger = logging.getLogger(__name__)

T = TypeVar("T")

ROLE_POLL_INTERVAL_S = 0.05
# A bind that keeps failing (port taken) fails start() after about 5 s instead of
# pysyncobj's default of retrying for ever.
BIND_RETRY_INTERVAL_S = 0.5
BIND_RETRIES_MAX = 10
SNAPSHOT_CHILD_WAIT_S = 60.0

_ROLE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}
_SNAPSHOT_STATES = {
    SnapshotState.IDLE: SERIALIZER_STATE.NOT_SERIALIZING,
    SnapshotState.WRITING: SERIALIZER_STATE.SERIALIZING,
    SnapshotState.SUCCEEDED: SERIALIZER_STATE.SUCCESS,
    SnapshotState.FAILED: SERIALIZER_STATE.FAILED,
}
_FAIL_REASON_NAMES = {value: name for name, value in vars(FAIL_REASON).items() if name.isupper()}


# ------------------------------------------------------------------ consumer
# ---------------------------------------------------------------------------------------------
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
    journal = sync_obj._SyncObj__raftLog  # type: ignore[attr-defined]
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
# docs/raft-hazards.md, H6). The keep-matching-entries fix above widens
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


def _bound_commit_index(sync_obj: SyncObj, message: dict[str, Any], commit_before: int,
                        applied_before: int) -> None:
    commit_now = int(sync_obj.raftCommitIndex)
    if commit_now <= commit_before:
        return
    verified = _verified_index(sync_obj, message, applied_before)
    bound = max(commit_before, verified if verified is not None else 0)
    if commit_now > bound:
        sync_obj._SyncObj__raftCommitIndex = bound  # type: ignore[attr-defined]
        sync_obj._SyncObj__raftLog.setRaftCommitIndex(bound)  # type: ignore[attr-defined]


def _answer_proposals_skipped_by_snapshot(sync_obj: SyncObj, applied_before: int) -> None:
    last_applied = int(sync_obj.raftLastApplied)
    if last_applied == applied_before:
        return
    waiting = sync_obj._SyncObj__commandsWaitingCommit  # type: ignore[attr-defined]
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
                _bound_commit_index(self, message, commit_before, applied_before)
                _answer_proposals_skipped_by_snapshot(self, applied_before)

    return on_message_received


class _DropMisleadingTruncationLine(logging.Filter):
    """pysyncobj logs CRITICAL before every deferred delete; with the fix nothing matching is
    deleted, and a real conflict is logged by add_keeping_matching_entries instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("truncating already-applied log entries")


# Class-level patches: pysyncobj binds __onMessageReceived as a transport callback at
# construction, so they must be in place before any SyncObj is built (import time, once).
if not getattr(SyncObj, "_rcq_matching_entries_fix", False):
    SyncObj._SyncObj__deleteEntriesFrom = _deferred_delete_entries_from  # type: ignore[attr-defined]
    SyncObj._SyncObj__onMessageReceived = _on_message_received_with_fixes(  # type: ignore[attr-defined]
        SyncObj._SyncObj__onMessageReceived)  # type: ignore[attr-defined]
    SyncObj._rcq_matching_entries_fix = True  # type: ignore[attr-defined]
    logging.getLogger("pysyncobj.syncobj").addFilter(_DropMisleadingTruncationLine())


def _leads_term_of_entry(sync_obj: SyncObj, index: int) -> bool:
    """Is this node the leader of the term of its log entry ``index``, now?

    A leader of term T appended every term-T entry itself and moved its commit index only by
    counting its followers' acknowledgements, so an entry it applies while still leading T is
    committed. Any other node applying an entry it once proposed depends on the commit index a
    leader sent it; a proposal answered from there is answered "unknown" (safe: the client asks
    again and the new leader answers from the replicated outcome), never "committed".
    """
    if not sync_obj._isLeader():
        return False
    journal = _journal_of(sync_obj)
    position = index - int(journal[0][1]) if len(journal) else -1
    if not 0 <= position < len(journal):
        return False
    return int(journal[position][2]) == int(sync_obj.raftCurrentTerm)


class _QueueConsumer(SyncObjConsumer):
    """Holds the state machine; its one replicated method is the log's only entry point.

    A consumer rather than a SyncObj subclass: it is complete before SyncObj
    starts the tick thread, which may replay the journal into it at once.
    Replicated calls are pickled method calls, so the log carries only
    ``apply_command(raw)`` with our own plain-tuple encoding (rcq.commands).
    """

    def __init__(self, state_machine: QueueStateMachine, lock: threading.Lock,
                 on_applied: Callable[[int, Any, ApplyResult], None]) -> None:
        super().__init__()
        self._state_machine = state_machine
        self._lock = lock
        self._on_applied = on_applied
        # Whether the entry applied last was applied by the leader of its own term. pysyncobj
        # calls a proposal's callback right after applying the proposal's entry, so the submit
        # callback reads this for its own entry (both on the tick thread).
        self.applied_by_its_leader = False

    @replicated
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
                result: ApplyResult = self._state_machine.apply(raw, index)
        except Exception as exc:
            logger.exception("apply of entry %d raised", index)
            result = ApplyFailed(reason="apply_error", details={"error": repr(exc)})
        self._on_applied(index, raw, result)
        return result


# ------------------------------------------------------ start-up journal repair
@dataclasses.dataclass(frozen=True, slots=True)
class CompactionRepair:
    """What :func:`repair_interrupted_compaction` found and did."""

    removed_files: tuple[str, ...] = ()
    snapshot_last_index: int | None = None
    journal_first_index: int | None = None  # before the repair
    dropped_entries: int = 0
    # False: pysyncobj will replace the journal by the snapshot's two entries on load
    journal_matches_snapshot: bool = True


def repair_interrupted_compaction(journal_path: str | os.PathLike[str],
                                  snapshot_path: str | os.PathLike[str]) -> CompactionRepair:
    """Finish a log compaction that a crash interrupted, before pysyncobj opens the files.

    H1 (docs/raft-hazards.md): compaction renames the new snapshot into place and only then trims the
    journal so that it starts at the snapshot's previous entry. After a crash
    between the two, pysyncobj sees ``journal[0:2] != (prevEntry, lastEntry)``
    on load and clears the whole journal, entries after the snapshot included:
    acknowledged writes are lost and replicas diverge. Here, if the journal
    holds exactly the snapshot's two entries further in, the entries before them
    are dropped, which is the trim the crash prevented. Any other mismatch (a
    journal behind or diverging from the snapshot) is left for pysyncobj to
    reset, which is right then. Also removes temporary files of an interrupted
    snapshot write or transfer.
    """
    journal_path, snapshot_path = os.fspath(journal_path), os.fspath(snapshot_path)
    removed = tuple(remove_stale_files(snapshot_path))
    if not (os.path.isfile(snapshot_path) and os.path.isfile(journal_path)):
        return CompactionRepair(removed_files=removed)
    last_entry, previous_entry = read_raft_data(snapshot_path)[:2]
    entries = _read_journal(journal_path)
    report = CompactionRepair(removed_files=removed, snapshot_last_index=last_entry[1],
                              journal_first_index=entries[0][1] if entries else None)
    if entries[:2] == [previous_entry, last_entry]:
        return report
    position = previous_entry[1] - entries[0][1] if entries else -1
    if 0 < position < len(entries) - 1 and entries[position:position + 2] == [previous_entry, last_entry]:
        _rewrite_journal(journal_path, entries[position:])
        logger.warning("finished an interrupted log compaction: dropped %d journal entries before %d",
                       position, previous_entry[1])
        return dataclasses.replace(report, dropped_entries=position)
    logger.warning("journal (entries %s..%s) does not contain snapshot entries %d..%d: "
                   "pysyncobj will restart the log from the snapshot",
                   report.journal_first_index, entries[-1][1] if entries else None,
                   previous_entry[1], last_entry[1])
    return dataclasses.replace(report, journal_matches_snapshot=False)


@contextlib.contextmanager
def _quiet_journal_open() -> Iterator[None]:
    """Open pysyncobj journals without its ResourceWarning.

    FileJournal's MetaStorer reads ``<journal>.meta`` with ``open(path).read()``
    and never closes the file; the warning fires at once (refcounting), inside
    the constructor. Harmless, but fatal under ``-W error`` (our pytest config).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ResourceWarning)
        yield


def _read_journal(journal_path: str) -> list[tuple[Any, int, int]]:
    with _quiet_journal_open():
        journal = FileJournal(journal_path)
    try:
        return [journal[i] for i in range(len(journal))]
    finally:
        journal._destroy()


def _rewrite_journal(journal_path: str, entries: list[tuple[Any, int, int]]) -> None:
    # A new file renamed over the old one: pysyncobj's own deleteEntriesTo
    # rewrites in place, and a crash inside it would lose the journal's tail.
    temporary = journal_path + ".repair"
    with contextlib.suppress(FileNotFoundError):
        os.remove(temporary)
    journal = FileJournal(temporary)
    try:
        for command, index, term in entries:
            journal.add(command, index, term)
    finally:
        journal._destroy()
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    replace_durably(temporary, journal_path)


# ------------------------------------------------------------- the replicator
def _check_bindable(raft_address: str) -> None:
    """Fail fast and clearly when the Raft port is taken.

    pysyncobj would retry the bind in its tick thread (for ever by default, here
    BIND_RETRIES_MAX times) and leak a socket per failed attempt.
    """
    host, port = raft_address.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as pysyncobj binds
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            raise Unavailable(f"cannot bind the Raft address {raft_address}: {exc.strerror}") from exc


def _resolve(future: asyncio.Future[tuple[Any, int]], result: Any, fail_reason: int) -> None:
    """Complete a submit's future on the loop; must never raise (H2)."""
    if not future.done():  # e.g. cancelled by the submit's timeout
        future.set_result((result, fail_reason))


def _journal_of(sync_obj: SyncObj) -> Any:
    """The ONLY access to pysyncobj's private state: its FileJournal, to msync it and size it.

    pysyncobj never fsyncs or msyncs its journal (H8); FileJournal.flush()
    does (mmap.flush). pysyncobj triggers compaction by entry count only, while
    it keeps every entry in RAM and in the mmap'd journal: the journal's byte
    offset is what bounds that memory. Called from the tick thread only, which
    owns the journal.
    """
    return sync_obj._SyncObj__raftLog


def _journal_bytes(journal: Any) -> int:
    return int(getattr(journal, "_FileJournal__currentOffset", 0))


class RaftReplicator:
    """One node's Raft replication of a QueueStateMachine. Started once, stopped once."""

    def __init__(self, config: NodeConfig, state_machine: QueueStateMachine, *, auto_tick: bool = True) -> None:
        """``auto_tick=False`` runs no tick thread: the caller drives Raft with :meth:`tick`, on the
        loop's thread. Deterministic tests use it to play an exact sequence of Raft events."""
        if config.cluster_secret is None and not config.insecure:
            # H10: without a password any peer message is unpickled: RCE.
            raise InvalidRequest("cluster_secret is required (Raft traffic is pickled and would "
                                 "run code for anyone reaching the port); set insecure only for development")
        self._config = config
        self._state_machine = state_machine
        self._auto_tick = auto_tick
        self._lock = threading.Lock()
        self._consumer = _QueueConsumer(state_machine, self._lock, self._on_applied)
        self._peer_urls = config.peer_url_by_raft_address()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_obj: SyncObj | None = None
        self._writer: ForkingSnapshotWriter | None = None
        self._role_task: asyncio.Task[None] | None = None
        self._role_listener: RoleListener | None = None
        self._apply_listener: ApplyListener | None = None
        self._reported_role: tuple[bool, int] | None = None
        self._pending: set[asyncio.Future[tuple[Any, int]]] = set()
        self._stopped = False
        self._next_journal_flush_s = 0.0
        self._snapshot_loads_at_start = 0  # pysyncobj loads an existing snapshot once, at its first tick
        self.repair: CompactionRepair | None = None  # what start() repaired, for logs and tests

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._sync_obj is not None or self._stopped:
            raise RuntimeError("a RaftReplicator starts once; make a new one to restart")
        self._loop = asyncio.get_running_loop()
        _check_bindable(self._config.raft_address)
        self._writer = ForkingSnapshotWriter(self._state_machine, self._config.snapshot_path, self._lock)
        conf = self._build_conf(self._writer)
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        self.repair = repair_interrupted_compaction(self._config.journal_path, self._config.snapshot_path)
        self._snapshot_loads_at_start = int(self._config.snapshot_path.is_file())
        # Constructed on the loop's thread: pysyncobj's tick thread stops when the
        # thread that built SyncObj ends, and the loop's thread lives as long as we do.
        with _quiet_journal_open():
            self._sync_obj = SyncObj(self._config.raft_address, [p.raft_address for p in self._config.peers],
                                     conf=conf, consumers=[self._consumer])
        try:
            if self._auto_tick:
                await asyncio.to_thread(self._sync_obj.waitBinded)
            else:
                self.tick()  # binds the Raft port
        except SyncObjException as exc:
            await self.stop()
            raise Unavailable(f"cannot bind the Raft address {self._config.raft_address}") from exc
        if self._config.journal_flush_interval_s is not None:
            self._sync_obj.addOnTickCallback(self._flush_journal_if_due)
        self._sync_obj.addOnTickCallback(self._compact_if_journal_large)
        self._role_task = self._loop.create_task(self._poll_role(), name="rcq-raft-role")

    def _build_conf(self, writer: ForkingSnapshotWriter) -> SyncObjConf:
        config = self._config
        conf = SyncObjConf(
            password=config.cluster_secret,  # H10: encrypts and authenticates peers
            bindAddress=config.raft_address,  # pysyncobj would otherwise bind 0.0.0.0
            autoTick=self._auto_tick,
            autoTickPeriod=config.auto_tick_period_s,
            # Mandatory: without it acked writes and terms are lost (the unsafe option exists
            # only so the chaos harness can show that it catches exactly that loss).
            journalFile=None if config.unsafe_memory_journal else str(config.journal_path),
            fullDumpFile=str(config.snapshot_path),
            # H9: snapshots written in the tick thread stop heartbeats; fork instead.
            serializer=writer.serialize,
            serializeChecker=lambda: _SNAPSHOT_STATES[writer.check()],
            deserializer=writer.deserialize,
            # Group commit already packs concurrent commits into one entry; sending each entry
            # at once (a pipe wakes the tick thread) saves up to a whole period of latency.
            appendEntriesUseBatch=config.append_entries_batched,
            appendEntriesPeriod=config.append_entries_period_s,
            raftMinTimeout=config.raft_min_timeout_s,
            raftMaxTimeout=config.raft_max_timeout_s,
            # H3: below raftMinTimeout, so a partitioned leader steps down before a new one exists.
            leaderFallbackTimeout=config.leader_fallback_timeout_s,
            connectionTimeout=config.connection_timeout_s,
            # Only the node with the greater address dials; after a peer restarts it
            # redials every connectionRetryTime (default 5 s). One election timeout
            # keeps a restarted peer's return about as fast as a failover.
            connectionRetryTime=config.raft_min_timeout_s,
            commandsQueueSize=config.commands_queue_size,
            # H7 / DESIGN: no leader means fail now, not a command applied after our timeout.
            commandsWaitLeader=False,
            logCompactionMinEntries=config.log_compaction_min_entries,
            logCompactionMinTime=config.log_compaction_min_time_s,
            # Not split: pysyncobj's split makes a node wait for its time slot (up to
            # logCompactionMinTime, 300 s) even past the entry threshold or when forced, while
            # the log grows in RAM. Snapshots are written by a forked child, so nodes
            # snapshotting at the same time cost CPU, not heartbeats.
            logCompactionSplit=False,
            dynamicMembershipChange=False,  # H11
            onStateChanged=self._on_state_changed,
            bindRetryTime=BIND_RETRY_INTERVAL_S,
            maxBindRetries=BIND_RETRIES_MAX,
        )
        try:
            conf.validate()
        except AssertionError as exc:
            raise InvalidRequest("the Raft settings are inconsistent (raft_min_timeout_s must exceed "
                                 "3 x append_entries_period_s, leader_fallback_timeout_s must exceed "
                                 "append_entries_period_s)") from exc
        return conf

    async def stop(self) -> None:
        """Stop Raft, join its thread, wait for a snapshot child; pending submits end as unknown."""
        if self._stopped:
            return
        self._stopped = True
        if self._role_task is not None:
            self._role_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._role_task
        if self._sync_obj is not None:
            if self._auto_tick:
                await asyncio.to_thread(self._sync_obj.destroy_synchronous)
            else:
                self._sync_obj.destroy()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close, SNAPSHOT_CHILD_WAIT_S)
        for future in list(self._pending):
            _resolve(future, None, FAIL_REASON.UNKNOWN_OUTCOME)

    def tick(self) -> None:
        """One pysyncobj tick on this thread (only with ``auto_tick=False``): receive what the
        sockets hold, apply what is committed, propose what was submitted."""
        sync_obj, _loop = self._running()
        if self._auto_tick:
            raise RuntimeError("tick() is for a replicator started with auto_tick=False")
        sync_obj.doTick(0.0)

    # -------------------------------------------------------------- submit
    async def submit(self, command: Command, timeout_s: float) -> ApplyResult:
        return await self._submit_raw(encode(command), timeout_s)

    async def _submit_raw(self, raw: Any, timeout_s: float) -> ApplyResult:
        """Propose an already encoded entry (tests use it to feed malformed entries)."""
        sync_obj, loop = self._running()
        if not sync_obj._isLeader():
            # H7: never let pysyncobj forward to the leader; a forwarded command's
            # outcome can only be "unknown".
            raise self._not_leader_error()
        future: asyncio.Future[tuple[Any, int]] = loop.create_future()

        def on_done(result: Any, fail_reason: int) -> None:
            # Tick thread, or this thread for QUEUE_FULL (pysyncobj calls back
            # synchronously then); call_soon_threadsafe is right for both.
            if fail_reason == FAIL_REASON.SUCCESS and not self._consumer.applied_by_its_leader:
                # Raft's rule: only the leader that proposed an entry, still leading that term,
                # answers "committed" for it (see _leads_term_of_entry).
                fail_reason = FAIL_REASON.UNKNOWN_OUTCOME
            try:
                loop.call_soon_threadsafe(_resolve, future, result, fail_reason)
            except RuntimeError:  # loop closed: never raise into pysyncobj (H2)
                pass

        self._pending.add(future)
        try:
            self._consumer.apply_command(raw, callback=on_done)
            # Callbacks are not guaranteed to fire (H7): always bound the wait.
            result, fail_reason = await asyncio.wait_for(future, timeout_s)
        except TimeoutError as exc:
            raise CommitOutcomeUnknown(f"no commit answer within {timeout_s} s; the entry may "
                                       "still commit") from exc
        finally:
            self._pending.discard(future)
        if fail_reason == FAIL_REASON.SUCCESS:
            return result  # type: ignore[no-any-return]
        raise self._error_for(fail_reason)

    def _error_for(self, fail_reason: int) -> Exception:
        if fail_reason == FAIL_REASON.QUEUE_FULL:
            return Unavailable("the Raft command queue is full; retry shortly")
        if fail_reason == FAIL_REASON.MISSING_LEADER:
            return NoLeader()
        if fail_reason == FAIL_REASON.NOT_LEADER:
            return self._not_leader_error()
        if fail_reason == FAIL_REASON.DISCARDED:
            # H7: the entry's log slot went to another leader's entry.
            return LeaderChanged("the leader changed before the commit; it was not applied")
        name = _FAIL_REASON_NAMES.get(fail_reason, str(fail_reason))
        return CommitOutcomeUnknown(f"Raft reported {name}; the commit may still apply")

    def _not_leader_error(self) -> Exception:
        leader = self.leader_raft_address()
        if leader is None or leader == self._config.raft_address:
            return NoLeader()
        return NotLeader(f"this node is not the leader; {leader} is", leader_url=self._peer_urls.get(leader))

    def _running(self) -> tuple[SyncObj, asyncio.AbstractEventLoop]:
        if self._sync_obj is None or self._loop is None or self._stopped:
            raise Unavailable("the replicator is not running")
        return self._sync_obj, self._loop

    # ------------------------------------------------------------- queries
    def read(self, reader: Callable[[QueueStateMachine], T]) -> T:
        with self._lock:
            return reader(self._state_machine)

    def is_leader(self) -> bool:
        return self._sync_obj is not None and not self._stopped and bool(self._sync_obj._isLeader())

    @property
    def term(self) -> int:
        return int(self._sync_obj.raftCurrentTerm) if self._sync_obj is not None else 0

    def leader_raft_address(self) -> str | None:
        if self._sync_obj is None or self._stopped:
            return None
        leader = self._sync_obj._getLeader()
        return str(leader) if leader is not None else None

    def request_snapshot(self) -> None:
        if self._sync_obj is not None and not self._stopped:
            self._sync_obj.forceLogCompaction()  # sets a flag the tick thread reads: thread-safe

    def status(self) -> RaftStatus:
        writer = self._writer
        written = writer.written_count if writer is not None else 0
        loaded = writer.loaded_count if writer is not None else 0
        received = max(0, loaded - self._snapshot_loads_at_start)
        if self._sync_obj is None or self._stopped:
            return RaftStatus(role="follower", term=self.term, leader_raft_address=None, commit_index=0,
                              last_applied=0, log_length=0, has_quorum=False, snapshot_count=written + received,
                              details={"running": False})
        raw = self._raw_status(self._sync_obj)
        details: dict[str, Any] = {
            key: value for key, value in raw.items()
            if key.startswith(("partner_node_status_server_", "match_idx_server_", "next_node_idx_server_"))
        }
        details.update(running=True, ready=bool(self._sync_obj.isReady()), snapshots_written=written,
                       snapshots_received=received, snapshots_loaded=loaded,
                       leader_commit_index=raw.get("leader_commit_idx"), uptime_s=raw.get("uptime"))
        leader = raw.get("leader")
        return RaftStatus(
            role=_ROLE_NAMES.get(raw["state"], str(raw["state"])),
            term=int(raw["raft_term"]),
            leader_raft_address=str(leader) if leader is not None else None,
            commit_index=int(raw["commit_idx"]),
            last_applied=int(raw["last_applied"]),
            log_length=int(raw["log_len"]),
            has_quorum=bool(raw["has_quorum"]),
            snapshot_count=written + received,
            details=details,
        )

    @staticmethod
    def _raw_status(sync_obj: SyncObj) -> dict[str, Any]:
        # getStatus() iterates dicts the tick thread may resize (leader change):
        # a RuntimeError there is a torn read, so read again.
        for _ in range(10):
            try:
                return dict(sync_obj.getStatus())
            except RuntimeError:
                time.sleep(0)
        return dict(sync_obj.getStatus())

    # ------------------------------------------------------------ listeners
    def set_role_listener(self, listener: RoleListener) -> None:
        self._role_listener = listener

    def set_apply_listener(self, listener: ApplyListener) -> None:
        self._apply_listener = listener

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        # Tick thread. Only a nudge: the loop reads the role itself, and the poll
        # covers changes pysyncobj does not report (a term change as follower).
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(self._check_role)

    async def _poll_role(self) -> None:
        while True:
            self._check_role()
            await asyncio.sleep(ROLE_POLL_INTERVAL_S)

    def _check_role(self) -> None:
        if self._sync_obj is None or self._stopped:
            return
        role = (bool(self._sync_obj._isLeader()), int(self._sync_obj.raftCurrentTerm))
        if role == self._reported_role:
            return
        self._reported_role = role
        if self._role_listener is not None:
            try:
                self._role_listener(*role)
            except Exception:
                logger.exception("role listener failed")

    def _on_applied(self, index: int, raw: Any, result: ApplyResult) -> None:
        # Tick thread, inside apply; must never raise (H2). Scheduled before
        # pysyncobj runs the submit's callback, so the loop sees this entry
        # before the submit returns (FIFO of call_soon_threadsafe).
        loop, listener = self._loop, self._apply_listener
        if loop is None or listener is None:
            return
        with contextlib.suppress(RuntimeError):  # loop closed
            loop.call_soon_threadsafe(self._deliver_applied, listener, index, raw, result)

    @staticmethod
    def _deliver_applied(listener: ApplyListener, index: int, raw: Any, result: ApplyResult) -> None:
        try:
            listener(index, raw, result)
        except Exception:
            logger.exception("apply listener failed on entry %d", index)

    def _compact_if_journal_large(self) -> None:
        # Tick thread. Entries carry items, so 50k entries can be gigabytes: snapshot by size too.
        sync_obj = self._sync_obj
        if sync_obj is None:
            return
        try:
            if _journal_bytes(_journal_of(sync_obj)) > self._config.log_compaction_bytes:
                sync_obj.forceLogCompaction()
        except Exception:  # never end a tick with an exception
            logger.exception("journal size check failed")

    def _flush_journal_if_due(self) -> None:
        # Tick thread (an on-tick callback), so it never races the journal's writes.
        now = time.monotonic()
        if now < self._next_journal_flush_s or self._sync_obj is None:
            return
        interval_s = self._config.journal_flush_interval_s or 0.0
        self._next_journal_flush_s = now + interval_s
        try:
            _journal_of(self._sync_obj).flush()
        except Exception:  # an exception here would end this tick; log and go on
            logger.exception("journal flush failed")
