"""The cluster's feature level: what each member reads, and raising the active level.

The active level is replicated (``QueueStateMachine.level``); a leader raises it with a ``level``
entry, and only to a level every voting member reads, which each states on ``/healthz``
(``feature_level_max``; a member that states nothing is a release before feature levels: level 1).
A member that does not answer holds the raise back: it might be an older release.

Raised two ways (docs/upgrades.md): by an admin (``POST /v1/cluster/feature-level``), or, with
``feature_level_auto`` (the default), by the leader itself once every member reads a higher level
than the active one: a rolling upgrade ends with its last node, and the new formats switch on.
Holding ``feature_level_auto`` off keeps the cluster at its level, so that a node can still be
rolled back to the release before, until an admin raises it.

The same loop gives the cluster its **identity** (docs/backup.md): once the active level is 2 or
more and the state has none, the serving leader proposes an ``identity`` entry with a uuid4 it
generates (the state machine stays deterministic: it takes the first identity and ignores any
later one, so racing leaders are harmless). This is the one place that proposes it: after a raise
by this loop at once, otherwise (an admin's raise, a new leader, a cluster restored without one)
at the loop's next turn.

Must not import: aiohttp, pysyncobj, lmdb (the member survey is given by the HTTP layer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from rcq.errors import FeatureLevelRequired, FeatureLevelUnsupported, RcqError, Unavailable
from rcq.server.config import NodeConfig
from rcq.server.core.commands import SetIdentity, SetIdentityResult, SetLevel, SetLevelResult
from rcq.server.core.features import LEVEL_OF_CLUSTER_IDENTITY, LEVELS, describe, level_max_read
from rcq.server.leader.membership import Membership
from rcq.server.leader.partition_directory import partition_ports_of
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator
from rcq.version import rcq_version

log = logging.getLogger(__name__)

AUTO_RAISE_INTERVAL_S = 5.0  # how often a leader below its LEVEL_MAX asks its members what they read
SERVING_POLL_S = 0.2  # how soon after it starts serving a leader takes its first turn (a local look)


@dataclass(frozen=True)
class NodeLevels:
    """What one node says of itself on /healthz."""

    version: str | None  # None: a release before versions were reported (rcq 0.1)
    level_max: int
    partition_ports: dict[str, Any] | None = None  # where it serves partitions (partition_directory.partition_ports_of)


# url -> what the node there reads, or why it could not be asked
Survey = Callable[[str], Awaitable[NodeLevels | str]]


@dataclass(frozen=True)
class MemberLevels:
    node_id: str
    url: str | None
    version: str | None
    level_max: int | None  # None: unknown (unreachable)
    problem: str | None = None
    partition_ports: dict[str, Any] | None = None  # what it states on /healthz (None: nothing, or not asked)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class FeatureLevels:
    def __init__(self, config: NodeConfig, manager: TransactionManager, replicator: Replicator,
                 membership: Membership, survey: Survey) -> None:
        self._config = config
        self._manager = manager
        self._replicator = replicator
        self._membership = membership
        self._survey = survey
        self._level_max = level_max_read(config.test_feature_level_max)  # what this node reads
        self._raising = asyncio.Lock()
        self._auto_task: asyncio.Task[None] | None = None
        self._own_ports = partition_ports_of(config) if config.serves_partitions else None
        # Called at every turn of the loop, with the members' answers (the partition directory's upkeep).
        self.on_turn: list[Callable[[list[MemberLevels]], Awaitable[None]]] = []

    # ---------------------------------------------------------------- reading
    def active(self) -> int:
        return int(self._replicator.read(lambda sm: sm.level))

    def require(self, level: int, feature: str) -> None:
        """Raise FeatureLevelRequired unless the cluster runs at ``level`` or above (a gate on
        anything written in a format of that level)."""
        active = self.active()
        if active < level:
            raise FeatureLevelRequired(
                f"{feature} needs feature level {level}; the cluster runs at {active}. Upgrade every member to "
                f"rcq {LEVELS[level - 1].since} or later, then raise the level (docs/upgrades.md)",
                details={"feature": feature, "level_required": level, "level_active": active})

    async def members(self) -> list[MemberLevels]:
        """Every voting member and the levels it reads (this node's own without asking)."""
        found = []
        for member in self._membership.members():
            if member.self:
                found.append(MemberLevels(member.node_id, member.url, rcq_version(), self._level_max,
                                          partition_ports=self._own_ports))
                continue
            if member.url is None:
                found.append(MemberLevels(member.node_id, None, None, None, "no HTTP URL known"))
                continue
            answer = await self._survey(self._config.peer_url(member.node_id, member.url))  # a URL between nodes
            if isinstance(answer, str):
                found.append(MemberLevels(member.node_id, member.url, None, None, answer))
            else:
                found.append(MemberLevels(member.node_id, member.url, answer.version, answer.level_max,
                                          partition_ports=answer.partition_ports))
        return found

    async def report(self) -> dict[str, Any]:
        active, writer = self._replicator.read(lambda sm: (sm.level, sm.level_writer))
        return {"active": active, "raised_by_version": writer, "max": self._level_max,
                "auto": self._config.feature_level_auto,
                "levels": [{"level": lv.number, "name": lv.name, "summary": lv.summary, "since": lv.since}
                           for lv in LEVELS],
                "members": [m.as_dict() for m in await self.members()]}

    # ---------------------------------------------------------------- raising
    async def raise_to(self, level: int | None) -> dict[str, Any]:
        """Raise the active level to ``level`` (None: the highest every member reads). Answers
        once the entry is applied; raises FeatureLevelUnsupported when a member (or this node)
        cannot read it or it would go down, Unavailable when a member cannot be asked."""
        self._manager.require_serving()
        async with self._raising:
            previous = self.active()
            members = await self.members()
            unknown = [m for m in members if m.level_max is None]
            if unknown:
                raise Unavailable(
                    "cannot tell which feature levels " + ", ".join(f"{m.node_id} ({m.problem})" for m in unknown)
                    + " reads; the level is raised only when every member answers",
                    details={"members": [m.as_dict() for m in members]})
            readable = min(m.level_max for m in members if m.level_max is not None)
            target = readable if level is None else level
            if target < previous:
                raise FeatureLevelUnsupported(
                    f"the cluster runs at feature level {previous}; a level never goes down",
                    details={"level_active": previous, "level_asked": target})
            if target > readable:
                behind = [m for m in members if m.level_max is not None and m.level_max < target]
                raise FeatureLevelUnsupported(
                    f"{describe(target)} is not read by "
                    + ", ".join(f"{m.node_id} (rcq {m.version or '0.1'}, up to level {m.level_max})" for m in behind)
                    + "; upgrade them first", details={"members": [m.as_dict() for m in members]})
            if target == previous:
                return {"level": previous, "previous": previous, "changed": False}
            result = await self._replicator.submit(
                SetLevel(*self._manager.entry_stamp(), level=target, writer_version=rcq_version()),
                self._config.commit_timeout_s)
            if not isinstance(result, SetLevelResult) or result.status != "done":
                raise Unavailable(f"the level entry was not applied ({result!r}); retry")
            log.info("feature level raised from %d to %s", previous, describe(result.level))
            return {"level": result.level, "previous": previous, "changed": True}

    # ---------------------------------------------------------------- automatic
    def start(self) -> None:
        # Always running: the identity is given whether or not the level is raised automatically.
        self._auto_task = asyncio.get_running_loop().create_task(self._raise_when_all_read(),
                                                                 name="rcq-feature-level")

    async def stop(self) -> None:
        if self._auto_task is not None:
            self._auto_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._auto_task
            self._auto_task = None

    async def _raise_when_all_read(self) -> None:
        # A turn as soon as this node starts serving as leader (a new cluster settles at once:
        # its level raised, its identity given), then every AUTO_RAISE_INTERVAL_S while it leads.
        loop = asyncio.get_running_loop()
        next_turn: float | None = None  # None: not serving at the last look
        while True:
            await asyncio.sleep(SERVING_POLL_S)
            if not self._manager.serving:
                next_turn = None
                continue
            if next_turn is not None and loop.time() < next_turn:
                continue
            next_turn = loop.time() + AUTO_RAISE_INTERVAL_S
            await self._turn()

    async def _turn(self) -> None:
        if self._config.feature_level_auto and self.active() < self._level_max:
            try:
                await self.raise_to(None)
            except RcqError as exc:  # a member behind or unreachable: asked again later
                log.debug("feature level not raised: %s", exc)
            except Exception:
                log.exception("raising the feature level failed")
        try:
            await self.give_identity()
        except RcqError as exc:  # not leading any more, or the entry's outcome unknown: next turn
            log.debug("cluster identity not given: %s", exc)
        except Exception:
            log.exception("giving the cluster its identity failed")
        if self.on_turn:
            members = await self.members()
            for call in self.on_turn:
                try:
                    await call(members)
                except RcqError as exc:  # not leading any more, or an outcome unknown: next turn
                    log.debug("a feature-level turn's follow-up failed: %s", exc)
                except Exception:
                    log.exception("a feature-level turn's follow-up failed")

    # ---------------------------------------------------------------- identity
    async def give_identity(self) -> str | None:
        """Propose the cluster's identity when it runs at level 2 or more and has none; the
        identity after (None at level 1). Idempotent: the state keeps the first one."""
        active, cluster_id = self._replicator.read(lambda sm: (sm.level, sm.cluster_id))
        if cluster_id is not None or active < LEVEL_OF_CLUSTER_IDENTITY:
            return cluster_id
        self._manager.require_serving()
        result = await self._replicator.submit(
            SetIdentity(*self._manager.entry_stamp(), cluster_id=str(uuid.uuid4())), self._config.commit_timeout_s)
        if not isinstance(result, SetIdentityResult) or result.status == "rejected":
            raise Unavailable(f"the identity entry was not applied ({result!r}); retry")
        if result.status == "done":
            log.info("the cluster's identity is %s", result.cluster_id)
        return result.cluster_id
