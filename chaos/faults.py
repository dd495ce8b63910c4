"""The fault makers: each starts one kind of fault on a cluster at once and returns a Fault
whose ``stop`` undoes it. They run in a thread (they block on processes and polls); the
nemesis (chaos/nemesis.py) decides when, which and for how long, and records them.

Link faults are layered: faults active at once may touch the same link (a partition and a
delay); each keeps its own layer and the link gets their combination, so stopping one never
undoes another.

A power failure needs a capability that only some targets have, so it is found by name, not in
the ChaosTarget protocol: :func:`power_failure` returns the target's :class:`PowerFailure`
(the local target whose data directories are powerfs mounts) or None.

Membership changes (``membership``) need another such capability
(chaos.target.membership_control): a voting member is removed through the leader (sometimes the
leader itself, which hands leadership over first) and re-added as itself when the fault stops,
with its data kept (it rejoins with a stale log) or as a replacement with an empty disk (killed,
wiped, restarted: it catches up from a snapshot). The HTTP side is chaos.membership. A removal the
cluster refuses (``would_lose_quorum``, no leader within the deadline...) is
:class:`FaultRefused`: the nemesis records it as an outcome, with no fault window. Such a fault
stops after every other (``stop_last``): the node is re-added once the others have healed.

Restarting nodes into another release of rcq (``upgrade``) is one more
(:func:`release_switch`): the local target given the previous release (chaos.cluster). One node at
a time is restarted, gracefully or after a kill -9, into the previous release when it runs the
code under test and back when it runs the previous release, and only while the others running are
a majority. Nothing undoes it: the node stays on its new version until the next such fault picks
it (a node killed meanwhile restarts into the release it runs), so a run ends with a mixed cluster
as often as not. The cluster must stay at feature level 1 throughout (every new node holds the
level: ``feature_level_auto`` false, set by the runner), as an old node may return at any time;
the fault's stop records every node's version and level, and fails (its stop line's ``error``)
when a level above 1 is seen.

Must not import: any rcq module but rcq.testing's cluster harness (for its bounded polls); nor a
target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from chaos.membership import READD_TIMEOUT_S, REMOVE_TIMEOUT_S, MembershipChanger
from chaos.netproxy import HEALTHY, LinkFault
from chaos.target import ChaosTarget, LinkFaults, client_link, membership_control, raft_link
from rcq.local.polls import poll_until

PAUSE_S = (2.0, 5.0)  # above raft_timeout_max_s (1.6 s): the others elect a new leader meanwhile
WIPE_CATCH_UP_S = 60.0
DEPOSED_LEADER_LOSS = (0.03, 0.15)
DEPOSED_LEADER_WAIT_S = 15.0  # for the new leader, the compactions and the snapshot install, each


class PowerFailure(Protocol):
    """Power failures of whole nodes (chaos.cluster.ChaosCluster with ``power_fs``)."""

    def lose_power(self, indices: Sequence[int]) -> dict[int, dict[str, Any]]:
        """kill -9 each node (and what it forked), then drop everything its disk had not made
        durable; per node, what its disk dropped. The nodes stay down until started."""
        ...


def power_failure(cluster: object) -> PowerFailure | None:
    """The target's power-failure control, or None when it has none (docker, or the local
    target without powerfs mounts)."""
    capability = getattr(cluster, "power_failure", None)
    return capability() if callable(capability) else None


class ReleaseSwitch(Protocol):
    """Nodes restarted into another release of rcq (chaos.cluster.ChaosCluster given one)."""

    previous_release: Any  # an rcq.local.releases.Release

    def restart_node_as(self, i: int, release: Any, wait: bool = True, timeout_s: float | None = None) -> int:
        """Stop node ``i`` (if it runs) and start it on its data as ``release`` (None: the code
        under test); waits for its HTTP unless ``wait`` is false."""
        ...

    def stop_node(self, i: int) -> int | None:
        """SIGTERM node ``i``, SIGKILL it if it does not exit by itself in time; its exit code."""
        ...


def release_switch(cluster: object) -> ReleaseSwitch | None:
    """The target as a :class:`ReleaseSwitch`, or None when it has no other release to run."""
    if getattr(cluster, "previous_release", None) is None or not callable(getattr(cluster, "restart_node_as", None)):
        return None
    return cast(ReleaseSwitch, cluster)


def release_name(release: Any) -> str:
    """What a node runs, for the history: the release's name, or ``current`` (the code under test)."""
    return "current" if release is None else str(release.name)


