"""RaftReplicator: the :class:`~rcq.server.raft.protocol.Replicator` protocol on pysyncobj 0.3.17.

Why over 400 lines: the Replicator protocol on pysyncobj is one class; the jobs that split off are already its collaborators.

Responsibility: propose encoded commands through Raft on the leader, apply
committed entries to the :class:`~rcq.server.core.state_machine.QueueStateMachine`, bridge
results and leadership changes from pysyncobj's tick thread to the asyncio
loop, and answer each proposal by Raft's rule (H6). It owns three collaborators, each with one
job: ``requests`` (the way from the loop's thread to the tick thread and back, and what each fail
reason means), ``hand_over`` (leadership hand-over, H19, and the gate that holds proposals
meanwhile), ``log_upkeep`` (the Raft log on disk while running: which journal, fail-stop on a
failed sync, flush, compaction by size). Its other neighbours: ``patches`` (fixes on pysyncobj's
class), ``internals`` (every access to pysyncobj's private state), ``journal`` (start-up repair),
``settings`` (NodeConfig -> SyncObjConf), ``snapshots`` (LMDB), ``loop_calls`` (every call from
the tick to the loop's callbacks, in order), ``loop_ticker`` (ticks on the loop).

Threads: pysyncobj's ticks (receive, apply, send, propose) run on the event loop's thread
(``loop_ticker``, the default), or on pysyncobj's own tick thread (``raft_ticks_on_loop``
false: ``tick_wait`` then makes it sleep until an event or its next timer); everything public
here is called on the event loop's thread. The state machine is guarded by one lock shared by
apply, snapshot restore and :meth:`RaftReplicator.read`.

Every workaround below names its hazard in docs/raft-hazards.md (H1..H19),
which says what pysyncobj does, why it matters and what rcq does about it.

Must not import: lmdb (rcq.server.raft.snapshots does), aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pysyncobj import FAIL_REASON, SyncObj, SyncObjException

from rcq.errors import CommitOutcomeUnknown, MembershipConflict, Unavailable
from rcq.server.config import NodeConfig
from rcq.server.core.commands import ApplyResult, BarrierResult, Command, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft import membership, patches, transport_patches
from rcq.server.raft.consumer import QueueConsumer
from rcq.server.raft.digest import ForkedDigest
from rcq.server.raft.hand_over import HandOver
from rcq.server.raft.internals import (
    default_journal,
    is_leader,
    leader_of,
    tick_once,
    use_journal_factory,
    use_poller_factory,
    wake_tick_thread,
)
from rcq.server.raft.journal import CompactionRepair, quiet_journal_open, repair_interrupted_compaction
from rcq.server.raft.log_upkeep import LogUpkeep
from rcq.server.raft.loop_calls import LoopCalls
from rcq.server.raft.loop_ticker import LoopPoller, LoopTicker
from rcq.server.raft.patches import ON_SYNC_FAILURE
from rcq.server.raft.protocol import ApplyListener, RaftStatus, RoleListener
from rcq.server.raft.requests import RaftRequests
from rcq.server.raft.secret_rotation import accepting_previous_secrets
from rcq.server.raft.settings import build_conf
from rcq.server.raft.snapshots import ForkingSnapshotWriter
from rcq.server.raft.tick_wait import wait_until_next_timer
from rcq.server.raft.wal import JournalCorrupt

# pysyncobj binds its message handler as a transport callback when a SyncObj is built: the
# fixes must be on the class before any is (H5, H6).
patches.install()

logger = logging.getLogger(__name__)

T = TypeVar("T")

ROLE_POLL_INTERVAL_S = 0.05
SNAPSHOT_CHILD_WAIT_S = 60.0

_ROLE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}
_LEADER = 2  # pysyncobj's role number for a leader (its _RAFT_STATE.LEADER)


def _check_bindable(raft_address: str) -> None:
    """Fail fast and clearly when the Raft port is taken.

    pysyncobj would retry the bind in its tick thread (for ever by default; here a few times,
    see rcq.server.raft.settings) and leak a socket per failed attempt.
    """
    host, port = raft_address.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as pysyncobj binds
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            raise Unavailable(f"cannot bind the Raft address {raft_address}: {exc.strerror}") from exc


def _untorn(read: Callable[[], T]) -> T:
    """``read()`` of pysyncobj state the tick thread may change meanwhile: a RuntimeError
    ("changed size during iteration") is a torn read, so read again (the last try raises)."""
    for _ in range(10):
        try:
            return read()
        except RuntimeError:
            time.sleep(0)
    return read()


class RaftReplicator:
    """One node's Raft replication of a QueueStateMachine. Started once, stopped once."""

    def __init__(self, config: NodeConfig, state_machine: QueueStateMachine, *, auto_tick: bool = True) -> None:
        """``auto_tick=False`` runs no tick thread: the caller drives Raft with :meth:`tick`, on the
        loop's thread. Deterministic tests use it to play an exact sequence of Raft events."""
        self._config = config
        self._state_machine = state_machine
        self._auto_tick = auto_tick
        # Who runs pysyncobj's ticks: the loop (rcq.server.raft.loop_ticker), pysyncobj's own tick
        # thread (raft_ticks_on_loop false), or the caller through tick() (auto_tick=False).
        self._ticks_on_loop = auto_tick and config.raft_ticks_on_loop
        self._ticker: LoopTicker | None = None
        self._lock = threading.Lock()
        self._consumer = QueueConsumer(state_machine, self._lock, self._on_applied, config.node_id)
        # Digests off the apply path, as snapshots (H9): the lock is held only to fork a child that hashes.
        self._digest = ForkedDigest(lambda: (state_machine.digest(), state_machine.last_index), self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_obj: SyncObj | None = None
        self._writer: ForkingSnapshotWriter | None = None
        self._role_task: asyncio.Task[None] | None = None
        self._role_listener: RoleListener | None = None
        self._apply_listener: ApplyListener | None = None
        self._reported_role: tuple[bool, int] | None = None
        self._stopped = False
        self._snapshot_loads_at_start = 0  # pysyncobj loads an existing snapshot once, at its first tick
        self._seen_leader: str | None = None
        self.leader_changes_seen = 0  # times this node saw the leader change (to another, or to none)
        # The last leader changes this node saw, as (unix time, leader's Raft address or None, term).
        self.leader_history: collections.deque[tuple[float, str | None, int]] = collections.deque(maxlen=20)
        self.repair: CompactionRepair | None = None  # what start() repaired, for logs and tests
        # Its collaborators, one job each (see the module docstring).
        # Every call from the tick thread to the loop, in order, one wake-up per burst.
        self._to_loop = LoopCalls()
        self._requests = RaftRequests(config, self, self._running, self._to_loop)
        self._requests.on_next_tick(self._use_the_log_membership)  # H18, at the first tick
        self._hand_over = HandOver(config, self, self._requests)
        self._log_upkeep = LogUpkeep(config)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._sync_obj is not None or self._stopped:
            raise RuntimeError("a RaftReplicator starts once; make a new one to restart")
        self._loop = asyncio.get_running_loop()
        self._to_loop.bind(self._loop)
        _check_bindable(self._config.raft_bind_address or self._config.raft_address)
        self._writer = ForkingSnapshotWriter(self._state_machine, self._config.snapshot_path, self._lock,
                                             self._config.node_id)
        conf = build_conf(self._config, self._writer, auto_tick=self._auto_tick and not self._ticks_on_loop,
                          on_state_changed=self._on_state_changed)
        poller = LoopPoller(self._loop) if self._ticks_on_loop else None
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_upkeep.refuse_the_other_durability()
        self._snapshot_loads_at_start = int(self._config.snapshot_path.is_file())
        use_journal_factory(self._log_upkeep.make_journal)
        use_poller_factory(None if poller is None else lambda _kind: poller)
        # Constructed on the loop's thread: pysyncobj's tick thread stops when the
        # thread that built SyncObj ends, and the loop's thread lives as long as we do.
        try:
            self.repair = repair_interrupted_compaction(self._config.journal_path, self._config.snapshot_path)
            with quiet_journal_open(), accepting_previous_secrets(self._config.cluster_secrets_previous):
                self._sync_obj = SyncObj(self._config.raft_address, [p.raft_address for p in self._config.peers],
                                         conf=conf, consumers=[self._consumer])
        except JournalCorrupt as exc:
            raise Unavailable(f"node {self._config.node_id} cannot start: {exc}") from exc
        finally:
            use_journal_factory(default_journal)
            use_poller_factory(None)
        setattr(self._sync_obj, ON_SYNC_FAILURE, self._log_upkeep.on_sync_failure)
        if poller is not None:
            self._ticker = LoopTicker(self._sync_obj, self._loop, poller, self._config.auto_tick_period_s)
            self._requests.set_wake(self._ticker.wake)
        else:
            wait_until_next_timer(self._sync_obj)
            self._requests.set_wake(functools.partial(wake_tick_thread, self._sync_obj))
        try:
            if self._ticker is not None:
                tick_once(self._sync_obj)  # binds the Raft port (_check_bindable refused a taken one above)
                self._ticker.start()
            elif self._auto_tick:
                await asyncio.to_thread(self._sync_obj.waitBinded)
            else:
                self.tick()  # binds the Raft port
        except SyncObjException as exc:
            await self.stop()
            raise Unavailable(f"cannot bind the Raft address {self._config.raft_address}") from exc
        self._log_upkeep.keep(self._sync_obj)
        self._sync_obj.addOnTickCallback(self._requests.run_tick_tasks)
        self._role_task = self._loop.create_task(self._poll_role(), name="rcq-raft-role")

    def set_sync_observer(self, observer: Callable[[float], None]) -> None:
        """Called (tick thread) with the seconds each fdatasync of the Raft log took (durability=fsync)."""
        self._log_upkeep.set_sync_observer(observer)

    async def stop(self) -> None:
        """Stop Raft, join its thread, wait for a snapshot child; pending submits end as unknown."""
        if self._stopped:
            return
        self._stopped = True
        await self._digest.close()  # kills a digest child still hashing
        if self._role_task is not None:
            self._role_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._role_task
        if self._sync_obj is not None:
            if self._ticker is not None:
                self._ticker.stop()
                self._sync_obj.destroy()  # without a tick thread: closes connections and the journal now
            elif self._auto_tick:
                await asyncio.to_thread(self._sync_obj.destroy_synchronous)
            else:
                self._sync_obj.destroy()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close, SNAPSHOT_CHILD_WAIT_S)
        self._requests.end_pending()

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
        # H19: held while leadership is being handed over (the timeout runs meanwhile).
        timeout_s = await self._hand_over.held(timeout_s)
        # H7: never let pysyncobj forward to the leader; a forwarded command's outcome can only
        # be "unknown".
        self._requests.leader_sync_obj()

        def answer(fail_reason: int) -> int:
            if fail_reason == FAIL_REASON.SUCCESS and not self._consumer.applied_by_its_leader:
                # Raft's rule: only the leader that proposed an entry, still leading that term,
                # answers "committed" for it (rcq.server.raft.consumer._leads_term_of_entry).
                return int(FAIL_REASON.UNKNOWN_OUTCOME)
            return int(fail_reason)

        try:
            result, fail_reason = await self._requests.answer_of(
                lambda done: self._consumer.apply_command(raw, callback=done), timeout_s, answer)
        except TimeoutError as exc:
            raise CommitOutcomeUnknown(f"no commit answer within {timeout_s} s; the entry may "
                                       "still commit") from exc
        if fail_reason == FAIL_REASON.SUCCESS:
            applied: ApplyResult = result
            return applied
        raise self._requests.error_for(fail_reason)

    # ----------------------------------------------------------- membership
    def members(self) -> list[str]:
        """The Raft addresses of the cluster's voting members as this node sees them, itself first
        (only itself while Raft is not running)."""
        sync_obj = self._sync_obj
        if sync_obj is None or self._stopped:
            return [self._config.raft_address]
        others = _untorn(lambda: sorted(str(node) for node in sync_obj.otherNodes))
        return [self._config.raft_address, *others]

    async def change_membership(self, action: str, raft_address: str, timeout_s: float) -> None:
        """Add (``"add"``) or remove (``"remove"``) one voting member; returns once the change is
        committed. Only on the leader, one change at a time (H16): a change while another is not
        committed, or before this leader committed its first entry, is MembershipConflict."""
        sync_obj = self._requests.leader_sync_obj()
        change = sync_obj.addNodeToCluster if action == "add" else sync_obj.removeNodeFromCluster
        try:
            # pysyncobj queues the change for its tick thread (thread-safe, like a proposal).
            _result, fail_reason = await self._requests.answer_of(lambda done: change(raft_address, callback=done),
                                                                  timeout_s)
        except TimeoutError as exc:
            raise CommitOutcomeUnknown(f"the membership change was not committed within {timeout_s} s; "
                                       "it may still be") from exc
        if fail_reason == FAIL_REASON.REQUEST_DENIED:
            raise MembershipConflict()
        if fail_reason != FAIL_REASON.SUCCESS:
            raise self._requests.error_for(fail_reason)

    async def transfer_leadership(self, raft_address: str | None) -> str:
        """Hand leadership to ``raft_address`` (None: the most caught-up connected follower); return
        the Raft address of the node leading now, once this node knows it. Proposals are held
        meanwhile (H19: rcq.server.raft.hand_over)."""
        return await self._hand_over.transfer(raft_address)

    def _use_the_log_membership(self) -> None:
        """H18, once, at the first tick (after pysyncobj loaded the snapshot): the membership of
        the whole log, not only of its committed part. A tick task: _on_tick_tasks catches what it raises."""
        sync_obj = self._sync_obj
        if sync_obj is None:
            return
        changes = membership.reapply_log_changes(sync_obj, int(sync_obj.raftLastApplied))
        if changes:
            logger.info("node %s: %d membership change(s) in the log beyond the last applied entry "
                        "taken into account", self._config.node_id, changes)

    def _running(self) -> tuple[SyncObj, asyncio.AbstractEventLoop]:
        if self._sync_obj is None or self._loop is None or self._stopped:
            raise Unavailable("the replicator is not running")
        return self._sync_obj, self._loop

    # ------------------------------------------------------------- queries
    def read(self, reader: Callable[[QueueStateMachine], T]) -> T:
        with self._lock:
            return reader(self._state_machine)

    async def digest(self) -> tuple[str, int]:
        """The state digest and its applied index, hashed in a forked child (rcq.server.raft.digest)."""
        return await self._digest.digest()

    def is_leader(self) -> bool:
        return self._sync_obj is not None and not self._stopped and is_leader(self._sync_obj)

    @property
    def term(self) -> int:
        return int(self._sync_obj.raftCurrentTerm) if self._sync_obj is not None else 0

    def leader_raft_address(self) -> str | None:
        if self._sync_obj is None or self._stopped:
            return None
        leader = leader_of(self._sync_obj)
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
                       leader_changes_seen=self.leader_changes_seen,
                       leader_history=list(self.leader_history),
                       guard_ticks=self._ticker.guard_ticks if self._ticker is not None else 0,
                       raft_messages_sent=transport_patches.MESSAGES.sent,
                       raft_messages_received=transport_patches.MESSAGES.received,
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
        # getStatus() iterates dicts the tick thread may resize (leader change).
        return _untorn(lambda: dict(sync_obj.getStatus()))

    # ------------------------------------------------------------ listeners
    def set_role_listener(self, listener: RoleListener) -> None:
        self._role_listener = listener

    def set_apply_listener(self, listener: ApplyListener) -> None:
        self._apply_listener = listener

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        # Tick thread. Only a nudge: the loop reads the role itself, and the poll
        # covers changes pysyncobj does not report (a term change as follower).
        if new_state == _LEADER and self._sync_obj is not None:  # its term was set before the role: consistent
            self._hand_over.elected(int(self._sync_obj.raftCurrentTerm))  # H19: "elected again" means won
        with contextlib.suppress(RuntimeError):  # loop closed
            self._to_loop.call(self._check_role)

    async def _poll_role(self) -> None:
        while True:
            self._to_loop.run_queued()  # a follower's applied entries, every poll at the latest
            self._check_role()
            await asyncio.sleep(ROLE_POLL_INTERVAL_S)

    def _check_role(self) -> None:
        if self._sync_obj is None or self._stopped:
            return
        role = (is_leader(self._sync_obj), int(self._sync_obj.raftCurrentTerm))
        leader = self.leader_raft_address()
        if leader != self._seen_leader:
            if self._seen_leader is not None:
                self.leader_changes_seen += 1
            self._seen_leader = leader
            self.leader_history.append((time.time(), leader, role[1]))
        if role == self._reported_role:
            return
        self._reported_role = role
        if self._role_listener is not None:
            try:
                self._role_listener(*role)
            except Exception:
                logger.exception("role listener failed")

    def _on_applied(self, index: int, command: Command | None, result: ApplyResult) -> None:
        # Tick thread, inside apply; must never raise (H2). Scheduled before
        # pysyncobj runs the submit's callback, so the loop sees this entry
        # before the submit returns (LoopCalls keeps the order).
        listener = self._apply_listener
        if listener is None:
            return
        sync_obj = self._sync_obj
        with contextlib.suppress(RuntimeError):  # loop closed
            if isinstance(result, BarrierResult) or (sync_obj is not None and is_leader(sync_obj)):
                self._to_loop.call(self._deliver_applied, listener, index, command, result)
            else:
                # A follower's loop only notes what it applied (the clock): no wake-up for each
                # entry; the role poll runs what is queued, and the next leader's barrier first.
                self._to_loop.call_unhurried(self._deliver_applied, listener, index, command, result)

    @staticmethod
    def _deliver_applied(listener: ApplyListener, index: int, command: Command | None, result: ApplyResult) -> None:
        try:
            listener(index, command, result)
        except Exception:
            logger.exception("apply listener failed on entry %d", index)
