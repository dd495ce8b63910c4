"""Faults active at once on the same link combine; stopping one leaves the others in force.

Found in a soak (seed 1121): a delay started during a leader partition replaced the partition on
the leader's links, so the "isolated" leader kept serving, and stopping the delay healed them.
"""

from __future__ import annotations

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
