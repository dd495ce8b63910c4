"""Process faults: nodes killed, paused, wiped, or losing power.

A power failure needs a capability that only some targets have, so it is found by name, not in
the ChaosTarget protocol: :func:`power_failure` returns the target's :class:`PowerFailure`
(the local target whose data directories are powerfs mounts) or None.

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from chaos.faults.base import Fault, FaultKinds

PAUSE_S = (2.0, 5.0)  # above raft_timeout_max_s (1.6 s): the others elect a new leader meanwhile
WIPE_CATCH_UP_S = 60.0
RESTART_WAIT_S = 40.0  # a supervisor's back-off reaches 30 s after repeated quick deaths


class PowerFailure(Protocol):
    """Power failures of whole nodes (chaos.cluster.ChaosCluster with ``power_fs``)."""

    def lose_power(self, indices: Sequence[int]) -> dict[int, dict[str, Any]]:
        """kill -9 each node (and what it forked), then drop everything its disk had not made
        durable; per node, what its disk dropped. The nodes stay down until started."""
        ...


class PartitionProcesses(Protocol):
    """A node's partition processes (docs/partitions.md), for the ``kill-partition-process`` kind."""

    def partition_processes(self, i: int) -> dict[str, int]:
        """Node ``i``'s partition processes now: partition name -> pid."""
        ...

    def kill_partition_process(self, i: int, partition: str) -> int | None:
        """SIGKILL node ``i``'s process of ``partition``; its pid, None if it had none."""
        ...

    def pause_partition_process(self, i: int, partition: str) -> int | None:
        """SIGSTOP node ``i``'s process of ``partition``; its pid, None if it had none."""
        ...

    def resume_process(self, pid: int) -> None:
        """SIGCONT a paused partition process (gone meanwhile: nothing)."""
        ...

    def admin_request(self, i: int, path: str, method: str = "GET", body: dict[str, Any] | None = None,
                      timeout_s: float = ...) -> dict[str, Any]:
        """Node ``i``'s JSON answer to ``method path`` with the admin token (chaos.target.MembershipControl)."""
        ...


def partition_processes(cluster: object) -> PartitionProcesses | None:
    """The target's partition processes, or None when it runs p0 alone (or cannot reach them)."""
    capability = getattr(cluster, "partition_process_control", None)
    return capability() if callable(capability) else None


def power_failure(cluster: object) -> PowerFailure | None:
    """The target's power-failure control, or None when it has none (docker, or the local
    target without powerfs mounts)."""
    capability = getattr(cluster, "power_failure", None)
    return capability() if callable(capability) else None


class ProcessFaults(FaultKinds):
    """Kills, pauses, wipes and power failures (``power``: None when the target has no powerfs)."""

    power: PowerFailure | None
    partitions: PartitionProcesses | None

    def _restarter(self, targets: list[int]) -> Callable[[], None]:
        """A fault's stop that starts each of ``targets`` not running, then waits for their HTTP."""
        cluster = self.cluster

        def stop() -> None:
            for i in targets:
                if not cluster.nodes[i].running():
                    cluster.start_node(i, wait=False)
            cluster.wait_for_http(targets)

        return stop

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
        return Fault(variant, targets, self._restarter(targets))

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
        names = [cluster.nodes[i].node_id for i in targets]
        return Fault(variant, targets, self._restarter(targets),
                     {"lost_power": names, "dropped": {cluster.nodes[i].node_id: dropped.get(i, {}) for i in targets}})

    def _begin_kill_partition_process(self, rng: random.Random) -> Fault | None:
        """kill -9 one partition process of a live node, its node left running (its supervisor
        restarts it after a back-off); the fault lasts until it has (or RESTART_WAIT_S passed)."""
        cluster, control = self.cluster, self.partitions
        assert control is not None, "checked when the nemesis was made"
        hosts = [(i, name) for i in cluster.live_indices() if not cluster.nodes[i].paused
                 for name in sorted(control.partition_processes(i))]
        if not hosts:
            return None
        i, partition = rng.choice(hosts)
        killed = control.kill_partition_process(i, partition)
        if killed is None:
            return None
        outcome: dict[str, Any] = {}

        def stop() -> None:
            deadline = time.monotonic() + RESTART_WAIT_S
            while time.monotonic() < deadline:
                pid = control.partition_processes(i).get(partition) if cluster.nodes[i].running() else None
                if pid is not None and pid != killed:
                    outcome.update(restarted=True, pid=pid)
                    return
                if not cluster.nodes[i].running():  # its node went down meanwhile: it starts them again
                    outcome.update(restarted=None)
                    return
                time.sleep(0.1)
            outcome.update(restarted=False)

        return Fault("kill-partition-process", [i], stop, {"partition": partition, "pid": killed}, outcome=outcome)

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
