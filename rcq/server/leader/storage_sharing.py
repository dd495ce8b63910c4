"""p0's serving leader shares each node's memory budget between the partitions the node hosts
(docs/partitions.md, "Memory budget").

At every survey of p0's controller (rcq.server.leader.partition_controller) it works out each
partition's allowance (:func:`rcq.server.leader.storage_budget.allowances`) from what the members
answered, gives p0's to this process's leader directly, and every other partition's to each of its
member processes with a call signed with the cluster secret (``PUT /v1/cluster/storage-budget``):
to the followers too, so that a member elected leader already stamps the allowance its partition
was given. What it works from:

* **who hosts what**: p0 on every voting node and on every partition member; a partition on its
  directory members and its Raft members (one being added or removed holds the data too);
* **each node's budget**, as its partition processes say (``node_storage_bytes_max``), remembered;
  a node none of whose processes ever answered counts as having this node's (the documented
  setting: the same on every node);
* **what each partition holds**: its leader's ``storage_bytes``, else the most a member says; a
  partition no member answered for counts as holding all it was last allowed;
* **the allowance each holds**: the most any member says (whichever is elected stamps its own);
  p0's, this process's.

Lowerings are given first, raises only in a round where every lowering was taken
(:func:`~rcq.server.leader.storage_budget.plan` counts on them). A member holding less than its
partition's allowance (a process that restarted takes its static share) is given it too.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from rcq.names import P0
from rcq.server.config import NodeConfig
from rcq.server.core.directory import Directory
from rcq.server.leader.partition_controller import PartitionView
from rcq.server.leader.storage_budget import allowances, change_threshold, members_of, plan, static_share
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)


class OwnPartition(Protocol):
    """p0 in this process: its node, the node's budget, what it holds, the allowance its leader stamps."""

    @property
    def node_id(self) -> str: ...

    @property
    def budget_bytes(self) -> int: ...

    def used_bytes(self) -> int: ...

    def allowance_bytes(self) -> int: ...

    def set_allowance(self, storage_bytes_max: int) -> int: ...


class BudgetCalls(Protocol):
    """The partition processes' side (rcq.server.http.partition_control.PartitionCalls)."""

    async def set_storage_budget(self, view: PartitionView, node_id: str, storage_bytes_max: int) -> str | None:
        """Give ``node_id``'s process of ``view`` the allowance ``storage_bytes_max``; None when
        taken, else why not."""


