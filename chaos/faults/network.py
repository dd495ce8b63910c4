"""Network faults: partitions of every shape, one-way links, client partitions and drops, delay,
loss, and a deposed leader, each as link faults on the target's proxy (or, on a target without
per-link faults, whole nodes isolated).

Link faults are layered: faults active at once may touch the same link (a partition and a
delay); each keeps its own layer and the link gets their combination
(:func:`combine_link_faults`), so stopping one never undoes another.

On a target that proxies its partitions' own Raft links (chaos.target.PartitionLinks), a fault
between two nodes hits those links too: a partition, a one-way drop, delay and loss cut or slow
every Raft group between them, as a real network would (the deposed leader's node loses its
partitions' links with p0's; its checks of compaction and snapshot install are p0's).

Must not import: any rcq module but rcq.local's polls (for their bounded waits); nor a target's
module (targets are seen through chaos.target).
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

from chaos.faults.base import Fault, FaultKinds
from chaos.netproxy import HEALTHY, LinkFault
from chaos.target import PARTITION_LINK_PREFIX, LinkFaults, client_link, partition_links, raft_link
from rcq.local.waits import wait_until

DEPOSED_LEADER_LOSS = (0.03, 0.15)
DEPOSED_LEADER_WAIT_S = 15.0  # for the new leader, the compactions and the snapshot install, each


def combine_link_faults(faults: Any) -> LinkFault:
    """What a link does under several faults at once: drops if any drops, the worst delay and loss."""
    faults = list(faults)
    if not faults:
        return HEALTHY
    return LinkFault(drop_forward=any(f.drop_forward for f in faults),
                     drop_backward=any(f.drop_backward for f in faults),
                     delay_s=max(f.delay_s for f in faults), jitter_s=max(f.jitter_s for f in faults),
                     loss=max(f.loss for f in faults))


class NetworkFaults(FaultKinds):
    """Link faults, layered (``links``: the target's proxy, None when it has no per-link faults)."""

    links: LinkFaults | None
    _link_layers: dict[str, dict[int, LinkFault]]
    _next_layer: int

    def forget_link_layers(self) -> None:
        """After a target's heal, which resets every link: no layer is left."""
        self._link_layers.clear()

    def _cut(self, pairs: list[tuple[int, int]]) -> dict[str, LinkFault]:
        """Every Raft link between each pair cut both ways: p0's and its partitions' own."""
        cut = LinkFault(drop_forward=True, drop_backward=True)
        return {name: cut for a, b in pairs if a != b for name in [raft_link(a, b), *self._partition_links(a, b)]}

    def _partition_links(self, a: int, b: int) -> list[str]:
        """The partitions' own Raft links between nodes ``a`` and ``b`` (none on a target that
        does not proxy them)."""
        links = partition_links(self.cluster)
        return [] if links is None else [name for name, _ in links.partition_raft_links(a, b)]

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

        # p0's links by name; the partitions' (one per partition number and pair) counted
        partition_names = [name for name in names if name.startswith(PARTITION_LINK_PREFIX)]
        named = [name for name in names if not name.startswith(PARTITION_LINK_PREFIX)]
        return Fault(f, nodes, stop, {**details, "links": named,
                                      **({"partition_links": len(partition_names)} if partition_names else {})})

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

    def _direction(self, source: int, target: int) -> dict[str, LinkFault]:
        """The Raft links between two nodes (p0's and their partitions') and the faults dropping
        what ``source`` sends ``target`` on each."""
        forward = source > target  # the greater dials: forward is dialler -> acceptor
        faults = {raft_link(source, target): LinkFault(drop_forward=forward, drop_backward=not forward)}
        links = partition_links(self.cluster)
        for name, dialler in [] if links is None else links.partition_raft_links(source, target):
            faults[name] = LinkFault(drop_forward=dialler == source, drop_backward=dialler != source)
        return faults

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
        faults = {name: fault for s, t in pairs for name, fault in self._direction(s, t).items()}
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
        return [name for a in range(n) for b in range(a) for name in [raft_link(a, b), *self._partition_links(a, b)]]

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
        outcome["new_leader"] = wait_until(
            lambda: [i for i in [cluster.leader()] if i not in (None, old_leader)],
            DEPOSED_LEADER_WAIT_S, what="a new leader while the old one is cut off")[0]
        others = [i for i in cluster.live_indices() if i != old_leader]
        before = {i: int(v["snapshot_count"]) for i, v in cluster.statuses(others).items()}
        outcome["old_leader_snapshots_before"] = int(cluster.status(old_leader).get("snapshots_received", 0))
        for i in before:
            with contextlib.suppress(OSError, ValueError):
                cluster.request_snapshot(i)

        def compacted() -> bool | None:
            now = cluster.statuses(list(before))
            return True if all(int(now.get(i, {}).get("snapshot_count", -1)) > before[i] for i in before) else None

        wait_until(compacted, DEPOSED_LEADER_WAIT_S, what="the others to snapshot")

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
            return wait_until(received, DEPOSED_LEADER_WAIT_S, what="a snapshot install")
        except TimeoutError:
            return False
