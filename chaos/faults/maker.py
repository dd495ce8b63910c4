"""FaultMaker: one object that starts faults of every kind, made of a part per job (network,
processes, disks, partitions, membership, releases; see chaos/faults/__init__.py).

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from chaos.faults.base import Fault
from chaos.faults.disks import DiskFaults, disk_stall
from chaos.faults.membership import MembershipFaults
from chaos.faults.network import NetworkFaults
from chaos.faults.partitions import PartitionFaults
from chaos.faults.processes import ProcessFaults, partition_processes, power_failure
from chaos.faults.releases import ReleaseFaults, release_switch
from chaos.membership import MembershipChanger
from chaos.target import ChaosTarget, membership_control


class FaultMaker(NetworkFaults, ProcessFaults, DiskFaults, PartitionFaults, MembershipFaults, ReleaseFaults):
    """Starts faults of every kind on ``cluster``; ``others_active`` says whether any fault runs now."""

    def __init__(self, cluster: ChaosTarget, others_active: Callable[[], bool]) -> None:
        self.cluster = cluster
        self.links = cluster.link_faults()
        self.power = power_failure(cluster)
        self.disks = disk_stall(cluster)
        self.partitions = partition_processes(cluster)
        self.releases = release_switch(cluster)
        control = membership_control(cluster)
        self.membership = None if control is None else MembershipChanger(cluster, control)
        self._others_active = others_active
        self._link_layers = {}
        self._next_layer = 0

    def begin(self, kind: str, rng: random.Random) -> Fault | None:
        """Start a fault of ``kind`` (a nemesis name) now; None when there is nothing to do it to."""
        maker: Callable[[random.Random], Fault | None] = getattr(self, "_begin_" + kind.replace("-", "_"))
        return maker(rng)