class LocalP0:
    """:class:`OwnPartition` over this process's transaction manager and replica."""

    def __init__(self, config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> None:
        self.node_id = config.node_id
        self.budget_bytes = config.storage_bytes_max
        self._manager = manager
        self._replicator = replicator

    def used_bytes(self) -> int:
        return self._replicator.read(lambda sm: sm.storage_cost)

    def allowance_bytes(self) -> int:
        return self._manager.storage_bytes_max

    def set_allowance(self, storage_bytes_max: int) -> int:
        return self._manager.set_storage_budget(storage_bytes_max)


class StorageSharing:
    def __init__(self, own: OwnPartition, calls: BudgetCalls) -> None:
        self._own = own
        self._calls = calls
        self._budgets: dict[str, int] = {own.node_id: own.budget_bytes}  # node -> budget, as last said
        self._last: dict[str, int] = {}  # partition -> the allowance it was last seen with, or given

    def began_serving(self, directory: Directory) -> None:
        """p0's leader is about to serve: until its first round, p0 takes at most the static share
        (what a partition process starts with), not what it had when it last led, or the whole budget."""
        hosted = directory.hosted()
        share = static_share(self._own.budget_bytes, 1 + max(hosted.values(), default=0))
        self._own.set_allowance(min(self._own.allowance_bytes(), share))

    async def share(self, views: list[PartitionView], nodes: list[str]) -> None:
        """One round: the allowances worked out from ``views`` (the survey) given where they changed."""
        by_name = {view.name: view for view in views}
        hosted = _hosted(views, nodes)
        for view in views:
            for member, figures in view.storage.items():
                if figures.node_budget_bytes is not None:
                    self._budgets[member] = figures.node_budget_bytes
        budgets = {node: self._budgets.get(node, self._own.budget_bytes) for node in hosted}
        members = members_of(hosted)
        thresholds = {name: change_threshold(min(budgets[n] for n in nodes_of)) for name, nodes_of in members.items()}
        used, held = self._holdings(by_name, hosted, budgets, members)
        targets = allowances(budgets, hosted, used)
        planned = plan(targets, held, budgets, hosted)
        if not await self._give(planned.lowered, by_name, thresholds):
            return  # a raise counts on every lowering: they are given again at the next round
        await self._give(planned.raised, by_name, thresholds)
        steady = {name: held[name] for name in by_name if name not in planned.lowered and name not in planned.raised}
        await self._give(steady, by_name, thresholds, lagging_only=True)

    def _holdings(self, by_name: Mapping[str, PartitionView], hosted: Mapping[str, set[str]],
                  budgets: Mapping[str, int], members: Mapping[str, list[str]]
                  ) -> tuple[dict[str, int], dict[str, int]]:
        """(partition -> what it holds, partition -> the allowance it holds), p0's included."""
        used, held = {P0: self._own.used_bytes()}, {P0: self._own.allowance_bytes()}
        for name, view in by_name.items():
            figures = view.storage
            allowance = max((f.allowance_bytes for f in figures.values() if f.allowance_bytes is not None), default=None)
            if allowance is None:  # no member answered: what it was last seen with, or its static share
                nodes_of = members[name]
                allowance = self._last.get(name) or static_share(min(budgets[n] for n in nodes_of),
                                                                 max(len(hosted[n]) for n in nodes_of))
            held[name] = allowance
            leader = figures.get(view.leader) if view.leader is not None else None
            amounts = [f.used_bytes for f in figures.values() if f.used_bytes is not None]
            if leader is not None and leader.used_bytes is not None:
                used[name] = leader.used_bytes
            else:  # no leader: the most a member holds; none answered: all it may hold
                used[name] = max(amounts) if amounts else allowance
        self._last = {name: value for name, value in held.items() if name != P0}
        return used, held

    async def _give(self, values: Mapping[str, int], by_name: Mapping[str, PartitionView],
                    thresholds: Mapping[str, int], lagging_only: bool = False) -> bool:
        """Give each partition of ``values`` its allowance: p0 here, the others at every answering
        member that holds another (``lagging_only``: one that holds less by over the threshold);
        True when every one took it."""
        sends: list[tuple[PartitionView, str, int]] = []
        for name, value in sorted(values.items()):
            if name == P0:
                if self._own.allowance_bytes() != value:
                    log.info("storage allowance of p0: %d bytes (was %d)", value, self._own.allowance_bytes())
                    self._own.set_allowance(value)
                continue
            view = by_name[name]
            for member, figures in sorted(view.storage.items()):
                have = figures.allowance_bytes
                if have is None or have == value or member not in view.urls:
                    continue
                if lagging_only and value - have <= thresholds[name]:
                    continue
                sends.append((view, member, value))
        problems = await asyncio.gather(*(self._calls.set_storage_budget(view, member, value)
                                          for view, member, value in sends))
        taken: dict[tuple[str, int], list[str]] = {}
        for (view, member, value), problem in zip(sends, problems, strict=True):
            if problem is None:
                self._last[view.name] = value
                taken.setdefault((view.name, value), []).append(f"{member} (had {view.storage[member].allowance_bytes})")
            else:
                log.warning("giving %s's process at %s its storage allowance of %d bytes: %s; again at the next "
                            "survey", view.name, member, value, problem)
        for (name, value), where in sorted(taken.items()):
            log.info("storage allowance of %s: %d bytes, taken at %s", name, value, ", ".join(where))
        return all(problem is None for problem in problems)


def _hosted(views: list[PartitionView], nodes: list[str]) -> dict[str, set[str]]:
    """node -> the partitions it hosts (p0 included): each partition on its directory members and
    its Raft members."""
    hosted: dict[str, set[str]] = {node: {P0} for node in nodes}
    for view in views:
        for member in {*view.members, *(view.raft_members or ())}:
            hosted.setdefault(member, {P0}).add(view.name)
    return hosted
