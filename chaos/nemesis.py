"""The nemesis: faults started and stopped over time, alone and in random mixes.

A fault is started by a fault maker (chaos/faults/) that acts at once (kill,
pause, cut proxy links) and returns a Fault whose ``stop`` undoes it (restart,
resume, heal). Each start and stop is a history line from process ``"nemesis"``::

    {"type": "info", "f": "kill-leader", "value": {"phase": "start", "nodes": ["node-1"], "id": 3}}

Kinds (the CLI's ``--nemesis`` names; ``all`` is every one the target can make, and
includes ``power`` and ``disk-stall`` only with ``--power-fs``):

* ``kill``: kill -9 the leader, a random follower, a minority, or every node
  at once; restarted when the fault stops.
* ``pause``: SIGSTOP the leader or a follower for longer than the election
  timeout, then SIGCONT (a deposed leader that does not know it yet).
* ``partition``: between Raft peers: isolate the leader, random halves, or a
  non-transitive ring (each node sees only its neighbours; with 3 nodes a
  bridge: two nodes see the third but not each other).
* ``one-way``: one direction of Raft traffic dropped (a random pair, or
  everything into or out of the leader).
* ``client-partition``: clients cut from the leader, a random node, or a
  majority of the nodes, while the nodes still see each other.
* ``delay`` / ``loss``: slow or lossy Raft links (see chaos.netproxy).
* ``wipe``: a follower killed, its data dir deleted, restarted empty; the
  fault lasts until it has caught up. Only from a healthy, caught-up cluster,
  never mixed, never with fewer than 3 nodes: one amnesiac node at a time is
  all Raft's majority can absorb.
* ``snapshot``: in the background, nodes asked to snapshot and compact now
  (the cluster's small compaction thresholds make them do it on their own too).
* ``deposed-leader``: the leader cut from its peers' Raft traffic while its
  clients still reach it (commits in flight on a leader about to be deposed),
  lossy links among the others; when the fault stops, the others have elected
  a new leader and compacted their logs, so the old leader rejoins through a
  snapshot install (the pattern of chaos seed 90413). Its stop line says
  whether the old leader received a snapshot. Never mixed; local target only.
* ``power``: a power failure of one follower, a minority, the leader, or every node at once:
  each is killed -9 (with what it forked), then everything its disk had not made durable is
  dropped (each node's data directory is its own powerfs mount, chaos.powerfs: unsynced
  file data, and names not made durable by an fsync of their directory); restarted when the
  fault stops. Its start line names the nodes that lost power (``lost_power``) and what each
  disk dropped (``dropped``). Local target with ``--power-fs`` only (``--nemesis power``
  implies it); a cut of one node never touches another node's disk.
* ``disk-stall``: the disk of p0's leader (``disk-stall-leader``) or, half the time, of any node
  (``-random``) stalled for 2 to 6 s (``hold_s``, chaos.faults.disks): its syncs hang in the system
  call, reads and writes go on; released then, or at the fault's stop if sooner, always by the
  heal. Stop line: ``stalled_s``, ``released_by`` (timer or stop), ``syncs_released``. Like
  ``power``, local target with ``--power-fs`` only (``--nemesis disk-stall`` implies it).
* ``membership``: a voting member removed through the leader (``membership-leader``: the leader
  itself, which hands leadership over and has the removal re-sent to its successor;
  ``membership-follower``), and re-added as itself when the fault stops: with its data kept (a
  stale log) or wiped (killed, emptied, restarted: a replacement that catches up from a
  snapshot), drawn at the start (``readd``). Mixes with the others; it stops after them (the
  re-add retries while they heal, chaos.membership). Its start line has the removal's attempts
  and outcome, its stop line the re-add's and the catch-up time; a removal the cluster refuses
  (``would_lose_quorum``, no leader...) is a ``refused`` line, not a fault window. The final heal
  re-adds every node the leader does not count as a member (``membership-heal`` ``readd``
  lines), so a run ends with every node voting. Local target only (chaos.target.membership_control).
* ``upgrade``: a node (the leader or a follower) restarted, gracefully or after a kill -9, into
  the previous release of rcq when it runs the code under test, and back when it runs the
  previous release; only while the other running nodes are a majority, and never undone: the
  node stays on that version until picked again. Its start line is ``upgrade`` or ``downgrade``
  with ``from`` and ``to``; its stop line has every node's version and feature level, and an
  ``error`` if the level rose above 1 (the runner holds it there: ``feature_level_auto`` false,
  since an old node may return at any time). The runner takes the previous release from the
  repository's history at the start (chaos.runner; no history: the run refuses to start). Local
  target only (chaos.faults.release_switch).
* ``kill-partition-process``: kill -9 one partition process (docs/partitions.md) of a live node,
  the node itself left running: its supervisor restarts the process after a back-off, and the
  fault lasts until it has (its stop line: ``restarted``). Named so as not to be confused with
  ``partition`` (the network). Only in runs with ``--partitions`` 2 or more (dropped from
  ``all`` otherwise). On the local target the partition processes reach each other through the
  proxy too (chaos.cluster), so network faults between two nodes act on their partitions' Raft
  links as on p0's; ``kill``, ``pause`` and ``power`` act on a node's whole process group, its
  partition processes with it.
* ``pause-partition-process``, ``move-leaders``, ``partition-lifecycle`` (chaos.faults.partitions):
  one partition's process frozen (its leader's, mostly) while its node runs on; up to two
  partitions' leaders moved by hand onto one node and spread again by ``POST
  /v1/cluster/rebalance`` when the fault stops (the balancer also acts by itself: its hold is 5 s
  in a chaos run); a partition created, a queue placed in it and a few items committed, deleted
  again when the fault stops (its lines say how many were acknowledged and how many the delete
  removed: the partitions checker holds them equal). Runs with ``--partitions`` 2 or more only.
* ``isolate-partition-member`` (chaos.faults.partitions): one partition's own Raft links around
  one of its members cut (its leader's, mostly), p0's and the other partitions' whole. Local
  target with ``--partitions`` 2 or more.
* ``backup``: in the background, like ``snapshot``: backups taken every few seconds (``rcq
  backup``'s code, from a follower) while the other faults run, beside a small probe load whose
  commits are recorded with their index; at most three are restored, each into a 1-node scratch
  cluster, and checked against that record (chaos.backups). Lines ``backup`` and
  ``backup-restore``, no fault windows. Not in ``all`` (each restore starts a scratch cluster).

The order and kind of faults, their durations and random targets come from
``random.Random(f"{seed}/nemesis")``; "the leader" is whoever leads then.

The nemesis drives any :class:`chaos.target.ChaosTarget` and chooses by its
capabilities, never by its class. With ``link_faults()`` (the local target's
proxy) every kind works but ``power`` and ``disk-stall``, which need the target's
``power_failure()`` and ``disk_stall()`` (chaos.faults: the local target with its
disks on powerfs), and ``membership``, which needs ``member_identity()``
(chaos.target.membership_control). Without link faults (the docker target) ``kill``, ``pause``,
``wipe`` and ``snapshot`` act on nodes all the same, ``partition`` takes whole
nodes off the network through ``node_isolation()`` (the leader, or a random
minority; no ring), and ``one-way``, ``client-partition``, ``delay``, ``loss``
and ``deposed-leader`` need per-link control and are refused, as are ``power``,
``disk-stall`` and ``membership`` (:func:`unsupported_kinds`, :func:`check_target` for the CLI).

Must not import: any rcq module but rcq.client, rcq.errors and rcq.testing's cluster harness
(for its bounded polls; chaos.backups, which runs the ``backup`` kind, also uses rcq's backup
code); nor a target's module (it sees targets through chaos.target).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

from chaos.backups import BackupNemesis
from chaos.faults import Fault, FaultMaker, FaultRefused, disk_stall, power_failure, release_switch
from chaos.faults.processes import partition_processes
from chaos.target import ChaosTarget, membership_control

KINDS = ("kill", "pause", "partition", "one-way", "client-partition", "client-drop", "delay", "loss", "wipe",
         "snapshot", "deposed-leader", "power", "membership", "upgrade", "backup", "kill-partition-process",
         "pause-partition-process", "move-leaders", "partition-lifecycle", "isolate-partition-member", "disk-stall")
BACKGROUND = ("snapshot", "backup")  # activities beside the faults, not fault windows
NOT_IN_ALL = ("backup",)  # named only: each restore starts a scratch cluster (chaos.backups)
MIXABLE = ("kill", "pause", "partition", "one-way", "client-partition", "client-drop", "delay", "loss", "power",
           "membership", "upgrade", "kill-partition-process", "pause-partition-process", "move-leaders",
           "partition-lifecycle", "isolate-partition-member", "disk-stall")
# a run with --partitions 2 or more (local target); dropped from the others
NEEDS_PARTITIONS = ("kill-partition-process", "pause-partition-process", "move-leaders", "partition-lifecycle",
                    "isolate-partition-member")
NEEDS_LINK_FAULTS = ("one-way", "client-partition", "client-drop", "delay", "loss", "deposed-leader",
                     "isolate-partition-member")
NEEDS_POWER_FS = ("power", "disk-stall")  # each node's data directory on its own powerfs mount (local, --power-fs)
POWER_FS_FAULTS = {"power": "a power failure", "disk-stall": "a stalled disk"}
NEEDS_MEMBERSHIP = ("membership",)  # nodes re-added as themselves (chaos.target.membership_control)
NEEDS_RELEASES = ("upgrade",)  # nodes restarted into the previous release (chaos.faults.release_switch)
# Whole-node isolation, no per-link faults, no powerfs, no membership changes, one release: what
# `all` is on docker (`backup` works there too, named).
DOCKER_KINDS = tuple(k for k in KINDS if k not in NEEDS_LINK_FAULTS and k not in NEEDS_POWER_FS
                     and k not in NEEDS_MEMBERSHIP and k not in NEEDS_RELEASES and k not in NOT_IN_ALL
                     and k not in NEEDS_PARTITIONS)
QUIET_S = (1.0, 4.0)
FAULT_S = (2.0, 8.0)
MIX_PROBABILITY = 0.3
SNAPSHOT_EVERY_S = (1.0, 4.0)
STEP_TIMEOUT_S = 90.0


def parse_kinds(text: str, *, power_fs: bool = False, all_kinds: tuple[str, ...] | None = None) -> list[str]:
    """Kind names from ``--nemesis``; ``all`` (``all_kinds``, e.g. DOCKER_KINDS, else every kind of
    KINDS but NOT_IN_ALL, with ``power`` and ``disk-stall`` only with ``power_fs``: both need the
    powerfs mounts) and the kinds named beside it (``all,backup``: what it leaves out)."""
    names = [k.strip() for k in text.split(",") if k.strip()]
    if names == ["none"]:
        return []
    unknown = sorted(set(names) - set(KINDS) - {"all"})
    if unknown:
        raise ValueError(f"unknown nemesis {', '.join(unknown)}; choose from {', '.join(KINDS)}, all or none")
    if "all" in names:
        every = list(all_kinds or (k for k in KINDS if (power_fs or k not in NEEDS_POWER_FS) and k not in NOT_IN_ALL))
        return every + [k for k in dict.fromkeys(names) if k not in every and k != "all"]
    return names


def unsupported_kinds(kinds: list[str], *, link_faults: bool, node_isolation: bool,
                      power_fs: bool = False, membership: bool = False, releases: bool = False,
                      disk_stalls: bool | None = None) -> list[str]:
    """The kinds a target with these capabilities cannot make (``power_fs``: power failures, and
    stalled disks unless ``disk_stalls`` says otherwise; ``membership``: nodes removed and re-added
    as themselves; ``releases``: nodes restarted into the previous release)."""
    stalls = power_fs if disk_stalls is None else disk_stalls
    return [k for k in kinds
            if (k in NEEDS_POWER_FS and not (stalls if k == "disk-stall" else power_fs))
            or (k in NEEDS_MEMBERSHIP and not membership)
            or (k in NEEDS_RELEASES and not releases)
            or (not link_faults and (k in NEEDS_LINK_FAULTS or (k == "partition" and not node_isolation)))]


def refuse_unsupported(kinds: list[str], target: str, *, link_faults: bool, node_isolation: bool,
                       power_fs: bool = False, membership: bool = False, releases: bool = False,
                       disk_stalls: bool | None = None) -> None:
    """ValueError naming the kinds of ``kinds`` that ``target`` cannot make, and why."""
    capabilities = {"link_faults": link_faults, "node_isolation": node_isolation, "power_fs": power_fs,
                    "membership": membership, "releases": releases,
                    "disk_stalls": power_fs if disk_stalls is None else disk_stalls}
    unsupported = unsupported_kinds(kinds, **capabilities)
    if not unsupported:
        return
    supported = [k for k in KINDS if not unsupported_kinds([k], **capabilities)]
    linked = [k for k in unsupported if k not in NEEDS_POWER_FS and k not in NEEDS_MEMBERSHIP
              and k not in NEEDS_RELEASES]
    powered = [k for k in unsupported if k in NEEDS_POWER_FS]
    membered = [k for k in unsupported if k in NEEDS_MEMBERSHIP]
    released = [k for k in unsupported if k in NEEDS_RELEASES]
    reasons = []
    if linked:
        partitions = ("its partitions are whole-node (a node is on the network or off it)" if node_isolation
                      else "it cannot partition nodes at all")
        reasons.append(
            f"nemesis {', '.join(linked)} not supported with --target {target}: {partitions}, so one-way "
            "drops, delay, loss, client-only partitions and a deposed leader need per-link faults (the local "
            "target's proxy)")
    if powered:
        where = "" if target == "local" else " (local target only)"
        faults = " and ".join(POWER_FS_FAULTS[k] for k in powered)
        reasons.append(
            f"nemesis {', '.join(powered)} not supported with --target {target}"
            + (" without --power-fs" if target == "local" else "")
            + f": {faults} {'needs' if len(powered) == 1 else 'need'} each node's data directory on its own "
            f"powerfs mount (--power-fs{where})")
    if membered:
        why = ("its nodes advertise their published host ports, which the leader's health probe of a node "
               "being re-added cannot reach from inside its container" if target == "docker"
               else "the target cannot re-add a removed node as itself (no member_identity)")
        reasons.append(f"nemesis {', '.join(membered)} not supported with --target {target}: {why}; membership "
                       "changes need the local target")
    if released:
        why = ("its nodes run the image built from this checkout only" if target == "docker"
               else "the target was given no previous release to run")
        reasons.append(f"nemesis {', '.join(released)} not supported with --target {target}: {why}; nodes restarted "
                       "into the previous release need the local target (chaos.runner makes it from the history)")
    raise ValueError("; ".join(reasons) + f"; {target} supports {', '.join(supported)}"
                     + ("" if target == "local" else " (use --target local for the rest)"))


def check_target(kinds: list[str], target: str) -> None:
    """ValueError when ``target`` cannot make one of ``kinds``: the CLI's check, before any
    cluster exists (docker isolates whole nodes and has no per-link faults nor powerfs; the
    local target mounts powerfs when ``power`` or ``disk-stall`` is chosen)."""
    docker = target == "docker"
    refuse_unsupported(kinds, target, link_faults=not docker, node_isolation=docker, power_fs=not docker,
                       membership=not docker, releases=not docker)


class Nemesis:
    """Starts and stops faults on ``cluster`` until told to stop, writing each to ``history``."""

    def __init__(self, cluster: ChaosTarget, history: Any, seed: int, kinds: list[str],
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self._check(kinds, cluster)
        self.cluster = cluster
        self.history = history
        self.random = random.Random(f"{seed}/nemesis")
        self.kinds = [k for k in kinds if k not in BACKGROUND]
        if len(cluster.nodes) < 3:
            self.kinds = [k for k in self.kinds if k != "wipe"]
        if partition_processes(cluster) is None:  # p0 alone: no partition process to kill
            self.kinds = [k for k in self.kinds if k not in NEEDS_PARTITIONS]
        self.snapshots = "snapshot" in kinds
        self.backups = BackupNemesis(cluster, history, random.Random(f"{seed}/backup"), progress) \
            if "backup" in kinds else None
        self.progress = progress
        self.active: list[tuple[int, Fault]] = []
        self.windows: list[dict[str, Any]] = []
        self._next_id = 0
        self._lock = asyncio.Lock()  # a fault's start or stop runs whole, never beside the heal
        self.faults = FaultMaker(cluster, others_active=lambda: bool(self.active))

    # ------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._faults(stop))]
        if self.snapshots:
            tasks.append(asyncio.create_task(self._snapshots(stop)))
        if self.backups is not None:
            tasks.append(asyncio.create_task(self.backups.run(stop)))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep unless stopped first; True when stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        return stop.is_set()

    async def _faults(self, stop: asyncio.Event) -> None:
        if not self.kinds:
            return
        while not await self._sleep(stop, self.random.uniform(*QUIET_S)):
            first = self.random.choice(self.kinds)
            chosen = [first]
            mixable = [k for k in self.kinds if k in MIXABLE and k != first]
            if first in MIXABLE and mixable and self.random.random() < MIX_PROBABILITY:
                chosen.append(self.random.choice(mixable))
            duration_s = self.random.uniform(*FAULT_S)
            salt = self.random.random()  # target choices: drawn now, so the sequence stays seeded
            for kind in chosen:
                await self._start(kind, random.Random(f"{salt}/{kind}"))
            await self._sleep(stop, duration_s)
            await self.stop_all()

    async def _snapshots(self, stop: asyncio.Event) -> None:
        rng = random.Random(self.random.random())
        while not await self._sleep(stop, rng.uniform(*SNAPSHOT_EVERY_S)):
            live = self.cluster.live_indices()
            if not live:
                continue
            i = rng.choice(live)
            self._record("snapshot", "start", [i], {})
            with contextlib.suppress(OSError, ValueError):
                await asyncio.to_thread(self.cluster.request_snapshot, i)
            self._record("snapshot", "stop", [i], {})

    # ------------------------------------------------------------ start/stop
    async def _start(self, kind: str, rng: random.Random) -> None:
        async with self._lock:
            try:
                fault = await asyncio.wait_for(asyncio.to_thread(self._begin, kind, rng), STEP_TIMEOUT_S)
            except FaultRefused as refused:  # the cluster said no: an outcome, not a fault window
                self._note(refused.f, "refused", refused.nodes, refused.details)
                self.progress(f"nemesis: {refused.f} refused: {refused.details.get('reason')}")
                return
            except Exception as exc:  # a fault that could not start is reported, not fatal
                self.progress(f"nemesis: {kind} did not start: {exc!r}")
                return
            if fault is None:
                return
            fault_id = self._next_id
            self._next_id += 1
            self.active.append((fault_id, fault))
            self._record(fault.f, "start", fault.nodes, {"id": fault_id, **fault.details})
            self.progress(f"nemesis: start {fault.f} on {self._names(fault.nodes)}")

    async def stop_all(self) -> None:
        """Stop every active fault, the latest first, those marked ``stop_last`` after the others."""
        async with self._lock:
            while self.active:
                rest = [k for k, (_, f) in enumerate(self.active) if not f.stop_last]
                fault_id, fault = self.active.pop(rest[-1] if rest else -1)
                try:
                    await asyncio.wait_for(asyncio.to_thread(fault.stop), STEP_TIMEOUT_S)
                    error = None
                except Exception as exc:  # the final heal retries everything
                    error = repr(exc)
                self._record(fault.f, "stop", fault.nodes,
                             {"id": fault_id, **fault.outcome, **({"error": error} if error else {})})
                self.progress(f"nemesis: stop {fault.f}" + (f" ({error})" if error else ""))

    async def heal(self) -> None:
        """Undo every fault: stop the active ones, heal every link, resume and start every node."""
        await self.stop_all()
        async with self._lock:
            self.faults.forget_link_layers()  # the target's heal clears every link
            try:
                await asyncio.to_thread(self.cluster.heal)
            finally:
                if "membership" in self.kinds:
                    await self._readd_missing()

    async def _readd_missing(self) -> None:
        """Every node the leader does not count as a voting member re-added, one line each."""
        try:
            outcomes = await asyncio.to_thread(self.faults.readd_missing)
        except Exception as exc:  # the membership checker finds the node missing
            outcomes = [{"error": repr(exc)}]
        for outcome in outcomes:
            index = outcome.pop("index", None)
            self._note("membership-heal", "readd", [] if index is None else [index], {"readd": "heal", **outcome})
            self.progress(f"nemesis: final heal re-add {outcome.get('node', '')}: "
                          f"{outcome.get('result') or outcome.get('error')}")

    def _record(self, f: str, phase: str, nodes: list[int], extra: dict[str, Any]) -> None:
        op = self.history.info("nemesis", f, {"phase": phase, "nodes": self._names(nodes), **extra})
        if f == "snapshot":
            return
        if phase == "start":
            self.windows.append({"id": extra.get("id"), "f": f, "nodes": self._names(nodes), "start_s": op.time_s})
        else:
            for window in self.windows:
                if window["id"] == extra.get("id") and "stop_s" not in window:
                    window["stop_s"] = op.time_s

    def _note(self, f: str, phase: str, nodes: list[int], extra: dict[str, Any]) -> None:
        """A nemesis line that is no fault window (a refused fault, the final heal's re-adds)."""
        self.history.info("nemesis", f, {"phase": phase, "nodes": self._names(nodes), **extra})

    def _names(self, nodes: list[int]) -> list[str]:
        return [self.cluster.nodes[i].node_id for i in nodes]

    # ------------------------------------------------------ fault makers (threads)
    @staticmethod
    def _check(kinds: list[str], cluster: ChaosTarget) -> None:
        refuse_unsupported(kinds, cluster.target, link_faults=cluster.link_faults() is not None,
                           node_isolation=cluster.node_isolation() is not None,
                           power_fs=power_failure(cluster) is not None,
                           disk_stalls=disk_stall(cluster) is not None,
                           membership=membership_control(cluster) is not None,
                           releases=release_switch(cluster) is not None)

    def _begin(self, kind: str, rng: random.Random) -> Fault | None:
        self._check([kind], self.cluster)
        return self.faults.begin(kind, rng)
