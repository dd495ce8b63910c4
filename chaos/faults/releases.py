"""Release faults (``upgrade``): nodes restarted into another release of rcq and back.

It needs one more capability (:func:`release_switch`): the local target given the previous
release (chaos.cluster). One node at a time is restarted, gracefully or after a kill -9, into the
previous release when it runs the code under test and back when it runs the previous release,
and only while the others running are a majority. Nothing undoes it: the node stays on its new
version until the next such fault picks it (a node killed meanwhile restarts into the release it
runs), so a run ends with a mixed cluster as often as not. The cluster must stay at feature level
1 throughout (every new node holds the level: ``feature_level_auto`` false, set by the runner),
as an old node may return at any time; the fault's stop records every node's version and level,
and fails (its stop line's ``error``) when a level above 1 is seen.

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import random
from typing import Any, Protocol, cast

from chaos.faults.base import Fault, FaultKinds


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


class ReleaseFaults(FaultKinds):
    """Restarts into the other release (``releases``: None when the target has no other release)."""

    releases: ReleaseSwitch | None

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
