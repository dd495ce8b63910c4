"""The seam between the transaction layer and Raft: the Replicator protocol.

``rcq.server.raft.replicator`` implements it with pysyncobj (``rcq/server/raft`` is the only
folder that knows pysyncobj); ``rcq.testing.InMemoryReplicator`` implements it in memory for
tests of everything above Raft.

Contract of :meth:`Replicator.submit`:

* returns the :class:`~rcq.server.core.commands.ApplyResult` computed when the entry was
  applied on this node, only after a majority has it in its log;
* raises :class:`~rcq.errors.NotLeader` / :class:`~rcq.errors.NoLeader` /
  :class:`~rcq.errors.Unavailable` when the command was definitely not proposed;
* raises :class:`~rcq.errors.LeaderChanged` when it was proposed but is
  definitely not committed (its log slot went to another leader's entry);
* raises :class:`~rcq.errors.CommitOutcomeUnknown` when it cannot know (a
  timeout, the leader changed before the answer): the entry may still apply.

The role listener is called on the event loop's thread, with
``(is_leader, term)``, whenever either changes.

The apply listener is called on the event loop's thread with
``(index, command, result)`` (``command`` decoded once, None when malformed) for every entry
applied to the state machine,
in apply order, and for an entry this node submitted *before* its ``submit``
returns. The transaction manager keeps its view of the queues from this
stream, so late, lost or forwarded callbacks cannot make it drift.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from rcq.server.config import NodeConfig, PeerConfig
from rcq.server.core.commands import ApplyResult, Command
from rcq.server.core.state_machine import QueueStateMachine

T = TypeVar("T")

RoleListener = Callable[[bool, int], None]
ApplyListener = Callable[[int, Command | None, ApplyResult], None]


@dataclass(frozen=True, slots=True)
class RaftStatus:
    role: str  # "leader", "follower" or "candidate"
    term: int
    leader_raft_address: str | None
    commit_index: int
    last_applied: int
    log_length: int
    has_quorum: bool
    snapshot_count: int = 0  # snapshots written (or received) since start
    details: dict[str, Any] = field(default_factory=dict)


class Replicator(Protocol):
    def read(self, reader: Callable[[QueueStateMachine], T]) -> T:
        """Run ``reader`` on the state machine, excluded from concurrent applies."""
        ...

    async def digest(self) -> tuple[str, int]:
        """``(state_machine.digest(), state_machine.last_index)`` of one consistent state, as of a
        moment after the call began, without holding up applies while hashing (the state is
        O(items)); raises :class:`~rcq.errors.Unavailable` when it cannot be computed."""
        ...

    async def submit(self, command: Command, timeout_s: float) -> ApplyResult:
        """Replicate ``command``; see the module docstring for outcomes."""
        ...

    def is_leader(self) -> bool: ...

    @property
    def term(self) -> int: ...

    def leader_raft_address(self) -> str | None: ...

    def status(self) -> RaftStatus: ...

    def set_role_listener(self, listener: RoleListener) -> None: ...

    def set_apply_listener(self, listener: ApplyListener) -> None: ...

    def request_snapshot(self) -> None:
        """Write a snapshot and compact the log soon, whatever the thresholds say."""
        ...

    def members(self) -> list[str]:
        """The Raft addresses of the voting members as this node sees them, itself first."""
        ...

    async def change_membership(self, action: str, raft_address: str, timeout_s: float) -> None:
        """Add (``"add"``) or remove (``"remove"``) one voting member, on the leader; returns once
        committed; :class:`~rcq.errors.MembershipConflict` while another change is not committed."""
        ...

    async def transfer_leadership(self, raft_address: str | None) -> str:
        """On the leader: hand leadership to ``raft_address`` (None: the most caught-up follower);
        returns the Raft address of the new leader, once this node knows it. Proposals wait meanwhile."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def known_nodes(config: NodeConfig, replicator: Replicator) -> dict[str, PeerConfig]:
    """Raft address -> node, for every node this one knows: its configuration, and the directory
    that membership changes recorded in the replicated state (NodeConfig.directory)."""
    return config.directory(replicator.read(lambda sm: sm.member_directory()))
