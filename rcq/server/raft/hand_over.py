"""Leadership hand-over on pysyncobj (docs/raft-hazards.md, H19): Raft's leadership transfer
(Ongaro's thesis, 3.10).

pysyncobj sends TimeoutNow only when the target's match index equals the leader's last index,
and the leader goes on appending meanwhile: under load the transfer is refused, or the target
stands with a shorter log and the old leader wins again. So while a hand-over runs, new proposals
are held (they wait in the replicator's ``submit``, neither appended nor refused); TimeoutNow is
asked for again each poll until the target holds the whole log and nothing is left in pysyncobj's
queue; then the hand-over waits until it knows another node leads, and answers with that node.
"Elected again" is an election this node won since (the tick thread reports each one), not its
role read while it steps down.

The node's RaftReplicator owns one HandOver and delegates ``transfer_leadership`` and the
proposals' gate to it.

Must not import: lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj

from rcq.errors import MembershipConflict, Unavailable
from rcq.server.config import NodeConfig
from rcq.server.raft.internals import commands_queued
from rcq.server.raft.protocol import Replicator
from rcq.server.raft.requests import RaftRequests

logger = logging.getLogger(__name__)

LEADERSHIP_TRANSFER_WAIT_S = 5.0  # pysyncobj answers at once: it only checks and sends one message
# A hand-over holds new proposals while the target catches up (at most this long), then while it
# wins its election (at most HAND_OVER_ELECTION_TIMEOUTS election timeouts).
HAND_OVER_CATCH_UP_S = 3.0
HAND_OVER_ELECTION_TIMEOUTS = 3
HAND_OVER_POLL_S = 0.01


class HandOver:
    """One node's leadership hand-overs, one at a time, and the gate that holds proposals meanwhile."""

    def __init__(self, config: NodeConfig, node: Replicator, requests: RaftRequests) -> None:
        """``node`` says whether it leads and who does; ``requests`` reaches its pysyncobj."""
        self._config = config
        self._node = node
        self._requests = requests
        # Set while leadership is being handed over: proposals wait for it (held).
        self._handing_over: asyncio.Event | None = None
        self._won_term = 0  # of the last election this node won, set by the tick thread as it wins

    def elected(self, term: int) -> None:
        """Tick thread: this node won the election of ``term``."""
        self._won_term = term

    async def held(self, timeout_s: float) -> float:
        """Wait while leadership is being handed over; return what is left of ``timeout_s``.
        Unavailable when nothing is left (the proposal was not made)."""
        handing_over = self._handing_over
        if handing_over is None:
            return timeout_s
        held_since = time.monotonic()
        try:  # held, not proposed: the target must catch up and win with the log as it is
            await asyncio.wait_for(handing_over.wait(), timeout_s)
        except TimeoutError as exc:
            raise Unavailable("leadership is being handed over; retry") from exc
        timeout_s -= time.monotonic() - held_since
        if timeout_s <= 0:
            raise Unavailable("leadership was being handed over; retry")
        return timeout_s

    async def transfer(self, raft_address: str | None) -> str:
        """Hand leadership to ``raft_address`` (None: the most caught-up connected follower); return
        the Raft address of the node leading now, once this node knows it (it steps down when the
        target asks for votes, and learns the winner from its first message).

        New proposals are held, not appended, until the transfer ends; once the target holds the
        whole log pysyncobj sends it TimeoutNow and it stands for election at once.
        MembershipConflict when the target did not catch up (or is not connected); Unavailable when
        no one else was known to lead in time. Held proposals then go on: to pysyncobj if this node
        still leads, else they are refused as not executed."""
        self._requests.leader_sync_obj()
        if self._handing_over is not None:
            raise MembershipConflict("leadership is already being handed over")
        gate = self._handing_over = asyncio.Event()
        won_term = self._won_term
        started = time.monotonic()
        try:
            await self._send_timeout_now(raft_address, started + HAND_OVER_CATCH_UP_S)
            sent = time.monotonic()
            leader = await self._until_another_leads(
                won_term, sent + HAND_OVER_ELECTION_TIMEOUTS * self._config.raft_timeout_max_s)
            logger.info("node %s handed leadership over to %s: %.0f ms to catch the target up, %.0f ms to its election",
                        self._config.node_id, leader, (sent - started) * 1000, (time.monotonic() - sent) * 1000)
            return leader
        finally:
            self._handing_over = None
            gate.set()

    async def _send_timeout_now(self, raft_address: str | None, deadline: float) -> None:
        """Ask pysyncobj to send TimeoutNow, again each poll while it refuses (the target's match
        index is not yet the leader's last index) until ``deadline``."""
        while True:
            sync_obj = self._requests.leader_sync_obj()

            def transfer(done: Callable[[Any, int], None], sync_obj: SyncObj = sync_obj) -> None:
                # pysyncobj reads its match indexes and sends a message: the tick thread's work. Not
                # while proposals wait in its queue: appended after TimeoutNow, they would leave the
                # target with a shorter log. Refused as "not caught up": asked again.
                self._requests.on_next_tick(lambda: done(None, FAIL_REASON.REQUEST_DENIED) if commands_queued(sync_obj)
                                            else sync_obj.transferLeadership(raft_address, callback=done))

            try:
                _result, fail_reason = await self._requests.answer_of(transfer, LEADERSHIP_TRANSFER_WAIT_S)
            except TimeoutError as exc:
                raise Unavailable("the Raft thread did not take the leadership transfer; retry") from exc
            if fail_reason == FAIL_REASON.SUCCESS:
                return
            if fail_reason == FAIL_REASON.NOT_LEADER:
                raise self._requests.not_leader_error()
            if time.monotonic() >= deadline:
                raise MembershipConflict("the target of the leadership transfer is not connected or did not "
                                         "catch up in time; retry shortly")
            await asyncio.sleep(HAND_OVER_POLL_S)

    async def _until_another_leads(self, won_term: int, deadline: float) -> str:
        """The Raft address of the node that leads after this one (elected in ``won_term``) stepped down.
        "Elected again" is an election won since, not the role and term read here (stepping down,
        pysyncobj stores the new term, an fsync, before it changes the role)."""
        while True:
            leader = self._node.leader_raft_address()
            if not self._node.is_leader() and leader is not None and leader != self._config.raft_address:
                return leader
            if self._won_term != won_term:
                raise Unavailable("leadership was not handed over: this node was elected again; retry")
            if time.monotonic() >= deadline:
                raise Unavailable("leadership was not handed over in time (no other node was seen leading); retry")
            await asyncio.sleep(HAND_OVER_POLL_S)
