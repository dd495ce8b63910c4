"""p0's serving leader keeps the other partitions as the directory says (docs/partitions.md):
each partition's Raft membership matches its members in the directory, and leaders stay spread.

Every ``poll_s`` the serving leader surveys every partition (each member's ``/readyz``: who
leads, how long, the leader's members and commit index, each member's applied index) and makes at
most **one** change to the whole cluster, then surveys again:

1. **Members.** For the first partition (by number) whose Raft membership differs from the
   directory's: add the first member missing (once its node's process answers; the partition's
   leader checks it and waits for it to catch up, as for p0: docs/membership.md), else remove the
   first member too many. Adding before removing keeps a replaced member's partition at full
   strength meanwhile.
2. **Leaders**, once every partition's members match and when ``balance`` is on: the move
   :func:`rcq.server.leader.leader_balance.next_move` gives, as a hand-over by the partition's
   leader (``POST /v1/cluster/leadership``); the next move only once the survey shows it done or
   it failed.

Besides, at every survey, the **memory budget** of each node is shared again between the
partitions it hosts (rcq.server.leader.storage_sharing, given as ``sharing``): allowances are not
members nor leaders, and go to each partition's processes whatever else the round changes.

The changes are calls signed with the cluster secret (rcq.server.security.cluster_calls): the
balancer runs with no caller's token. :meth:`rebalance` (``rcq cluster rebalance``) makes the
moves now, without the hold, and answers them.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rcq.server.core.directory import Directory
from rcq.server.leader.leader_balance import LAG_MAX, Move, PartitionLeaders, leaders_per_node, next_move, spread
from rcq.server.leader.storage_budget import MemberStorage

log = logging.getLogger(__name__)

POLL_S = 2.0  # between surveys
HOLD_S = 60.0  # no move within this long of a partition's leader change
MOVE_SEEN_S = 15.0  # a move not seen in the survey by then is taken as failed


@dataclass(frozen=True)
class PartitionView:
    """One partition as its members' processes answered."""

    name: str
    number: int
    members: tuple[str, ...]  # the directory's
    preferred_leader: str | None
    leader: str | None = None
    leader_url: str | None = None  # where this node reaches the leader's process
    leader_for_s: float | None = None
    raft_members: tuple[str, ...] | None = None  # as the leader says; None without a leader
    applied: Mapping[str, int | None] = field(default_factory=dict)  # member -> last applied (None: no answer)
    commit_index: int | None = None  # the leader's
    items: int | None = None  # items in its queues, as the leader counts them
    urls: Mapping[str, str] = field(default_factory=dict)  # member -> where this node reaches its process
    storage: Mapping[str, MemberStorage] = field(default_factory=dict)  # member -> its figures (those answering)

    def lag(self) -> dict[str, int | None]:
        """member -> entries behind the leader's commit index (None: it did not answer)."""
        if self.commit_index is None:
            return dict.fromkeys(self.members)
        return {m: None if a is None else max(0, self.commit_index - a) for m, a in self.applied.items()}

    def settled(self) -> bool:
        """Its Raft membership is the directory's, and every member is caught up."""
        lags = self.lag()
        caught_up = all((lag := lags.get(m)) is not None and lag <= LAG_MAX for m in self.members)
        return self.raft_members is not None and set(self.raft_members) == set(self.members) and caught_up

    def leaders(self) -> PartitionLeaders:
        return PartitionLeaders(self.name, self.members, self.leader, self.leader_for_s, self.lag(),
                                self.preferred_leader)


class Calls(Protocol):
    """The partition processes' side: surveyed, and asked to change (rcq.server.http.partition_control)."""

    async def survey(self, directory: Directory) -> list[PartitionView]: ...

    async def transfer(self, view: PartitionView, to_node: str | None) -> str | None:
        """Hand ``view``'s leadership to ``to_node`` (None: its most caught-up follower); None when
        done, else why not."""

    async def add_member(self, view: PartitionView, node_id: str) -> str | None:
        """Add ``node_id`` to ``view``'s Raft membership; None when done, else why not."""

    async def remove_member(self, view: PartitionView, node_id: str) -> str | None:
        """Remove ``node_id`` from ``view``'s Raft membership; None when done, else why not."""


class Sharing(Protocol):
    """What shares the nodes' memory budgets at every survey (rcq.server.leader.storage_sharing)."""

    async def share(self, views: list[PartitionView], nodes: list[str]) -> None: ...