def combine_link_faults(faults: Any) -> LinkFault:
    """What a link does under several faults at once: drops if any drops, the worst delay and loss."""
    faults = list(faults)
    if not faults:
        return HEALTHY
    return LinkFault(drop_forward=any(f.drop_forward for f in faults),
                     drop_backward=any(f.drop_backward for f in faults),
                     delay_s=max(f.delay_s for f in faults), jitter_s=max(f.jitter_s for f in faults),
                     loss=max(f.loss for f in faults))

@dataclasses.dataclass
class Fault:
    f: str
    nodes: list[int]
    stop: Callable[[], None]
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    outcome: dict[str, Any] = dataclasses.field(default_factory=dict)  # what stop() saw, for its history line
    stop_last: bool = False  # stopped after every other active fault (a re-add waits for the others' heal)


class FaultRefused(Exception):
    """The cluster would not take the fault (a membership change it refused, or no leader to ask):
    an outcome for the history (``f``, ``nodes``, ``details``), not a failure; nothing to stop."""

    def __init__(self, f: str, nodes: list[int], details: dict[str, Any]) -> None:
        super().__init__(f"{f} refused: {details.get('reason')}")
        self.f = f
        self.nodes = nodes
        self.details = details


class FaultMaker:
    """Starts faults of every kind on ``cluster``; ``others_active`` says whether any fault runs now."""

    def __init__(self, cluster: ChaosTarget, others_active: Callable[[], bool]) -> None:
        self.cluster = cluster
        self.links: LinkFaults | None = cluster.link_faults()
        self.power: PowerFailure | None = power_failure(cluster)
        self.releases: ReleaseSwitch | None = release_switch(cluster)
        control = membership_control(cluster)
        self.membership: MembershipChanger | None = None if control is None else MembershipChanger(cluster, control)
        self._others_active = others_active
        self._link_layers: dict[str, dict[int, LinkFault]] = {}
        self._next_layer = 0

    def begin(self, kind: str, rng: random.Random) -> Fault | None:
        """Start a fault of ``kind`` (a nemesis name) now; None when there is nothing to do it to."""
        maker: Callable[[random.Random], Fault | None] = getattr(self, "_begin_" + kind.replace("-", "_"))
        return maker(rng)

    def forget_link_layers(self) -> None:
        """After a target's heal, which resets every link: no layer is left."""
        self._link_layers.clear()

    def _leader_or_any(self, rng: random.Random, among: list[int]) -> int | None:
        leader = self.cluster.leader()
        if leader is not None and leader in among:
            return leader
        return rng.choice(among) if among else None

    def _begin_membership(self, rng: random.Random) -> Fault | None:
        """Remove the leader or a follower (a voting member) through the leader; the fault's stop
        re-adds it, data kept or wiped (drawn now)."""
        changer = self.membership
        assert changer is not None, "checked when the nemesis was made"
        cluster = self.cluster
        n = len(cluster.nodes)
        if n < 2:
            return None
        variant = rng.choice(["membership-leader", "membership-follower"])
        data = rng.choice(["kept", "wiped"])
        pick = rng.random()
        started = changer.clock()
        deadline = started + REMOVE_TIMEOUT_S
        view = changer.leader_view(deadline)
        if view is None:
            raise FaultRefused(variant, [], {"reason": "no_leader", "result": "refused", "readd": data,
                                             "detail": f"no serving leader within {REMOVE_TIMEOUT_S} s"})
        missing = [i for i in range(n) if changer.node_id(i) not in view["members"]]
        if missing:  # one node out at a time: an earlier re-add did not happen (the final heal re-adds it)
            raise FaultRefused(variant, missing, {"reason": "not_all_members", "result": "refused", "readd": data,
                                                  "leader": view["leader_id"], "members": view["members"]})
        leader = int(view["leader"])
        followers = [i for i in range(n) if i != leader]
        target = leader if variant == "membership-leader" else followers[int(pick * len(followers))]
        removal = changer.remove(target, deadline)
        details = {"node": changer.node_id(target), "leader": view["leader_id"], "was_leader": target == leader,
                   "readd": data, "remove": removal}
        if not removal["removed"]:
            raise FaultRefused(variant, [target], {**details, "result": removal["result"],
                                                   "reason": removal.get("reason", removal["result"])})
        removed_at = changer.clock()

        def stop() -> None:
            begun = changer.clock()
            outcome = fault.outcome
            outcome["readd"] = data
            if data == "wiped":  # a replacement with an empty disk: it catches up from a snapshot
                cluster.kill_node(target)
                cluster.wipe_node(target)
                cluster.start_node(target, wait=True, timeout_s=READD_TIMEOUT_S / 2)
            elif not cluster.nodes[target].running():  # killed meanwhile, and its restart failed
                cluster.start_node(target, wait=True, timeout_s=READD_TIMEOUT_S / 2)
                outcome["restarted"] = True
            added = changer.readd(target, begun + READD_TIMEOUT_S)
            outcome["added"] = added["added"]
            outcome["catch_up_s"] = added.get("catch_up_s")
            if added["added"]:  # from its removal to the answer that made it a member again
                outcome["out_of_cluster_s"] = round(begun - removed_at + float(added["elapsed_s"]), 3)
            outcome["add"] = added
            if not added["added"]:
                raise RuntimeError(f"{changer.node_id(target)} not re-added: {added['result']} "
                                   f"({added.get('reason') or added['answers']})")

        fault = Fault(variant, [target], stop, details, stop_last=True)
        return fault

    def readd_missing(self) -> list[dict[str, Any]]:
        """Every node the leader does not count as a voting member re-added (the final heal)."""
        return [] if self.membership is None else self.membership.readd_missing()

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

    def _begin_power(self, rng: random.Random) -> Fault | None:
        cluster = self.cluster
        power = self.power
        assert power is not None, "checked when the nemesis was made"
        n = len(cluster.nodes)
        everyone = list(range(n))
        leader = cluster.leader()
        # Any node may lose power, a stopped one too: its disk still holds what it had not synced.
        variant = rng.choice(["power-follower", "power-minority", "power-leader", "power-all"])
        if variant == "power-leader":
            target = self._leader_or_any(rng, everyone)
            targets = [target] if target is not None else []
        elif variant == "power-follower":
            followers = [i for i in everyone if i != leader]
            targets = [rng.choice(followers)] if followers else []
        elif variant == "power-minority":
            targets = sorted(rng.sample(everyone, max(1, (n - 1) // 2)))
        else:
            targets = everyone
        if not targets:
            return None
        dropped = power.lose_power(targets)

        def stop() -> None:
            for i in targets:
                if not cluster.nodes[i].running():
                    cluster.start_node(i, wait=False)
            cluster.wait_for_http(targets)

        names = [cluster.nodes[i].node_id for i in targets]
        return Fault(variant, targets, stop,
                     {"lost_power": names, "dropped": {cluster.nodes[i].node_id: dropped.get(i, {}) for i in targets}})

    def _begin_upgrade(self, rng: random.Random) -> Fault | None:
        """One node restarted into the other version (the previous release, or back to the code
        under test), the leader or a follower, gracefully (SIGTERM) or after a kill -9; only while
        the other running nodes are a majority. At most a minority runs the previous release: past
        it, a node of that release goes back instead, so the code under test keeps a majority (and
        usually the lead) and the run mostly judges it, not the old release's own faults. The
        fault's stop checks the feature level."""
        switch = self.releases
        assert switch is not None, "checked when the nemesis was made"
        cluster = self.cluster
        n = len(cluster.nodes)
        live = cluster.live_indices()
        if len(live) - 1 < n // 2 + 1:
            return None  # restarting one of them would leave no majority running
        leader = cluster.leader()
        variant = rng.choice(["leader", "follower"])
        followers = [i for i in live if i != leader]
        if variant == "leader" and leader is not None and leader in live:
            target = leader
        elif followers:
            variant, target = "follower", rng.choice(followers)
        else:
            return None
        on_previous = [i for i in range(n) if getattr(cluster.nodes[i], "release", None) is not None]
        if target not in on_previous and len(on_previous) + 1 > (n - 1) // 2:
            running_previous = [i for i in on_previous if i in live]
            if not running_previous:
                return None  # none to bring back now (down, or a cluster too small for a minority)
            target = rng.choice(running_previous)  # back to the code under test instead
            variant = "leader" if target == leader else "follower"
        how = rng.choice(["graceful", "crash"])
        was = getattr(cluster.nodes[target], "release", None)
        to = switch.previous_release if was is None else None
        stopped: dict[str, Any] = {}
        if how == "crash":
            cluster.kill_node(target)
        else:  # SIGTERM: the node must exit by itself (0), a leader after handing over (the checker looks)
            stopped["stop_exit"] = switch.stop_node(target)
        switch.restart_node_as(target, to, wait=True)
        details = {"node": cluster.nodes[target].node_id, "variant": variant, "how": how,
                   "from": release_name(was), "to": release_name(to), **stopped}

        def stop() -> None:
            fault.outcome["versions"] = self.versions()
            levels = {cluster.nodes[i].node_id: view.get("feature_level") for i, view in cluster.statuses().items()}
            fault.outcome["feature_levels"] = levels
            raised = {node: level for node, level in levels.items() if level not in (None, 1)}
            if raised:  # an old node returning would meet a level it cannot read
                raise RuntimeError(f"the feature level rose above 1 while nodes may return to the previous "
                                   f"release: {raised}")

        fault = Fault("upgrade" if to is None else "downgrade", [target], stop, details)
        return fault

    def versions(self) -> dict[str, str]:
        """What each node runs now: ``current`` or the previous release's name."""
        return {node.node_id: release_name(getattr(node, "release", None)) for node in self.cluster.nodes}

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

    def _begin_client_drop(self, rng: random.Random) -> Fault | None:
        """Clients' connections to the leader (session channels and HTTP alike) broken mid-request:
        ``drop`` cuts them now and again when the fault ends; ``stall`` holds every byte of them
        back for up to 1.5 s (answers arrive late, requests in flight go overdue), then cuts them."""
        proxy = self.links
        assert proxy is not None, "link faults need a target with link_faults()"
        leader = self._leader_or_any(rng, list(range(len(self.cluster.nodes))))
        if leader is None:
            return None
        link = client_link(leader)
        variant = rng.choice(["drop", "stall"])
        if variant == "drop":
            proxy.reset(link)

            def cut_again() -> None:
                proxy.reset(link)

            return Fault("client-drop", [leader], cut_again, {"variant": variant, "links": [link]})
        delay_s = round(rng.uniform(0.3, 1.5), 3)
        stalled = self._links_fault("client-drop", [leader], {link: LinkFault(delay_s=delay_s)},
                                    {"variant": variant, "delay_s": delay_s})

        def unstall_and_cut() -> None:
            stalled.stop()
            proxy.reset(link)

        return Fault("client-drop", [leader], unstall_and_cut, stalled.details)

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
        if self._others_active() or len(cluster.live_indices()) != len(cluster.nodes):
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
