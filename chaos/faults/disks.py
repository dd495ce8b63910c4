"""Disk faults: a node's disk stalled, its syncs hanging for a few seconds (``disk-stall``).

A stalled disk needs a capability that only some targets have, found by name like the power
failure: :func:`disk_stall` returns the target's :class:`DiskStall` (the local target whose data
directories are powerfs mounts, chaos.powerfs) or None. While stalled, every fsync, fdatasync
and fsyncdir on the node's data directory hangs in its system call (a Raft journal's sync, an
LMDB commit); reads and writes go on. The stall ends by itself after a time drawn at its start
(``DISK_STALL_S``), or when the fault stops, whichever is first; the target's heal ends any.

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Protocol

from chaos.faults.base import Fault, FaultKinds

# How long a stall lasts at most, by itself. Under the 10 s a kill waits for a node to exit
# (rcq.local.nodes.STOP_TIMEOUT_S): a process killed while its sync hangs exits only once released.
DISK_STALL_S = (2.0, 6.0)
LEADER_PROBABILITY = 0.5  # the leader of p0's disk; else any node's (the leader's too, by chance)


class DiskStall(Protocol):
    """Stalled disks of whole nodes (chaos.cluster.ChaosCluster with ``power_fs``)."""

    def stall_disk(self, i: int) -> dict[str, Any]:
        """Stall node ``i``'s disk: its syncs hang until released; the mount's stall state."""
        ...

    def release_disk(self, i: int) -> dict[str, Any]:
        """End the stall of node ``i``'s disk (none: nothing); ``released``: the syncs that hung."""
        ...


def disk_stall(cluster: object) -> DiskStall | None:
    """The target's disk-stall control, or None when it has none (docker, or the local target
    without powerfs mounts)."""
    capability = getattr(cluster, "disk_stall", None)
    return capability() if callable(capability) else None


class DiskFaults(FaultKinds):
    """Stalled disks (``disks``: None when the target has no powerfs)."""

    disks: DiskStall | None

    def _begin_disk_stall(self, rng: random.Random) -> Fault | None:
        """Stall the disk of p0's leader (or of any node, half the time) for DISK_STALL_S; released
        by a timer, or by the fault's stop if that comes first."""
        cluster, disks = self.cluster, self.disks
        assert disks is not None, "checked when the nemesis was made"
        everyone = list(range(len(cluster.nodes)))
        if not everyone:
            return None
        leader = cluster.leader()
        if leader is not None and rng.random() < LEADER_PROBABILITY:
            variant, target = "disk-stall-leader", leader
        else:
            variant, target = "disk-stall-random", rng.choice(everyone)
        hold_s = rng.uniform(*DISK_STALL_S)
        disks.stall_disk(target)
        started = time.monotonic()
        outcome: dict[str, Any] = {}
        lock = threading.Lock()

        def release(by: str) -> None:
            with lock:
                if outcome:
                    return  # released already (by the timer, or by the stop)
                outcome.update(released_by=by, stalled_s=round(time.monotonic() - started, 2))
            try:
                answer = disks.release_disk(target)
                outcome["syncs_released"] = answer.get("released", 0)
            except Exception as exc:  # the target's heal releases it all the same
                outcome["release_error"] = repr(exc)

        timer = threading.Timer(hold_s, release, args=("timer",))
        timer.daemon = True
        timer.start()

        def stop() -> None:
            timer.cancel()
            release("stop")
            timer.join()  # a release under way in the timer's thread has finished

        return Fault(variant, [target], stop, {"disk": cluster.nodes[target].node_id, "hold_s": round(hold_s, 2),
                                               "leader": target == leader}, outcome=outcome)
