"""An in-memory Replicator for tests of everything above Raft.

``InMemoryReplicator`` implements the Replicator protocol of
:mod:`rcq.server.raft.protocol` in one process with no Raft: submitted commands are
applied on the event loop at the next iteration, in order, so everything above
the replication seam (transactions, HTTP API, client) can be tested fast and
deterministically. Tests can depose and elect it, and make submits time out.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from rcq.errors import CommitOutcomeUnknown, MembershipConflict, NoLeader
from rcq.server.core.commands import ApplyResult, Command, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.protocol import ApplyListener, RaftStatus, RoleListener

T = TypeVar("T")


class InMemoryReplicator:
    def __init__(self, state_machine: QueueStateMachine | None = None, *, leader: bool = True,
                 term: int = 1) -> None:
        self.state_machine = state_machine or QueueStateMachine()
        self._leader = leader
        self._term = term
        self._index = self.state_machine.last_index
        self._role_listener: RoleListener | None = None
        self._apply_listener: ApplyListener | None = None
        self.submitted: list[Command] = []
        self.hold_submits = False  # True: submits are never applied (outcome unknown)
        self.lose_next_submits = 0  # the next N submits are never applied and answer unknown
        self.lose_next_answers = 0  # the next N submits apply, but answer unknown
        self.fail_submits_with: Exception | None = None
        self.snapshots_requested = 0
        # Raft membership, in memory: the other members' addresses, and which of them answer.
        self.other_members: list[str] = []
        self.unreachable: set[str] = set()
        self.refuse_membership_changes = False  # True: as a leader with a change not yet committed
        self.transfers: list[str | None] = []

    # ------------------------------------------------------------ protocol
    def read(self, reader: Callable[[QueueStateMachine], T]) -> T:
        return reader(self.state_machine)

    async def digest(self) -> tuple[str, int]:
        return self.state_machine.digest(), self.state_machine.last_index

    async def submit(self, command: Command, timeout_s: float) -> ApplyResult:
        if not self._leader:
            raise NoLeader()
        if self.fail_submits_with is not None:
            raise self.fail_submits_with
        self.submitted.append(command)
        raw = encode(command)
        if self.lose_next_submits:  # proposed, never appended: the proposer cannot know
            self.lose_next_submits -= 1
            await asyncio.sleep(0)
            raise CommitOutcomeUnknown("test: the entry was lost")
        if self.lose_next_answers:  # applied, but the answer never reaches the proposer
            self.lose_next_answers -= 1
            await asyncio.sleep(0)
            self.apply_raw(raw)
            raise CommitOutcomeUnknown("test: the answer was lost")
        if self.hold_submits:
            await asyncio.sleep(timeout_s)
            raise CommitOutcomeUnknown()
        await asyncio.sleep(0)  # replication takes at least one loop iteration
        if not self._leader:
            raise CommitOutcomeUnknown()
        return self.apply_raw(raw)

    def apply_raw(self, raw: Any) -> ApplyResult:
        """Apply an entry as if committed (also usable to inject entries of other leaders)."""
        self._index += 1
        command, result = self.state_machine.decode_and_apply(raw, self._index)
        if self._apply_listener is not None:
            self._apply_listener(self._index, command, result)
        return result

    def is_leader(self) -> bool:
        return self._leader

    @property
    def term(self) -> int:
        return self._term

    def leader_raft_address(self) -> str | None:
        return "memory:0" if self._leader else None

    def status(self) -> RaftStatus:
        details: dict[str, Any] = {}
        for address in self.other_members:
            reachable = address not in self.unreachable
            details[f"partner_node_status_server_{address}"] = 2 if reachable else 0
            details[f"match_idx_server_{address}"] = self._index if reachable else 0
        return RaftStatus(
            role="leader" if self._leader else "follower", term=self._term,
            leader_raft_address=self.leader_raft_address(), commit_index=self._index,
            last_applied=self._index, log_length=self._index, has_quorum=self._leader, details=details)

    def members(self) -> list[str]:
        return ["memory:0", *sorted(self.other_members)]

    async def change_membership(self, action: str, raft_address: str, timeout_s: float) -> None:
        if not self._leader:
            raise NoLeader()
        if self.refuse_membership_changes:
            raise MembershipConflict()
        await asyncio.sleep(0)
        if action == "add" and raft_address not in self.other_members:
            self.other_members.append(raft_address)
        elif action == "remove" and raft_address in self.other_members:
            self.other_members.remove(raft_address)
        self._index += 1  # pysyncobj's entry: not applied to the state machine

    async def transfer_leadership(self, raft_address: str | None) -> str:
        if not self._leader:
            raise NoLeader()
        self.transfers.append(raft_address)
        self.depose()
        return raft_address or next(iter(self.other_members), "memory:0")  # the new leader, as the replicator answers

    def set_role_listener(self, listener: RoleListener) -> None:
        self._role_listener = listener

    def set_apply_listener(self, listener: ApplyListener) -> None:
        self._apply_listener = listener

    def request_snapshot(self) -> None:
        self.snapshots_requested += 1

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    # -------------------------------------------------------- test controls
    def depose(self) -> None:
        self._leader = False
        if self._role_listener is not None:
            self._role_listener(False, self._term)

    def elect(self, term: int | None = None) -> None:
        self._term = term if term is not None else self._term + 1
        self._leader = True
        if self._role_listener is not None:
            self._role_listener(True, self._term)
