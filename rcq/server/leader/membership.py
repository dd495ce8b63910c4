"""Membership changes, as the leader makes them: add, remove and replace nodes, hand leadership over.

A change is two replicated facts (docs/membership.md):

* who votes: Raft's membership, changed one node at a time by the replicator
  (:meth:`~rcq.server.raft.protocol.Replicator.change_membership`, pysyncobj's own entries);
* how to reach a member: the directory in the state machine (a
  :class:`~rcq.server.core.commands.MemberRecord` entry: node id, Raft address, HTTP URL), which
  followers use to send clients to a leader their configuration does not name.

Adding records the directory entry first, then the vote; removing takes the vote first, then
the entry. Between the two steps (or when the second fails) the directory names one node more
than votes, which only means a URL is known for a node that is not a member: the member list
is always Raft's.

Before a change the leader checks what would make it harmful: the node to add must answer its
health check as the node id given (a typo would otherwise add a member that never answers),
and after the change a majority of the new membership must be reachable, counting the node
being added (etcd's strict reconfiguration check). Changes are serialised here, and the
replicator refuses a change while the previous one is not committed (H16).

Must not import: aiohttp, pysyncobj, lmdb (the health probe is given by the HTTP layer).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from rcq.errors import (
    InvalidRequest,
    MemberExists,
    MemberNotFound,
    MembershipConflict,
    NodeUnreachable,
    NotLeader,
    Unavailable,
    WouldLoseQuorum,
)
from rcq.server.config import HOST_PORT_PATTERN, NODE_ID_PATTERN, NodeConfig, PeerConfig
from rcq.server.core.commands import MemberRecord, MemberRecordResult
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator, known_nodes

log = logging.getLogger(__name__)

# Probe(url, expected node id) -> None when the node answers as that node, else why not.
Probe = Callable[[str, str], Awaitable[str | None]]

CATCH_UP_POLL_S = 0.1
MEMBERSHIP_COMMIT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    raft_address: str
    url: str | None
    role: str  # leader, follower, or unknown (this node cannot tell)
    self: bool
    connected: bool | None  # this node's connection to it (None: itself)
    match_index: int | None  # the last entry the leader knows it holds (on the leader only)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Membership:
    def __init__(self, config: NodeConfig, manager: TransactionManager, replicator: Replicator,
                 probe: Probe) -> None:
        self._config = config
        self._manager = manager
        self._replicator = replicator
        self._probe = probe
        self._changing = asyncio.Lock()

    # ---------------------------------------------------------------- reading
    def directory(self) -> dict[str, PeerConfig]:
        """Raft address -> node, for every node known (configuration and recorded changes)."""
        return known_nodes(self._config, self._replicator)

    def members(self) -> list[Member]:
        """The voting members as this node sees them, with what it knows of each."""
        status = self._replicator.status()
        directory = self.directory()
        leader = status.leader_raft_address
        members = []
        for address in self._replicator.members():
            known = directory.get(address)
            is_self = address == self._config.raft_address
            connected = None if is_self else status.details.get(f"partner_node_status_server_{address}") == 2
            match = status.details.get(f"match_idx_server_{address}") if status.role == "leader" else None
            role = "leader" if address == leader else "follower" if leader is not None else "unknown"
            members.append(Member(node_id=known.node_id if known else address, raft_address=address,
                                  url=known.http_url if known else None, role=role, self=is_self,
                                  connected=connected,
                                  match_index=status.last_applied if is_self and status.role == "leader"
                                  else (int(match) if match is not None else None)))
        return members

    def leader_id(self) -> str | None:
        leader = self._replicator.status().leader_raft_address
        return None if leader is None else self._node_id(leader)

    def _node_id(self, raft_address: str) -> str:
        known = self.directory().get(raft_address)
        return known.node_id if known else raft_address

    def _member(self, node_id: str, members: list[Member] | None = None) -> Member:
        found = next((m for m in (members if members is not None else self.members()) if m.node_id == node_id), None)
        if found is None:
            raise MemberNotFound(f"no member has node id {node_id!r}", details={"node_id": node_id})
        return found

    # ---------------------------------------------------------------- changing
    async def add(self, node_id: str, raft_address: str, url: str, catch_up_timeout_s: float) -> dict[str, Any]:
        """Add a running node as a voting member; answers once the change is committed and the
        node caught up (or ``catch_up_timeout_s`` passed: ``caught_up`` false)."""
        _check_identity(node_id, raft_address, url)
        async with self._exclusive():
            members = self.members()
            for m in members:
                if m.node_id == node_id or m.raft_address == raft_address:
                    raise MemberExists(f"{m.node_id} ({m.raft_address}) is already a member",
                                       details={"node_id": m.node_id, "raft_address": m.raft_address})
            problem = await self._probe(url, node_id)
            if problem is not None:
                raise NodeUnreachable(f"{node_id} at {url}: {problem}", details={"node_id": node_id, "url": url})
            self._check_quorum(members, without=None, adding=True)
            await self._record(MemberRecord(*self._manager.entry_stamp(), action="record", node_id=node_id,
                                            raft_address=raft_address, http_url=url))
            await self._replicator.change_membership("add", raft_address, MEMBERSHIP_COMMIT_TIMEOUT_S)
            log.info("member %s (%s, %s) added", node_id, raft_address, url)
            target = self._replicator.status().commit_index
        caught_up = await self._wait_caught_up(raft_address, target, catch_up_timeout_s)
        added = next((m for m in self.members() if m.raft_address == raft_address), None)
        return {"added": added.as_dict() if added else {"node_id": node_id, "raft_address": raft_address, "url": url},
                "caught_up": caught_up, "members": [m.as_dict() for m in self.members()]}

    async def remove(self, node_id: str) -> dict[str, Any]:
        """Remove a member (running or not). Removing the leader itself hands leadership to the
        most caught-up follower first and answers NotLeader: the client re-sends to the new leader."""
        async with self._exclusive():
            members = self.members()
            member = self._member(node_id, members)
            if member.self:
                if len(members) == 1:
                    raise WouldLoseQuorum("the last member cannot be removed")
                await self._replicator.transfer_leadership(None)
                raise NotLeader(f"{node_id} handed leadership over to be removed; send the removal to the new leader",
                                leader_url=self._manager.leader_url())
            self._check_quorum(members, without=member.raft_address, adding=False)
            await self._replicator.change_membership("remove", member.raft_address, MEMBERSHIP_COMMIT_TIMEOUT_S)
            log.info("member %s (%s) removed", node_id, member.raft_address)
            try:
                await self._record(MemberRecord(*self._manager.entry_stamp(), action="forget", node_id=node_id))
            except Exception:  # the vote is gone, which is what matters; the entry only names it
                log.warning("member %s removed, but its directory entry was not forgotten", node_id, exc_info=True)
        return {"removed": member.as_dict(), "members": [m.as_dict() for m in self.members()]}

    async def transfer_leadership(self, node_id: str | None) -> dict[str, Any]:
        """Hand leadership to ``node_id`` (None: the most caught-up follower); answers once this node
        knows which node leads now, naming it (rolling restarts: restart the leader last, after
        handing over)."""
        async with self._exclusive():
            previous = self.leader_id()
            target = None
            if node_id is not None:
                member = self._member(node_id)
                if member.self:
                    return {"leader_id": previous, "previous_leader_id": previous}
                target = member.raft_address
            leader = await self._replicator.transfer_leadership(target)
        return {"leader_id": self._node_id(leader), "previous_leader_id": previous}

    # ---------------------------------------------------------------- steps
    def _exclusive(self) -> asyncio.Lock:
        self._manager.require_serving()
        if self._changing.locked():
            raise MembershipConflict("another membership change is in progress on this leader; retry when it is done")
        return self._changing

    def _check_quorum(self, members: list[Member], without: str | None, adding: bool) -> None:
        remaining = [m for m in members if m.raft_address != without]
        size = len(remaining) + (1 if adding else 0)
        reachable = sum(1 for m in remaining if m.self or m.connected) + (1 if adding else 0)
        if reachable <= size // 2:
            unreachable = [m.node_id for m in remaining if not (m.self or m.connected)]
            raise WouldLoseQuorum(
                f"after the change {reachable} of {size} members would be reachable, not a majority; bring "
                f"{', '.join(unreachable)} back (or remove them) first",
                details={"reachable": reachable, "members": size, "unreachable": unreachable})

    async def _record(self, record: MemberRecord) -> None:
        result = await self._replicator.submit(record, self._config.commit_timeout_s)
        if not isinstance(result, MemberRecordResult) or result.status != "done":
            raise Unavailable(f"the directory entry was not recorded ({result!r}); retry")

    async def _wait_caught_up(self, raft_address: str, target: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            member = next((m for m in self.members() if m.raft_address == raft_address), None)
            if member is not None and member.match_index is not None and member.match_index >= target:
                return True
            if time.monotonic() >= deadline or not self._replicator.is_leader():
                return False
            await asyncio.sleep(CATCH_UP_POLL_S)


def _check_identity(node_id: str, raft_address: str, url: str) -> None:
    if not re.fullmatch(NODE_ID_PATTERN, node_id):
        raise InvalidRequest(f"node_id {node_id!r} does not match {NODE_ID_PATTERN}")
    if not re.fullmatch(HOST_PORT_PATTERN, raft_address):
        raise InvalidRequest(f"raft_address {raft_address!r} is not host:port")
    if not re.match(r"^https?://[^/]+", url):
        raise InvalidRequest(f"url {url!r} is not an http(s) URL")
