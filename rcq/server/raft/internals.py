"""Every read or write of pysyncobj's private (name-mangled) state, in one place.

pysyncobj 0.3.17 exposes no API for what rcq's workarounds need (docs/raft-hazards.md): the
journal (to sync it, size it and read an entry's term; and the seam where it is built, to give
it rcq's durable one, H8), the commit index (to bound it, H6), the proposals waiting for their
entry (to answer those a snapshot skipped, H7), the proposals not yet appended (H19), the transport (to sync before an
acknowledgement leaves, H8), the parts of a large entry received so far (H14, H20), and its
message handler, follower delete and leader start (patched, H5, H6, H8); and the TCP
transport's connections, listener and methods (H13..H15: frame caps, linear buffers, a listener
that survives EMFILE; H21: a dial nobody answers). Reaching in anywhere else is a bug;
a pysyncobj upgrade is checked here first. The methods that *replace* pysyncobj's own
(rcq.server.raft.patches, transport_patches, reassembly, membership, and the FileJournal subclass
of rcq.server.raft.wal) run as pysyncobj's objects and read their ``self``'s state as pysyncobj's
code does; everything else goes through the functions here.
``tests/unit/test_module_rules.py`` fails when a module but this one reads or calls a private
name of pysyncobj's on anything but ``self``.

Must not import: anything of rcq.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import journal as journal_module
from pysyncobj import pickle as pickle_module
from pysyncobj import poller as poller_module
from pysyncobj import syncobj as syncobj_module
from pysyncobj import transport as transport_module
from pysyncobj.monotonic import monotonic as raft_monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.transport import TCPTransport


def journal_of(sync_obj: SyncObj) -> Any:
    """The FileJournal. Its ``flush()`` msyncs it (pysyncobj never does, H8). Use it from the
    tick thread only, which owns the journal."""
    return sync_obj._SyncObj__raftLog


def journal_bytes(journal: Any) -> int:
    """Bytes written to the journal: pysyncobj compacts by entry count only, and this is what
    bounds the memory the log takes (rcq's DurableJournal says it; FileJournal keeps it private)."""
    written = getattr(journal, "bytes_written", None)
    if written is not None:
        return int(written)
    return int(getattr(journal, "_FileJournal__currentOffset", 0))


def entry_term(sync_obj: SyncObj, index: int) -> int | None:
    """The term of log entry ``index``, None when the journal does not hold it."""
    journal = journal_of(sync_obj)
    if not len(journal):
        return None
    position = index - int(journal[0][1])
    if not 0 <= position < len(journal):
        return None
    return int(journal[position][2])


def set_commit_index(sync_obj: SyncObj, index: int) -> None:
    sync_obj._SyncObj__raftCommitIndex = index
    journal_of(sync_obj).setRaftCommitIndex(index)


def commands_queued(sync_obj: SyncObj) -> int:
    """Proposals handed to pysyncobj and not yet appended to its log: its tick appends them
    (``_checkCommandsToApply``), bounded by time, so some may wait for the next tick (H19)."""
    return len(sync_obj._SyncObj__commandsQueue._FastQueue__queue)


def proposals_waiting(sync_obj: SyncObj) -> dict[int, list[tuple[int, Callable[[Any, int], None]]]]:
    """index -> [(term, callback)] of proposals made here, waiting for their entry to apply."""
    waiting: dict[int, list[tuple[int, Callable[[Any, int], None]]]] = sync_obj._SyncObj__commandsWaitingCommit
    return waiting


def syncobj_method(name: str) -> Callable[..., Any]:
    """SyncObj's private method ``__<name>``, as the class holds it."""
    method: Callable[..., Any] = getattr(SyncObj, f"_SyncObj__{name}")
    return method


def replace_syncobj_method(name: str, method: Callable[..., Any]) -> None:
    """Replace SyncObj's private method ``__<name>`` for every instance built afterwards."""
    setattr(SyncObj, f"_SyncObj__{name}", method)


def use_journal_factory(factory: Callable[[str | None], Any]) -> None:
    """Make SyncObj build its journal with ``factory(journalFile)`` (pysyncobj's createJournal seam)."""
    syncobj_module.createJournal = factory


def use_poller_factory(factory: Callable[[str], Any] | None) -> None:
    """Make SyncObj build its poller with ``factory(pollerType)``; None: pysyncobj's own choice."""
    syncobj_module.createPoller = factory if factory is not None else poller_module.createPoller


def default_journal(journal_file: str | None) -> Any:
    """pysyncobj's own choice: its in-memory journal for None, its mmap'd FileJournal otherwise."""
    return journal_module.createJournal(journal_file)


def reassembled_so_far(sync_obj: SyncObj) -> Any:
    """The parts of a large entry received so far (a bytearray from its 'start' part on, H14), or
    '' when no entry is under way (pysyncobj's ``__recvTransmission``; tick thread)."""
    return sync_obj._SyncObj__recvTransmission


def end_reassembly(sync_obj: SyncObj) -> None:
    """What pysyncobj does once it took an entry from its parts: no entry under way any more."""
    sync_obj._SyncObj__recvTransmission = ""


def seconds_to_next_timer(sync_obj: SyncObj) -> float:
    """How long until the next timer pysyncobj's tick acts on: a leader's next heartbeat, a
    follower's or candidate's election deadline (negative: past, which it may be while the tick
    cannot act on it). On pysyncobj's own clock: CLOCK_MONOTONIC_RAW, which drifts away from
    time.monotonic (by 0.1 s after ten hours on the development machine), so the two never mix."""
    if sync_obj._SyncObj__raftState == syncobj_module._RAFT_STATE.LEADER:
        deadline = sync_obj._SyncObj__newAppendEntriesTime
    else:
        deadline = sync_obj._SyncObj__raftElectionDeadline
    return float(deadline) - float(raft_monotonic())


def heartbeat_within(sync_obj: SyncObj, delay_s: float) -> None:
    """Make a leader's next append_entries go out within ``delay_s`` (sooner if it was due sooner;
    sending any append_entries sets the next one a heartbeat period later)."""
    at = raft_monotonic() + delay_s
    if float(sync_obj._SyncObj__newAppendEntriesTime) > at:
        sync_obj._SyncObj__newAppendEntriesTime = at


def is_leader(sync_obj: SyncObj) -> bool:
    """Whether this node leads now (pysyncobj's own test; its public ``getStatus`` builds a dict)."""
    return bool(sync_obj._isLeader())


def leader_of(sync_obj: SyncObj) -> Any:
    """The node this one takes for the leader (a pysyncobj Node, or None)."""
    return sync_obj._getLeader()


def wrap_commands_to_apply(make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace SyncObj's ``_checkCommandsToApply`` (where a leader appends the proposals) with
    ``make(the current one)``, for every instance."""
    SyncObj._checkCommandsToApply = make(SyncObj._checkCommandsToApply)


def tick_once(sync_obj: SyncObj) -> None:
    """One tick of pysyncobj's, without waiting for events (``_onTick(0)``: receive what the
    sockets hold, commit, apply, send, propose; the first one binds the Raft port). ``doTick``
    is the public twin, but it ticks only a SyncObj made with ``autoTick=False``."""
    sync_obj._onTick(0.0)


def poller_of(sync_obj: SyncObj) -> Any:
    """The poller the tick waits in (its ``poll`` is what rcq.server.raft.tick_wait bounds)."""
    return sync_obj._poller


def destroy_journal(journal: Any) -> None:
    """Close a FileJournal opened outside a SyncObj (pysyncobj closes its own in ``destroy``)."""
    journal._destroy()


def last_applied(sync_obj: SyncObj) -> int:
    return int(sync_obj._SyncObj__raftLastApplied)


def wake_tick_thread(sync_obj: SyncObj) -> None:
    """End the tick thread's wait now, as a proposal does (pysyncobj's pipe notifier, which exists
    unless entries are batched; then the next tick comes within its period). Any thread."""
    notifier = getattr(sync_obj, "_SyncObj__pipeNotifier", None)
    if notifier is None:
        return
    try:
        notifier.notify()
    except BlockingIOError:
        pass  # the pipe is full: a wake is already pending


def redirect_proposal_wake(sync_obj: SyncObj, wake: Callable[[], None]) -> None:
    """Make a proposal call ``wake`` instead of writing to pysyncobj's pipe (whose reading end only
    ends a tick thread's wait; ticks on the loop are asked for directly)."""
    notifier = getattr(sync_obj, "_SyncObj__pipeNotifier", None)
    if notifier is not None:
        notifier.notify = wake