@dataclass
class ControllerStatus:
    moves_total: int = 0  # hand-overs the balancer made (by hand included)
    moves_failed_total: int = 0
    member_changes_total: int = 0
    last_move: dict[str, Any] | None = None
    last_problem: str | None = None  # the last change that did not work, and why
    surveyed_at: float | None = None  # unix time of the last survey


class PartitionController:
    def __init__(self, serving: Callable[[], bool], read_directory: Callable[[], Directory],
                 voting: Callable[[], list[str]], calls: Calls, balance: bool = True, hold_s: float = HOLD_S,
                 poll_s: float = POLL_S, sharing: Sharing | None = None) -> None:
        self._serving = serving
        self._read_directory = read_directory
        self._voting = voting
        self._calls = calls
        self._sharing = sharing
        self.balance = balance
        self.hold_s = hold_s
        self._poll_s = poll_s
        self._round = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._views: list[PartitionView] = []
        self._surveyed: float | None = None  # monotonic time of the last survey
        self._pending: tuple[Move, float] | None = None  # a move made, until seen or MOVE_SEEN_S passed
        self.status = ControllerStatus()

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rcq-partition-controller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                if self._serving():
                    async with self._round:
                        await self._one_round(self.hold_s)
                else:
                    self._views, self._pending = [], None
            except Exception:  # a bug here must not stop the partitions from being kept
                log.exception("keeping the partitions as the directory says failed")
            await asyncio.sleep(self._poll_s)

    async def survey(self, max_age_s: float = 0.0) -> list[PartitionView]:
        """Every partition as its members answer now; with ``max_age_s``, the last survey when it
        is that young (each open status page polls once a second: one survey serves them all)."""
        if max_age_s > 0 and self._surveyed is not None and time.monotonic() - self._surveyed < max_age_s:
            return list(self._views)
        directory = self._read_directory()
        views = await self._calls.survey(directory) if directory.partitions else []
        self._views, self._surveyed = views, time.monotonic()
        self.status.surveyed_at = time.time()
        return views

    @property
    def views(self) -> list[PartitionView]:
        """The last survey (empty off p0's serving leader)."""
        return list(self._views)

    def nodes(self) -> list[str]:
        """The nodes that may lead partitions: voting members of the cluster."""
        return sorted(self._voting())

    async def _one_round(self, hold_s: float) -> str | None:
        """Survey, share the memory budgets, then make at most one change; what it was ("member",
        "move"), None if none."""
        views = await self.survey()
        if self._sharing is not None:
            await self._sharing.share(views, self.nodes())
        if not views:
            return None
        if await self._change_members(views):
            return "member"
        if not self.balance:
            return None  # balance_leaders false: leaders move by hand only (rebalance, transfer)
        if self._move_in_flight(views):
            return None
        move = self._next_move(views, hold_s)
        if move is None:
            return None
        await self._move(views, move)
        return "move"

    def _move_in_flight(self, views: list[PartitionView]) -> bool:
        """Whether the last move made is still to be seen in ``views``; one seen, of a partition
        gone, or not seen within MOVE_SEEN_S (a problem) is done with."""
        if self._pending is None:
            return False
        made, deadline = self._pending
        view = next((v for v in views if v.name == made.partition), None)
        if view is not None and view.leader != made.to_node:
            if time.monotonic() < deadline:
                return True
            self._problem(f"moving {made.partition}'s leader to {made.to_node} was not seen within "
                          f"{MOVE_SEEN_S:.0f} s")
        self._pending = None
        return False

    def _next_move(self, views: list[PartitionView], hold_s: float) -> Move | None:
        return next_move([v.leaders() for v in views if v.raft_members is not None], self._answering(views), hold_s)

    def _answering(self, views: list[PartitionView]) -> list[str]:
        """Voting members whose processes answered for at least one partition."""
        answered = {m for v in views for m, applied in v.applied.items() if applied is not None}
        return [n for n in self.nodes() if n in answered]

    async def _change_members(self, views: list[PartitionView]) -> bool:
        for view in sorted(views, key=lambda v: v.number):
            if view.raft_members is None or set(view.raft_members) == set(view.members):
                continue
            missing = [m for m in view.members if m not in view.raft_members]
            extra = sorted(m for m in view.raft_members if m not in view.members)
            if missing and view.applied.get(missing[0]) is None:
                # its node starts the process within a second of applying the directory's entry
                waiting = f"waiting for {missing[0]}'s process of partition {view.name} to answer, to add it"
                if self.status.last_problem != waiting:
                    log.info("%s", waiting)
                self.status.last_problem = waiting
                return True
            if missing:
                problem = await self._calls.add_member(view, missing[0])
                what = f"adding {missing[0]} to partition {view.name}"
            else:
                problem = await self._calls.remove_member(view, extra[0])
                what = f"removing {extra[0]} from partition {view.name}"
            if problem is None:
                self.status.member_changes_total += 1
                log.info("%s: done", what)
            else:
                self._problem(f"{what}: {problem}")
            return True
        return False

    async def _move(self, views: list[PartitionView], move: Move) -> bool:
        view = next(v for v in views if v.name == move.partition)
        problem = await self._calls.transfer(view, move.to_node)
        counts = leaders_per_node([v.leaders() for v in views], self.nodes())
        if problem is not None:
            self.status.moves_failed_total += 1
            self._problem(f"moving {move.partition}'s leader from {move.from_node} to {move.to_node}: {problem}")
            return False
        self.status.moves_total += 1
        self.status.last_move = {"partition": move.partition, "from": move.from_node, "to": move.to_node,
                                 "at": time.time()}
        self._pending = (move, time.monotonic() + MOVE_SEEN_S)
        log.info("leader of partition %s moved from %s to %s (leaders per node before: %s)", move.partition,
                 move.from_node, move.to_node, ", ".join(f"{n} {c}" for n, c in sorted(counts.items())))
        return True

    async def transfer(self, view: PartitionView, to_node: str | None) -> str | None:
        """Hand ``view``'s leadership to ``to_node`` now (None: its most caught-up follower), by
        hand; None once the survey names another leader (or ``MOVE_SEEN_S`` passed), else why not."""
        async with self._round:
            problem = await self._calls.transfer(view, to_node)
            if problem is not None:
                return problem
            deadline = time.monotonic() + MOVE_SEEN_S
            while time.monotonic() < deadline:
                leader = await self.leader_of(view.name)
                if leader is not None and leader != view.leader and (to_node is None or leader == to_node):
                    return None
                await asyncio.sleep(0.2)  # pace: the hand-over completes within an election or so
            return f"no new leader seen within {MOVE_SEEN_S:.0f} s"

    async def leader_of(self, name: str) -> str | None:
        view = next((v for v in await self.survey() if v.name == name), None)
        return view.leader if view is not None else None

    def _problem(self, problem: str) -> None:
        self.status.last_problem = problem
        log.warning("%s; trying again at the next survey", problem)

    # ------------------------------------------------------------------ by hand
    async def rebalance(self, timeout_s: float) -> dict[str, Any]:
        """Move leaders now, without the hold, until balanced (or ``timeout_s``): the moves made,
        and the leaders per node after."""
        deadline = time.monotonic() + timeout_s
        moves: list[dict[str, str]] = []
        async with self._round:
            while time.monotonic() < deadline:
                views = await self.survey()
                if self._move_in_flight(views):
                    await asyncio.sleep(0.2)  # pace: the hand-over completes within an election or so
                    continue
                move = self._next_move(views, 0.0)
                if move is None:
                    break
                if await self._move(views, move):
                    moves.append({"partition": move.partition, "from": move.from_node, "to": move.to_node})
                else:
                    break
        return {"moves": moves, **self.balance_status()}

    def balance_status(self) -> dict[str, Any]:
        """Leaders per node and the spread, from the last survey; the balancer's counts."""
        leaders = [v.leaders() for v in self._views]
        counts = leaders_per_node(leaders, self.nodes())
        return {"leaders_per_node": counts, "spread": spread(leaders, self.nodes()) if counts else 0,
                "balance": self.balance, "hold_s": self.hold_s, "moves_total": self.status.moves_total,
                "moves_failed_total": self.status.moves_failed_total,
                "member_changes_total": self.status.member_changes_total, "last_move": self.status.last_move,
                "last_problem": self.status.last_problem}

    async def wait_settled(self, name: str, timeout_s: float) -> PartitionView | None:
        """The partition's view once its members match the directory and are caught up (the
        controller makes the changes meanwhile), or the last one seen at ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = next((v for v in await self.survey() if v.name == name), None)
            if view is not None and view.settled() and view.members == self._members_of(name):
                return view
            if time.monotonic() >= deadline:
                return view
            await asyncio.sleep(0.25)  # pace: a survey asks every member's /readyz

    def _members_of(self, name: str) -> tuple[str, ...] | None:
        partition = self._read_directory().partitions.get(name)
        return partition.members if partition is not None else None

