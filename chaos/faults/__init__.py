"""The fault makers: each starts one kind of fault on a cluster at once and returns a Fault
whose ``stop`` undoes it. They run in a thread (they block on processes and polls); the
nemesis (chaos/nemesis.py) decides when, which and for how long, and records them.

:class:`FaultMaker` (``maker``) is one object made of a part per job, each a mixin over the
state they share (``base``: the cluster, the Fault, the refusal):

* ``network``: partitions of every shape, one-way links, client partitions and drops, delay,
  loss and a deposed leader, as layered link faults (:func:`combine_link_faults`);
* ``processes``: kill, pause, wipe, and power failures (:func:`power_failure`);
* ``disks``: a node's disk stalled, its syncs hanging for a few seconds (:func:`disk_stall`);
* ``membership``: a voting member removed and re-added through the leader;
* ``releases``: nodes restarted into another release of rcq (:func:`release_switch`).

Must not import: any rcq module but rcq.local's polls (for their bounded waits); nor a target's
module (targets are seen through chaos.target).
"""

from chaos.faults.base import Fault, FaultRefused
from chaos.faults.disks import DiskStall, disk_stall
from chaos.faults.maker import FaultMaker
from chaos.faults.network import combine_link_faults
from chaos.faults.processes import PowerFailure, power_failure
from chaos.faults.releases import ReleaseSwitch, release_name, release_switch

__all__ = ["DiskStall", "Fault", "FaultMaker", "FaultRefused", "PowerFailure", "ReleaseSwitch", "combine_link_faults",
           "disk_stall", "power_failure", "release_name", "release_switch"]