def transport_of(sync_obj: SyncObj) -> Any:
    """The TCP transport; its ``send`` is how every Raft message leaves."""
    return sync_obj._SyncObj__transport


# ---------------------------------------------------------------------------------------------
# The TCP transport (H13..H15). TcpConnection and TcpServer keep their state in private
# (name-mangled) attributes; TCPTransport in "_" ones.
_OWNERS: dict[str, tuple[type, str]] = {
    "SyncObj": (SyncObj, "_SyncObj__"),
    "TcpConnection": (TcpConnection, "_TcpConnection__"),
    "TcpServer": (TcpServer, "_TcpServer__"),
    "TCPTransport": (TCPTransport, ""),  # its methods are not name-mangled
}


@dataclass(frozen=True)
class Replaced:
    """A method rcq replaced on one of pysyncobj's classes, and pysyncobj's own (for tests that
    show what pysyncobj does without the fix: ``setattr(owner, attribute, original)``)."""

    owner: object  # a class, or pysyncobj's pickle module
    attribute: str
    original: Any


def replace_method(owner: str, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Replaced:
    """Replace ``owner``'s method ``name`` (private ``__<name>`` for SyncObj, TcpConnection and
    TcpServer) with ``make(current method)``, for every instance: those built afterwards, and
    existing ones where pysyncobj looks the method up at each call."""
    cls, prefix = _OWNERS[owner]
    attribute = prefix + name
    original = getattr(cls, attribute)
    setattr(cls, attribute, make(original))
    return Replaced(cls, attribute, original)


def connection_private(connection: Any, name: str) -> Any:
    """TcpConnection's private ``__<name>`` (readBuffer, socket, recvBufferSize, state...)."""
    return getattr(connection, f"_TcpConnection__{name}")


def set_connection_private(connection: Any, name: str, value: Any) -> None:
    setattr(connection, f"_TcpConnection__{name}", value)


def server_private(server: Any, name: str) -> Any:
    """TcpServer's private ``__<name>`` (socket, fileno, poller, host, port, the accept handler...)."""
    return getattr(server, f"_TcpServer__{name}")


def transport_conf(transport: Any) -> Any:
    """The SyncObjConf of the SyncObj a TCPTransport serves."""
    return transport._syncObj.conf


def transport_server(transport: Any) -> Any:
    """The TcpServer of a TCPTransport (None on a read-only node)."""
    return transport._server


def transport_connection(transport: Any, node: Any) -> Any:
    """The TcpConnection a TCPTransport keeps for ``node``, if any."""
    return transport._connections.get(node)


def connections_of(transport: Any) -> list[Any]:
    """Every TcpConnection a TCPTransport holds: its nodes', and incoming ones that have not yet
    named their node (in their handshake). Read from another thread, it may be torn: retry."""
    return [*transport._connections.values(), *transport._unknownConnections]


def replace_pickle_to_bytes(make: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> Replaced:
    """Replace ``pysyncobj.pickle.to_bytes``, which its ``loads`` calls on whatever it is given."""
    original = pickle_module.to_bytes
    pickle_module.to_bytes = make(original)
    return Replaced(pickle_module, "to_bytes", original)


# ---------------------------------------------------------------------------------------------
# Dynamic membership (H11, H16..H18): pysyncobj's membership entries, its pending-change marker
# and the method that applies one change to its view of the cluster.
MEMBERSHIP_COMMAND_TYPE = syncobj_module._COMMAND_TYPE.MEMBERSHIP


def membership_request(command: Any) -> Any | None:
    """The change a log entry's command carries (``['add'|'rem', node id, node]``), or None."""
    if not command or command[0] != MEMBERSHIP_COMMAND_TYPE:
        return None
    return pickle_module.loads(command[1:])


def apply_membership_change(sync_obj: SyncObj, request: Any) -> bool:
    """Apply one change to the node's view of the cluster (no-op, False, when already so)."""
    return bool(sync_obj._SyncObj__doChangeCluster(request))


def set_pending_change_index(sync_obj: SyncObj, index: int) -> None:
    sync_obj._SyncObj__changeClusterIDx = index


def current_log_index(sync_obj: SyncObj) -> int:
    return int(sync_obj._SyncObj__getCurrentLogIndex())


def log_entries_after(sync_obj: SyncObj, index: int) -> list[tuple[Any, int, int]]:
    """The journal's entries (command, index, term) after ``index``, oldest first (tick thread)."""
    journal = journal_of(sync_obj)
    if not len(journal):
        return []
    first = int(journal[0][1])
    start = max(0, index + 1 - first)
    return [journal[i] for i in range(start, len(journal))]


def drop_unanswered_dial(transport: Any, node: Any) -> bool:
    """H21: disconnect the transport's dial to ``node`` if it has been connecting (no answer to its
    SYN) for longer than the connection timeout; True if it did. pysyncobj checks a connection's
    timeout only when its socket has an event, and an unanswered SYN has none until the kernel
    gives up on it (about 2 minutes)."""
    connection = transport._connections.get(node)
    started = transport._lastConnectAttempt.get(node)
    if connection is None or started is None or connection.state != CONNECTION_STATE.CONNECTING:
        return False
    if transport_module.monotonicTime() - started <= transport._syncObj.conf.connectionTimeout:
        return False
    connection.disconnect()
    return True


def connect_node(transport: Any, node: Any, host: str, port: int) -> bool:
    """TCPTransport._connectIfNecessarySingle, dialling ``host:port`` instead of the node's own address."""
    connections = transport._connections
    if node in connections and connections[node].state != CONNECTION_STATE.DISCONNECTED:
        return True
    if not transport._shouldConnect(node):
        return False
    last_attempt = transport._lastConnectAttempt
    now = transport_module.monotonicTime()
    if node in last_attempt and now - last_attempt[node] < transport._syncObj.conf.connectionRetryTime:
        return False
    last_attempt[node] = now
    return bool(connections[node].connect(host, port))
