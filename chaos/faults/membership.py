"""Membership faults (``membership``): a voting member removed through the leader and re-added
when the fault stops.

It needs a capability of the target (chaos.target.membership_control): a voting member is
removed through the leader (sometimes the leader itself, which hands leadership over first) and
re-added as itself when the fault stops, with its data kept (it rejoins with a stale log) or as a
replacement with an empty disk (killed, wiped, restarted: it catches up from a snapshot). The
HTTP side is chaos.membership. A removal the cluster refuses (``would_lose_quorum``, no leader
within the deadline...) is :class:`chaos.faults.base.FaultRefused`: the nemesis records it as an
outcome, with no fault window. Such a fault stops after every other (``stop_last``): the node is
re-added once the others have healed.

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import random
from typing import Any

from chaos.faults.base import Fault, FaultKinds, FaultRefused
from chaos.membership import READD_TIMEOUT_S, REMOVE_TIMEOUT_S, MembershipChanger


class MembershipFaults(FaultKinds):
    """Removals and re-adds (``membership``: None when the target cannot change its members)."""

    membership: MembershipChanger | None

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
