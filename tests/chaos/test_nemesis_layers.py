"""Faults active at once on the same link combine; stopping one leaves the others in force.

Found in a soak (seed 1121): a delay started during a leader partition replaced the partition on
the leader's links, so the "isolated" leader kept serving, and stopping the delay healed them.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from chaos.faults import combine_link_faults
from chaos.nemesis import Nemesis
from chaos.netproxy import HEALTHY, LinkFault


class RecordingProxy:
    def __init__(self) -> None:
        self.links: dict[str, LinkFault] = {}

    def set_faults(self, faults: dict[str, LinkFault]) -> None:
        self.links.update(faults)


def make_nemesis(proxy: RecordingProxy) -> Nemesis:
    cluster: Any = SimpleNamespace(nodes=[0, 1, 2], target="local", link_faults=lambda: proxy,
                                   node_isolation=lambda: None)
    return Nemesis(cluster, history=None, seed=1, kinds=["partition", "delay"])


def test_a_delay_started_during_a_partition_does_not_heal_it() -> None:
    proxy = RecordingProxy()
    nemesis = make_nemesis(proxy)
    faults = nemesis.faults
    partition = faults._links_fault("partition-leader", [0], {"raft:a": LinkFault(drop_forward=True, drop_backward=True)}, {})
    delay = faults._links_fault("delay", [0, 1, 2], {"raft:a": LinkFault(delay_s=0.1), "raft:b": LinkFault(delay_s=0.1)}, {})
    assert proxy.links["raft:a"].partitioned and proxy.links["raft:a"].delay_s == 0.1
    delay.stop()
    assert proxy.links["raft:a"] == LinkFault(drop_forward=True, drop_backward=True)
    assert proxy.links["raft:b"] == HEALTHY
    partition.stop()
    assert proxy.links["raft:a"] == HEALTHY


def test_combining_takes_any_drop_and_the_worst_delay_and_loss() -> None:
    combined = combine_link_faults([LinkFault(drop_forward=True, loss=0.1), LinkFault(delay_s=0.2, jitter_s=0.01),
                                    LinkFault(drop_backward=True, loss=0.3)])
    assert combined == LinkFault(drop_forward=True, drop_backward=True, delay_s=0.2, jitter_s=0.01, loss=0.3)
    assert combine_link_faults([]) == HEALTHY


class ResettingProxy(RecordingProxy):
    def __init__(self) -> None:
        super().__init__()
        self.resets: list[str] = []

    def reset(self, name: str) -> None:
        self.resets.append(name)


def client_drop(seed: int) -> tuple[ResettingProxy, Any]:
    proxy = ResettingProxy()
    cluster: Any = SimpleNamespace(nodes=[0, 1, 2], target="local", link_faults=lambda: proxy,
                                   node_isolation=lambda: None, leader=lambda: 1)
    nemesis = Nemesis(cluster, history=None, seed=seed, kinds=["client-drop"])
    return proxy, nemesis.faults.begin("client-drop", random.Random(seed))


def test_client_drop_cuts_the_leaders_client_connections_when_it_starts_and_again_when_it_stops() -> None:
    for seed in range(20):
        proxy, fault = client_drop(seed)
        if fault.details["variant"] == "drop":
            break
    else:
        raise AssertionError("no seed drew the drop variant")
    assert fault.nodes == [1] and proxy.resets == ["client->node-1"] and proxy.links == {}
    fault.stop()
    assert proxy.resets == ["client->node-1", "client->node-1"]


def test_client_drop_stalls_the_leaders_client_link_then_heals_and_cuts_it() -> None:
    for seed in range(20):
        proxy, fault = client_drop(seed)
        if fault.details["variant"] == "stall":
            break
    else:
        raise AssertionError("no seed drew the stall variant")
    stalled = proxy.links["client->node-1"]
    assert 0.3 <= stalled.delay_s <= 1.5 and not stalled.partitioned and proxy.resets == []
    fault.stop()
    assert proxy.links["client->node-1"] == HEALTHY and proxy.resets == ["client->node-1"]
