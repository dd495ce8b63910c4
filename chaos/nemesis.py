"""The nemesis: faults started and stopped over time, alone and in random mixes.

A fault is started by a function that acts at once (kill, pause, cut proxy
links) and returns a :class:`Fault` whose ``stop`` undoes it (restart, resume,
heal). Each start and stop is a history line from process ``"nemesis"``::

    {"type": "info", "f": "kill-leader", "value": {"phase": "start", "nodes": ["node-1"], "id": 3}}

Kinds (the CLI's ``--nemesis`` names; ``all`` is every one):

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

The order and kind of faults, their durations and random targets come from
``random.Random(f"{seed}/nemesis")``; "the leader" is whoever leads then.

The nemesis drives any :class:`chaos.target.ChaosTarget` and chooses by its
capabilities, never by its class. With ``link_faults()`` (the local target's
proxy) every kind works. Without it (the docker target) ``kill``, ``pause``,
``wipe`` and ``snapshot`` act on nodes all the same, ``partition`` takes whole
nodes off the network through ``node_isolation()`` (the leader, or a random
minority; no ring), and ``one-way``, ``client-partition``, ``delay``, ``loss``
and ``deposed-leader`` need per-link control and are refused
(:func:`unsupported_kinds`, :func:`check_target` for the CLI).

Must not import: any rcq module but rcq.client, rcq.errors and rcq.testing's cluster harness
(for its bounded polls); nor a target's module (it sees targets through chaos.target).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable
from typing import Any

from chaos.netproxy import HEALTHY, LinkFault
from chaos.target import ChaosTarget, LinkFaults, client_link, raft_link
from rcq.testing.polls import poll_until


def combine_link_faults(faults: Any) -> LinkFault:
    """What a link does under several faults at once: drops if any drops, the worst delay and loss."""
    faults = list(faults)
    if not faults:
        return HEALTHY
    return LinkFault(drop_forward=any(f.drop_forward for f in faults),
                     drop_backward=any(f.drop_backward for f in faults),
                     delay_s=max(f.delay_s for f in faults), jitter_s=max(f.jitter_s for f in faults),
                     loss=max(f.loss for f in faults))

KINDS = ("kill", "pause", "partition", "one-way", "client-partition", "delay", "loss", "wipe", "snapshot",
         "deposed-leader")
MIXABLE = ("kill", "pause", "partition", "one-way", "client-partition", "delay", "loss")
NEEDS_LINK_FAULTS = ("one-way", "client-partition", "delay", "loss", "deposed-leader")
DOCKER_KINDS = tuple(k for k in KINDS if k not in NEEDS_LINK_FAULTS)  # whole-node isolation, no per-link faults
QUIET_S = (1.0, 4.0)
FAULT_S = (2.0, 8.0)
PAUSE_S = (2.0, 5.0)  # above raft_timeout_max_s (1.6 s): the others elect a new leader meanwhile
MIX_PROBABILITY = 0.3
SNAPSHOT_EVERY_S = (1.0, 4.0)
WIPE_CATCH_UP_S = 60.0
DEPOSED_LEADER_LOSS = (0.03, 0.15)
DEPOSED_LEADER_WAIT_S = 15.0  # for the new leader, the compactions and the snapshot install, each
STEP_TIMEOUT_S = 90.0


def parse_kinds(text: str) -> list[str]:
    names = [k.strip() for k in text.split(",") if k.strip()]
    if names == ["all"]:
        return list(KINDS)
    if names == ["none"]:
        return []
    unknown = sorted(set(names) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown nemesis {', '.join(unknown)}; choose from {', '.join(KINDS)}, all or none")
    return names


def unsupported_kinds(kinds: list[str], *, link_faults: bool, node_isolation: bool) -> list[str]:
    """The kinds a target with these capabilities cannot make."""
    if link_faults:
        return []
    return [k for k in kinds if k in NEEDS_LINK_FAULTS or (k == "partition" and not node_isolation)]


def refuse_unsupported(kinds: list[str], target: str, *, link_faults: bool, node_isolation: bool) -> None:
    """ValueError naming the kinds of ``kinds`` that ``target`` cannot make, and why."""
    unsupported = unsupported_kinds(kinds, link_faults=link_faults, node_isolation=node_isolation)
    if not unsupported:
        return
    partitions = ("its partitions are whole-node (a node is on the network or off it)" if node_isolation
                  else "it cannot partition nodes at all")
    supported = [k for k in KINDS if not unsupported_kinds([k], link_faults=link_faults, node_isolation=node_isolation)]
    raise ValueError(
        f"nemesis {', '.join(unsupported)} not supported with --target {target}: {partitions}, so one-way "
        "drops, delay, loss, client-only partitions and a deposed leader need per-link faults (the local "
        f"target's proxy); {target} supports {', '.join(supported)} (use --target local for the rest)")


def check_target(kinds: list[str], target: str) -> None:
    """ValueError when ``target`` cannot make one of ``kinds``: the CLI's check, before any
    cluster exists (docker isolates whole nodes and has no per-link faults)."""
    docker = target == "docker"
    refuse_unsupported(kinds, target, link_faults=not docker, node_isolation=docker)


@dataclasses.dataclass
class Fault:
    f: str
    nodes: list[int]
    stop: Callable[[], None]
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    outcome: dict[str, Any] = dataclasses.field(default_factory=dict)  # what stop() saw, for its history line


class Nemesis:
    """Starts and stops faults on ``cluster`` until told to stop, writing each to ``history``."""

    def __init__(self, cluster: ChaosTarget, history: Any, seed: int, kinds: list[str],
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.links: LinkFaults | None = cluster.link_faults()
        self._check(kinds, cluster)
        self.cluster = cluster
        self.history = history
        self.random = random.Random(f"{seed}/nemesis")
        self.kinds = [k for k in kinds if k != "snapshot"]
        if len(cluster.nodes) < 3:
            self.kinds = [k for k in self.kinds if k != "wipe"]
        self.snapshots = "snapshot" in kinds
        self.progress = progress
        self.active: list[tuple[int, Fault]] = []
        self.windows: list[dict[str, Any]] = []
        self._next_id = 0
        self._lock = asyncio.Lock()  # a fault's start or stop runs whole, never beside the heal
        # Faults active at once may touch the same link (a partition and a delay): each keeps its
        # own layer, and the link gets their combination, so stopping one never undoes another.
        self._link_layers: dict[str, dict[int, LinkFault]] = {}
        self._next_layer = 0

    # ------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._faults(stop))]
        if self.snapshots:
            tasks.append(asyncio.create_task(self._snapshots(stop)))
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
        async with self._lock:
            while self.active:
                fault_id, fault = self.active.pop()
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
            self._link_layers.clear()  # the target's heal clears every link
            await asyncio.to_thread(self.cluster.heal)

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

    def _names(self, nodes: list[int]) -> list[str]:
        return [self.cluster.nodes[i].node_id for i in nodes]

    # ------------------------------------------------------ fault makers (threads)
    def _leader_or_any(self, rng: random.Random, among: list[int]) -> int | None:
        leader = self.cluster.leader()
        if leader is not None and leader in among:
            return leader
        return rng.choice(among) if among else None

    @staticmethod
    def _check(kinds: list[str], cluster: ChaosTarget) -> None:
        refuse_unsupported(kinds, cluster.target, link_faults=cluster.link_faults() is not None,
                           node_isolation=cluster.node_isolation() is not None)

    def _begin(self, kind: str, rng: random.Random) -> Fault | None:
        self._check([kind], self.cluster)
        return getattr(self, "_begin_" + kind.replace("-", "_"))(rng)

    def _begin_kill(self, rng: random.Random) -> Fault | None:
        cluster = self.cluster
        running = [i for i in cluster.running_indices() if not cluster.nodes[i].paused]
        n = len(cluster.nodes)
        variant = rng.choice(["kill-leader", "kill-follower", "kill-minority", "kill-all"])
        leader = cluster.leader()
        if variant == "kill-leader":
            targets = [leader] if leader is not None and leader in running else running[:0]
        elif variant == "kill-follower":
            followers = [i for i in running if i != leader]
            targets = [rng.choice(followers)] if followers else []
        elif variant == "kill-minority":
            targets = rng.sample(running, min(len(running), max(1, (n - 1) // 2)))
        else:
            targets = list(running)
        if not targets:
            return None
        for i in targets:
            cluster.kill_node(i)

        def stop() -> None:
            for i in targets:
                if not cluster.nodes[i].running():
                    cluster.start_node(i, wait=False)
            cluster.wait_for_http(targets)

        return Fault(variant, targets, stop)

    def _begin_pause(self, rng: random.Random) -> Fault | None:
        cluster = self.cluster
        live = cluster.live_indices()
        leader = cluster.leader()
        variant = rng.choice(["pause-leader", "pause-follower"])
        if variant == "pause-leader" and leader is not None and leader in live:
            targets = [leader]
        else:
            variant = "pause-follower"
            followers = [i for i in live if i != leader]
            targets = [rng.choice(followers)] if followers else []
        if not targets:
            return None
        for i in targets:
            cluster.pause_node(i)

        def stop() -> None:
            for i in targets:
                cluster.resume_node(i)

        return Fault(variant, targets, stop)

    def _cut(self, pairs: list[tuple[int, int]]) -> dict[str, LinkFault]:
        return {raft_link(a, b): LinkFault(drop_forward=True, drop_backward=True) for a, b in pairs if a != b}

    def _links_fault(self, f: str, nodes: list[int], faults: dict[str, LinkFault], details: dict[str, Any]) -> Fault:
        proxy = self.links
        assert proxy is not None, "link faults need a target with link_faults()"
        layer = self._next_layer
        self._next_layer += 1
        for name, fault in faults.items():
            self._link_layers.setdefault(name, {})[layer] = fault
        names = list(faults)
        proxy.set_faults({name: combine_link_faults(self._link_layers[name].values()) for name in names})

        def stop() -> None:
            for name in names:
                self._link_layers.get(name, {}).pop(layer, None)
            proxy.set_faults({name: combine_link_faults(self._link_layers.get(name, {}).values())
                              for name in names})

        return Fault(f, nodes, stop, {**details, "links": names})

    def _whole_node_partition(self, rng: random.Random) -> Fault | None:
        """Whole nodes off the network: the leader, or a random minority (also cut from each
        other and, on docker, their published ports gone, from clients)."""
        isolation = self.cluster.node_isolation()
        assert isolation is not None, "checked when the nemesis was made"
        n = len(self.cluster.nodes)
        everyone = list(range(n))
        variant = rng.choice(["partition-leader", "partition-halves"])
        if variant == "partition-leader":
            leader = self._leader_or_any(rng, everyone)
            assert leader is not None
            isolated = [leader]
        else:
            isolated = sorted(rng.sample(everyone, n // 2))
        try:
            isolation.isolate_nodes(isolated)
        except Exception:
            isolation.reconnect_nodes(isolated)  # those already cut (the final heal retries too)
            raise
        return Fault(variant, isolated, lambda: isolation.reconnect_nodes(isolated),
                     {"isolated": [f"node-{i}" for i in isolated], "whole_node": True})

    def _begin_partition(self, rng: random.Random) -> Fault | None:
        n = len(self.cluster.nodes)
        if n < 2:
            return None
        if self.links is None:
            return self._whole_node_partition(rng)
        everyone = list(range(n))
        variant = rng.choice(["partition-leader", "partition-halves", "partition-ring"])
        if variant == "partition-leader":
            leader = self._leader_or_any(rng, everyone)
            assert leader is not None
            return self._links_fault(variant, [leader], self._cut([(leader, j) for j in everyone]),
                                     {"isolated": [f"node-{leader}"]})
        if variant == "partition-halves":
            shuffled = rng.sample(everyone, n)
            small, large = shuffled[: n // 2], shuffled[n // 2:]
            return self._links_fault(variant, everyone, self._cut([(a, b) for a in small for b in large]),
                                     {"halves": [[f"node-{i}" for i in sorted(small)], [f"node-{i}" for i in sorted(large)]]})
        order = rng.sample(everyone, n)
        if n == 3:  # a bridge: the middle node sees both ends, the ends do not see each other
            cut = [(order[0], order[2])]
        else:
            neighbours = {frozenset((order[k], order[(k + 1) % n])) for k in range(n)}
            cut = [(a, b) for a in everyone for b in everyone if a < b and frozenset((a, b)) not in neighbours]
        return self._links_fault(variant, everyone, self._cut(cut), {"ring": [f"node-{i}" for i in order]})

    def _direction(self, source: int, target: int) -> tuple[str, LinkFault]:
        """The link between two nodes and the fault dropping what ``source`` sends ``target``."""
        forward = source > target  # the greater dials: forward is dialler -> acceptor
        return raft_link(source, target), LinkFault(drop_forward=forward, drop_backward=not forward)

    def _begin_one_way(self, rng: random.Random) -> Fault | None:
        n = len(self.cluster.nodes)
        if n < 2:
            return None
        variant = rng.choice(["pair", "leader-deaf", "leader-mute"])
        everyone = list(range(n))
        if variant == "pair":
            source, target = rng.sample(everyone, 2)
            pairs = [(source, target)]
        else:
            leader = self._leader_or_any(rng, everyone)
            assert leader is not None
            others = [j for j in everyone if j != leader]
            pairs = [(j, leader) for j in others] if variant == "leader-deaf" else [(leader, j) for j in others]
        faults = dict(self._direction(s, t) for s, t in pairs)
        nodes = sorted({i for pair in pairs for i in pair})
        return self._links_fault("one-way", nodes, faults,
                                 {"variant": variant, "dropped": [f"node-{s}->node-{t}" for s, t in pairs]})

    def _begin_client_partition(self, rng: random.Random) -> Fault | None:
        n = len(self.cluster.nodes)
        everyone = list(range(n))
        variant = rng.choice(["leader", "random", "majority"])
        if variant == "leader":
            leader = self._leader_or_any(rng, everyone)
            targets = [leader] if leader is not None else []
        elif variant == "random":
            targets = [rng.choice(everyone)]
        else:
            targets = rng.sample(everyone, n // 2 + 1)
        faults = {client_link(i): LinkFault(drop_forward=True, drop_backward=True) for i in targets}
        return self._links_fault("client-partition", targets, faults, {"variant": variant})

    def _all_raft_links(self) -> list[str]:
        n = len(self.cluster.nodes)
        return [raft_link(a, b) for a in range(n) for b in range(a)]

    def _begin_delay(self, rng: random.Random) -> Fault | None:
        delay_s, jitter_s = rng.uniform(0.02, 0.2), rng.uniform(0.0, 0.05)
        links = self._all_raft_links()
        if rng.random() < 0.5:  # clients too
            links += [client_link(i) for i in range(len(self.cluster.nodes))]
        faults = dict.fromkeys(links, LinkFault(delay_s=delay_s, jitter_s=jitter_s))
        return self._links_fault("delay", list(range(len(self.cluster.nodes))), faults,
                                 {"delay_s": round(delay_s, 3), "jitter_s": round(jitter_s, 3)})

    def _begin_loss(self, rng: random.Random) -> Fault | None:
        loss = rng.uniform(0.05, 0.3)
        faults = dict.fromkeys(self._all_raft_links(), LinkFault(loss=loss))
        return self._links_fault("loss", list(range(len(self.cluster.nodes))), faults, {"loss": round(loss, 3)})

    def _begin_wipe(self, rng: random.Random) -> Fault | None:
        cluster = self.cluster
        if self.active or len(cluster.live_indices()) != len(cluster.nodes):
            return None  # only from a whole, healthy cluster
        leader = cluster.wait_for_leader(30.0)
        cluster.wait_for_applied(30.0)  # every entry committed so far is on every node
        target = rng.choice([i for i in range(len(cluster.nodes)) if i != leader])
        cluster.kill_node(target)
        cluster.wipe_node(target)
        cluster.start_node(target)

        def stop() -> None:
            cluster.wait_for_applied(WIPE_CATCH_UP_S)  # the fault lasts until it has caught up

        return Fault("wipe", [target], stop)

    def _begin_deposed_leader(self, rng: random.Random) -> Fault | None:
        cluster = self.cluster
        n = len(cluster.nodes)
        leader = cluster.leader()
        if n < 3 or leader is None:
            return None
        loss = rng.uniform(*DEPOSED_LEADER_LOSS)
        others = [i for i in range(n) if i != leader]
        faults = self._cut([(leader, j) for j in others])
        faults.update({raft_link(a, b): LinkFault(loss=loss) for a in others for b in others if a > b})
        links = self._links_fault("deposed-leader", [leader], faults,
                                  {"isolated": f"node-{leader}", "loss": round(loss, 3)})
        heal_links = links.stop

        def stop() -> None:
            try:
                self._compact_behind(leader, links.outcome)
            finally:
                heal_links()
            links.outcome["snapshot_installed"] = self._snapshot_received(leader, links.outcome)

        links.stop = stop
        return links

    def _compact_behind(self, old_leader: int, outcome: dict[str, Any]) -> None:
        """Once the others have a new leader, make each of them snapshot and compact its log."""
        cluster = self.cluster
        outcome["new_leader"] = poll_until(
            lambda: next((i for i in [cluster.leader()] if i not in (None, old_leader)), None),
            DEPOSED_LEADER_WAIT_S, "no new leader while the old one was cut off")
        others = [i for i in cluster.live_indices() if i != old_leader]
        before = {i: int(v["snapshot_count"]) for i, v in cluster.statuses(others).items()}
        outcome["old_leader_snapshots_before"] = int(cluster.status(old_leader).get("snapshots_received", 0))
        for i in before:
            with contextlib.suppress(OSError, ValueError):
                cluster.request_snapshot(i)

        def compacted() -> bool | None:
            now = cluster.statuses(list(before))
            return True if all(int(now.get(i, {}).get("snapshot_count", -1)) > before[i] for i in before) else None

        poll_until(compacted, DEPOSED_LEADER_WAIT_S, "the others did not snapshot")

    def _snapshot_received(self, old_leader: int, outcome: dict[str, Any]) -> bool:
        """Wait (bounded) for the old leader to install a snapshot from the new leader."""
        before = outcome.get("old_leader_snapshots_before")
        if before is None:
            return False

        def received() -> bool | None:
            with contextlib.suppress(OSError, ValueError):
                if int(self.cluster.status(old_leader).get("snapshots_received", 0)) > before:
                    return True
            return None

        try:
            return poll_until(received, DEPOSED_LEADER_WAIT_S, "no snapshot install")
        except TimeoutError:
            return False
