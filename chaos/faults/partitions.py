"""Faults of partitions other than the kill of one process (chaos.faults.processes): a partition's
process frozen, leaders piled on one node and spread again by the balancer, and partitions created
and deleted while the other faults run (docs/partitions.md).

* ``pause-partition-process``: SIGSTOP one partition's process, its leader's more often than a
  follower's (``pause-partition-leader``, ``pause-partition-follower``), its node left running;
  SIGCONT when the fault stops. The other partitions, and p0, must go on meanwhile.
* ``move-leaders``: up to two partitions' leaders moved by hand to one node (``POST
  /v1/cluster/partitions/{name}/leadership``); when the fault stops, ``POST /v1/cluster/rebalance``
  spreads them again (the balancer's own loop may move them first: its hold is short in a chaos
  run). Its lines say what moved (``moved``) and what the rebalance did (``moves``).
* ``partition-lifecycle``: a partition created (``t<k>``), a queue placed in it, a few items
  committed one request each (``acked``; ``unknown`` for answers that did not say); when the fault
  stops the queue is deleted, which answers how many items it removed (``removed``), then the
  partition. The partitions checker holds every acknowledged item to have been there. A refusal
  (no leader, no ports left) is a ``refused`` line.

* ``isolate-partition-member``: one partition's own Raft links around one of its members cut both
  ways (``isolate-partition-leader`` mostly, ``isolate-partition-follower``), on a target that
  proxies them (the local one): p0 and the other partitions keep every link, so that group alone
  elects a new leader or waits; healed when the fault stops.

Each asks the cluster through :meth:`PartitionProcesses.admin_request` of p0's leader (or any node,
which forwards) and never raises for an answer it does not like: it records it.

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from chaos.faults.base import Fault, FaultKinds, FaultRefused
from chaos.faults.processes import PartitionProcesses
from chaos.netproxy import LinkFault
from chaos.target import partition_links

LEADER_PAUSE_SHARE = 0.7  # how often the paused process is a partition's leader's
MOVED_MAX = 2
LIFECYCLE_ITEMS = 5
LED_WAIT_S = 30.0  # a created partition elects its first leader (about a second here, more under faults)
REQUEST_TIMEOUT_S = 20.0


class PartitionFaults(FaultKinds):
    partitions: PartitionProcesses | None
    _lifecycles: int = 0

    if TYPE_CHECKING:  # chaos.faults.network.NetworkFaults's, beside this in FaultMaker
        def _links_fault(self, f: str, nodes: list[int], faults: dict[str, LinkFault],
                         details: dict[str, Any]) -> Fault: ...

    def _control(self) -> PartitionProcesses:
        assert self.partitions is not None, "checked when the nemesis was made"
        return self.partitions

    def _ask(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``method path`` at the leader (or any live node): its answer, or ``{"error": ...}``."""
        live = self.cluster.live_indices()
        leader = self.cluster.leader()
        i = leader if leader is not None and leader in live else (live[0] if live else None)
        if i is None:
            return {"error": {"code": "no_node", "message": "no live node to ask"}}
        try:
            return self._control().admin_request(i, path, method, body, REQUEST_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            return {"error": {"code": "no_answer", "message": repr(exc)}}

    def _listing(self) -> list[dict[str, Any]]:
        rows = self._ask("/v1/cluster/partitions").get("partitions")
        return [r for r in rows or [] if isinstance(r, dict) and r.get("name") != "p0"]

    def _index(self, node_id: str | None) -> int | None:
        return next((i for i, n in enumerate(self.cluster.nodes) if n.node_id == node_id), None)

    # ------------------------------------------------------------------ pause
    def _begin_pause_partition_process(self, rng: random.Random) -> Fault | None:
        control = self._control()
        live = [i for i in self.cluster.live_indices() if not self.cluster.nodes[i].paused]
        hosts = [(i, name) for i in live for name in sorted(control.partition_processes(i))]
        if not hosts:
            return None
        leaders = {(self._index(r.get("leader_id")), r["name"]) for r in self._listing()}
        led = [h for h in hosts if h in leaders]
        variant = "pause-partition-leader" if led and rng.random() < LEADER_PAUSE_SHARE else "pause-partition-follower"
        choices = led if variant == "pause-partition-leader" else [h for h in hosts if h not in leaders] or hosts
        i, partition = rng.choice(choices)
        pid = control.pause_partition_process(i, partition)
        if pid is None:
            return None

        def stop() -> None:
            control.resume_process(pid)

        return Fault(variant, [i], stop, {"partition": partition, "pid": pid})

    # ------------------------------------------------------------------ links
    def _begin_isolate_partition_member(self, rng: random.Random) -> Fault | None:
        """One partition's own Raft links around one of its members cut both ways (its leader's,
        mostly), p0's and the other partitions' left whole: that group alone must elect, or wait."""
        links = partition_links(self.cluster)
        if links is None or getattr(self, "links", None) is None:
            return None
        rows = [r for r in self._listing() if r.get("number") and len(r.get("members", [])) > 1]
        if not rows:
            return None
        row = rng.choice(rows)
        members = [i for i in (self._index(m) for m in row["members"]) if i is not None]
        leader = self._index(row.get("leader_id"))
        variant = "isolate-partition-leader" if leader in members and rng.random() < LEADER_PAUSE_SHARE \
            else "isolate-partition-follower"
        chosen = leader if variant == "isolate-partition-leader" and leader is not None else rng.choice(members)
        cut = LinkFault(drop_forward=True, drop_backward=True)
        faults = {name: cut for other in members if other != chosen
                  for name, _ in links.partition_raft_links(chosen, other, int(row["number"]))}
        if not faults:
            return None
        return self._links_fault(variant, [chosen], faults, {"partition": row["name"], "isolated": f"node-{chosen}"})

    # ------------------------------------------------------------------ leaders
    def _begin_move_leaders(self, rng: random.Random) -> Fault | None:
        rows = self._listing()
        live = self.cluster.live_indices()
        if not rows or not live:
            return None
        target = self.cluster.nodes[rng.choice(live)].node_id
        candidates = [r for r in rows if r.get("leader_id") not in (None, target) and target in r.get("members", [])]
        moved = []
        for row in rng.sample(candidates, min(MOVED_MAX, len(candidates))):
            answer = self._ask(f"/v1/cluster/partitions/{row['name']}/leadership", "POST", {"node_id": target})
            moved.append({"partition": row["name"], "from": row.get("leader_id"), "to": answer.get("leader_id"),
                          **({"error": answer["error"].get("code")} if "error" in answer else {})})
        if not moved:
            raise FaultRefused("move-leaders", [self._index(target) or 0], {"reason": "no leader to move there"})
        outcome: dict[str, Any] = {}

        def stop() -> None:
            answer = self._ask("/v1/cluster/rebalance", "POST", {})
            if "error" in answer:
                outcome.update(rebalance_error=answer["error"].get("code"))
            else:
                outcome.update(moves=answer.get("moves"), leaders_per_node=answer.get("leaders_per_node"))

        return Fault("move-leaders", [self._index(target) or 0], stop, {"to": target, "moved": moved},
                     outcome=outcome)

    # ------------------------------------------------------------------ lifecycle
    def _begin_partition_lifecycle(self, rng: random.Random) -> Fault | None:
        self._lifecycles += 1
        name = f"t{self._lifecycles}-{rng.randrange(1000):03d}"
        replicas = min(3, len(self.cluster.nodes))
        created = self._ask("/v1/cluster/partitions", "POST", {"name": name, "replicas": replicas})
        if "error" in created:
            raise FaultRefused("partition-lifecycle", [], {"reason": created["error"].get("code"), "partition": name})
        deadline = time.monotonic() + LED_WAIT_S
        while not any(r["name"] == name and r.get("leader_id") for r in self._listing()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)  # pace: its members start its processes, which elect in about a second
        queue = f"{name}-q"
        placed = self._ask(f"/v1/queues/{queue}", "PUT", {"partitions": [name]})
        acked, unknown, refused = 0, 0, 0
        if "error" not in placed:
            for n in range(LIFECYCLE_ITEMS):
                answer = self._ask(f"/v1/queues/{queue}/enqueue", "POST", {"items": [f"{name}/{n}"]})
                error = answer.get("error")
                if error is None:
                    acked += 1
                elif error.get("maybe_committed") or error.get("code") in ("no_answer", "commit_outcome_unknown"):
                    unknown += 1
                else:
                    refused += 1
        outcome: dict[str, Any] = {}

        def stop() -> None:
            deleted = self._ask(f"/v1/queues/{queue}", "DELETE")
            if "error" in deleted:
                outcome.update(queue_error=deleted["error"].get("code"))
            else:
                outcome.update(removed=deleted.get("removed"))
                gone = self._ask(f"/v1/cluster/partitions/{name}", "DELETE")
                outcome.update(partition_deleted="error" not in gone,
                               **({"partition_error": gone["error"].get("code")} if "error" in gone else {}))

        details = {"partition": name, "queue": queue, "acked": acked, "unknown": unknown, "refused": refused,
                   **({"place_error": placed["error"].get("code")} if "error" in placed else {})}
        return Fault("partition-lifecycle", [], stop, details, outcome=outcome)
