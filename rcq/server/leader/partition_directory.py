"""The partition directory, as p0's serving leader keeps it (docs/partitions.md).

* **Node ports.** Each node states on ``/healthz`` where it serves partitions
  (:func:`partition_ports_of`); at every turn of the feature-level loop, the leader records, with a
  ``node_ports`` entry, each voting member whose statement differs from the directory.
* **Creating a partition.** :meth:`PartitionDirectory.create` checks what it can before proposing
  (the level, the name, the members) and maps what the state machine refuses to rcq's errors.
  Members are chosen among the voting members with ports recorded, those holding the fewest
  partitions first (then by node id), unless the caller names them; the preferred leader is the
  member that is preferred for the fewest partitions.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import logging
from typing import Any

from rcq.errors import (
    InvalidRequest,
    NodeHasNoPartitionPorts,
    NodePartitionsFull,
    PartitionExists,
    PartitionNotEmpty,
    PartitionNotFound,
    PartitionPortsExhausted,
    QueuePlacementFixed,
    QueueSpreadUnsupported,
    TooManyPartitions,
    Unavailable,
)
from rcq.server.config import NodeConfig
from rcq.server.core.directory import (
    NO_RANGE,
    NODE_PARTITIONS_MAX,
    P0,
    PARTITION_MEMBERS_MAX,
    PARTITIONS_MAX,
    Directory,
    DirectoryResult,
    NodePorts,
    Partition,
    PartitionChange,
    QueuePlacement,
    partition_name_problem,
)
from rcq.server.core.features import LEVEL_OF_PARTITIONS
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)

PARTITION_REPLICAS_DEFAULT = 3


def partition_ports_of(config: NodeConfig) -> dict[str, Any]:
    """What a node states on /healthz of where it serves partitions (it serves partitions):
    ``named`` only when it has a ``partition_port_map``, so a node without states what it did."""
    assert config.serves_partitions
    ports = config.partition_ports or NO_RANGE
    stated: dict[str, Any] = {"raft_host": config.raft_address.rsplit(":", 1)[0], "url": config.url,
                              "partition_ports": list(ports),
                              "partition_advertise_ports": list(config.partition_advertise_ports or ports)}
    if config.partition_port_map:
        stated["named"] = [[name, *entry.ports()] for name, entry in sorted(config.partition_port_map.items())]
    return stated


def stated_ports(node_id: str, stated: dict[str, Any], term: int, now_ms: int) -> NodePorts | None:
    """The ``node_ports`` entry for what ``node_id`` stated (None: a statement that makes no sense)."""
    try:
        ports, advertised = stated["partition_ports"], stated["partition_advertise_ports"]
        named = tuple(sorted((str(e[0]), int(e[1]), int(e[2]), int(e[3]), int(e[4]))
                             for e in stated.get("named") or []))
        entry = NodePorts(term, now_ms, node_id, str(stated["raft_host"]), str(stated["url"]),
                          (int(ports[0]), int(ports[1])), (int(advertised[0]), int(advertised[1])), named)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    pairs = (entry.partition_ports, entry.partition_advertise_ports)
    ranges_valid = all(1 <= pair[0] < pair[1] <= 65535 for pair in pairs) or (all(p == NO_RANGE for p in pairs)
                                                                             and bool(named))
    named_valid = all(partition_name_problem(e[0]) is None and all(1 <= p <= 65535 for p in e[1:]) for e in named)
    return entry if ranges_valid and named_valid and len({e[0] for e in named}) == len(named) else None


def same_ports(recorded: NodePorts | None, entry: NodePorts) -> bool:
    return recorded is not None and (recorded.raft_host, recorded.url, recorded.partition_ports,
                                     recorded.partition_advertise_ports, recorded.named) == (
        entry.raft_host, entry.url, entry.partition_ports, entry.partition_advertise_ports, entry.named)


REFUSALS = {
    "partition_exists": PartitionExists,
    "partition_not_found": PartitionNotFound,
    "partition_not_empty": PartitionNotEmpty,
    "node_has_no_partition_ports": NodeHasNoPartitionPorts,
    "partition_ports_exhausted": PartitionPortsExhausted,
    "too_many_partitions": TooManyPartitions,
    "node_partitions_full": NodePartitionsFull,
    "queue_placement_fixed": QueuePlacementFixed,
    "queue_spread_unsupported": QueueSpreadUnsupported,
    "invalid": InvalidRequest,
}


class PartitionDirectory:
    """p0's leader's side of the directory. ``stamp`` gives (term, now_ms) for an entry of the
    serving leader (raising NotLeader elsewhere); ``voting`` the voting members' node ids;
    ``active_level`` the cluster's level and ``require_level`` the feature levels' gate
    (rcq.server.leader.feature_levels)."""

    def __init__(self, config: NodeConfig, replicator: Replicator, stamp: Any, voting: Any, active_level: Any,
                 require_level: Any) -> None:
        self._config = config
        self._replicator = replicator
        self._stamp = stamp
        self._voting = voting
        self._active_level = active_level
        self._require = require_level

    def _read(self) -> Directory:
        return self._replicator.read(lambda sm: sm.directory.copy())

    def _require_level(self, feature: str) -> None:
        self._require(LEVEL_OF_PARTITIONS, feature)

    # --------------------------------------------------------------- node ports
    async def record_ports(self, members: list[Any]) -> None:
        """Record each member's stated ports that the directory lacks or has otherwise."""
        if self._active_level() < LEVEL_OF_PARTITIONS:
            return
        for member in members:
            if member.partition_ports is None:
                continue
            term, now_ms = self._stamp()
            entry = stated_ports(member.node_id, member.partition_ports, term, now_ms)
            if entry is None:
                log.warning("node %s states partition ports that make no sense: %r", member.node_id,
                            member.partition_ports)
                continue
            if same_ports(self._read().node_ports.get(member.node_id), entry):
                continue
            result = await self._replicator.submit(entry, self._config.commit_timeout_s)
            if result == DirectoryResult("done"):
                log.info("partition ports of %s recorded: %d-%d%s", member.node_id, *entry.partition_ports,
                         "".join(f", {e[0]} at {e[1]}/{e[2]}" for e in entry.named))

    # --------------------------------------------------------------- creating
    async def create(self, name: str, replicas: int | None = None, nodes: list[str] | None = None) -> dict[str, Any]:
        """Create partition ``name`` on ``nodes`` (or ``replicas`` nodes chosen); its listing entry."""
        self._require_level("creating a partition")
        problem = partition_name_problem(name)
        if problem is not None:
            raise InvalidRequest(f"partition {name!r}: {problem}")
        directory = self._read()
        if name in directory.partitions:
            raise PartitionExists(f"partition {name} exists", details={"partition": name})
        if len(directory.partitions) >= PARTITIONS_MAX:
            raise TooManyPartitions(f"the cluster has {len(directory.partitions)} partitions besides p0, the most it "
                                    "may: delete one first (docs/limits.md)", details={"limit": PARTITIONS_MAX})
        members = self._choose(directory, name, replicas, nodes)
        preferred = min(members, key=lambda m: (sum(p.preferred_leader == m for p in directory.partitions.values()),
                                                m))
        term, now_ms = self._stamp()
        result = await self._replicator.submit(
            PartitionChange(term, now_ms, "create", name, directory.next_number, tuple(members), preferred),
            self._config.commit_timeout_s)
        self._raise_refusal(result, f"partition {name}")
        log.info("partition %s created on %s", name, ", ".join(members))
        return self.listing(name)[0]

    # --------------------------------------------------------------- deleting
    async def delete(self, name: str) -> dict[str, Any]:
        """Delete partition ``name``, which must hold no queue. Its members stop its processes and
        remove its data within a second (rcq.server.partitions.host); its number is never reused."""
        self._require_level("deleting a partition")
        if name == P0:
            raise InvalidRequest("p0 is the partition every cluster has: it cannot be deleted")
        directory = self._read()
        if name not in directory.partitions:
            raise PartitionNotFound(f"no partition {name}", details={"partition": name})
        queues = sorted(q for q, where in directory.placement.items() if name in where)
        if queues:
            raise PartitionNotEmpty(
                f"partition {name} holds {len(queues)} queue(s), {', '.join(queues[:10])}: delete them first "
                "(nothing was changed)", details={"partition": name, "queues": queues[:10]})
        term, now_ms = self._stamp()
        result = await self._replicator.submit(PartitionChange(term, now_ms, "delete", name),
                                               self._config.commit_timeout_s)
        self._raise_refusal(result, f"partition {name}")
        log.info("partition %s deleted", name)
        return {"name": name, "deleted": True}

    # --------------------------------------------------------------- members
    async def set_members(self, name: str, members: list[str]) -> dict[str, Any]:
        """Make ``members`` partition ``name``'s members in the directory (p0's controller then
        changes its Raft membership to match, one node at a time); its listing entry. The preferred
        leader stays when it is still a member, else it is the member preferred for the fewest."""
        self._require_level("changing a partition's members")
        directory = self._read()
        partition = self._partition(directory, name)
        voting = set(self._voting())
        strangers = [m for m in members if m not in voting and m not in partition.members]
        if strangers:
            raise InvalidRequest(f"not voting members of the cluster: {', '.join(strangers)}",
                                 details={"nodes": strangers})
        if not members or len(set(members)) != len(members) or len(members) > PARTITION_MEMBERS_MAX:
            raise InvalidRequest(f"a partition has 1 to {PARTITION_MEMBERS_MAX} distinct members")
        preferred = partition.preferred_leader if partition.preferred_leader in members else min(
            members, key=lambda m: (sum(p.preferred_leader == m for p in directory.partitions.values()), m))
        term, now_ms = self._stamp()
        result = await self._replicator.submit(
            PartitionChange(term, now_ms, "members", name, partition.number, tuple(members), preferred),
            self._config.commit_timeout_s)
        self._raise_refusal(result, f"partition {name}")
        log.info("partition %s: members %s in the directory (were %s)", name, ", ".join(members),
                 ", ".join(partition.members))
        return self.listing(name)[0]

    def members_of(self, name: str) -> list[str]:
        return list(self._partition(self._read(), name).members)

    def replacement(self, name: str, leaving: str) -> str:
        """The node to take ``leaving``'s place in partition ``name``: a voting member that is not
        one of its members, has ports for it and room, holding the fewest partitions (then by id)."""
        directory = self._read()
        partition = self._partition(directory, name)
        hosted = directory.hosted()
        fit = [n for n in self._voting() if n not in partition.members and n != leaving
               and n in directory.node_ports and hosted.get(n, 0) < NODE_PARTITIONS_MAX
               and directory.node_ports[n].serves(name, partition.number)]
        if not fit:
            raise NodeHasNoPartitionPorts(
                f"no node can take {leaving}'s place in partition {name}: every other voting member is a member "
                "already, full, or has no ports for it; add a node first (docs/operations.md)",
                details={"partition": name, "node_id": leaving})
        return str(min(fit, key=lambda n: (hosted.get(n, 0), n)))

    @staticmethod
    def _partition(directory: Directory, name: str) -> Partition:
        if name == P0:
            raise InvalidRequest("p0's members are the cluster's voting members: change them with rcq cluster "
                                 "add-node and remove-node (docs/membership.md)")
        partition = directory.partitions.get(name)
        if partition is None:
            raise PartitionNotFound(f"no partition {name}", details={"partition": name})
        return partition

    def _choose(self, directory: Directory, name: str, replicas: int | None, nodes: list[str] | None) -> list[str]:
        voting = list(self._voting())
        hosted = directory.hosted()
        full = [n for n in voting if hosted.get(n, 0) >= NODE_PARTITIONS_MAX]

        def refuse_full(nodes_full: list[str]) -> NodePartitionsFull:
            return NodePartitionsFull(
                f"{', '.join(nodes_full)} host {NODE_PARTITIONS_MAX} partitions, the most a node may: name other "
                "nodes, add nodes, or delete a partition (docs/limits.md)",
                details={"nodes": nodes_full, "limit": NODE_PARTITIONS_MAX})

        # Nodes that may take it: room for one more, and ports for it (named ones, or a pair of their
        # range for its number).
        with_ports = [n for n in voting if n in directory.node_ports and n not in full
                      and directory.node_ports[n].serves(name, directory.next_number)]
        if nodes is not None:
            strangers = [n for n in nodes if n not in voting]
            if strangers:
                raise InvalidRequest(f"not voting members of the cluster: {', '.join(strangers)}",
                                     details={"nodes": strangers})
            if len(set(nodes)) != len(nodes) or not 1 <= len(nodes) <= PARTITION_MEMBERS_MAX:
                raise InvalidRequest(f"a partition has 1 to {PARTITION_MEMBERS_MAX} distinct members")
            if replicas is not None and replicas != len(nodes):
                raise InvalidRequest(f"replicas {replicas} but {len(nodes)} nodes named")
            if [n for n in nodes if n in full]:
                raise refuse_full([n for n in nodes if n in full])
            without = [n for n in nodes if n not in directory.node_ports]
            if without:
                raise NodeHasNoPartitionPorts(
                    f"no partition ports are recorded for {', '.join(without)}: set partition_ports on them "
                    "(docs/partitions.md); a node's ports are recorded within seconds of its start",
                    details={"nodes": without})
            return list(nodes)
        wanted = replicas if replicas is not None else min(PARTITION_REPLICAS_DEFAULT, len(voting))
        if not 1 <= wanted <= PARTITION_MEMBERS_MAX:
            raise InvalidRequest(f"replicas must be 1 to {PARTITION_MEMBERS_MAX}")
        if len(with_ports) < wanted and full:
            raise refuse_full(full)
        exhausted = [n for n in voting if n in directory.node_ports and n not in with_ports]
        if len(with_ports) < wanted and exhausted:
            raise PartitionPortsExhausted(
                f"a partition of {wanted} needs {wanted} nodes with ports for it; {', '.join(exhausted)} have no "
                f"ports left for partition number {directory.next_number} and none named for {name}: widen their "
                "partition_ports or name ports for it in partition_port_map (docs/partitions.md)",
                details={"nodes": exhausted, "number": directory.next_number})
        if len(with_ports) < wanted:
            raise NodeHasNoPartitionPorts(
                f"a partition of {wanted} needs {wanted} nodes with partition ports recorded; the cluster has "
                f"{len(with_ports)} ({', '.join(with_ports) or 'none'}): set partition_ports on them "
                "(docs/partitions.md)", details={"nodes": [n for n in voting if n not in with_ports]})
        return sorted(sorted(with_ports, key=lambda n: (hosted.get(n, 0), n))[:wanted])

    # --------------------------------------------------------------- placing
    def placed(self, queue: str) -> list[str]:
        return list(self._replicator.read(lambda sm: sm.directory.placed(queue)))

    async def place(self, queue: str, partitions: list[str]) -> list[str]:
        """Place ``queue`` in ``partitions`` (fixed once: the same placement again is fine)."""
        if partitions == self.placed(queue):
            return partitions
        self._require_level("placing a queue in a partition")
        # What the state machine would refuse is refused here first: a refusal writes no entry.
        directory = self._read()
        unknown = [p for p in partitions if p != P0 and p not in directory.partitions]
        if len(set(partitions)) != len(partitions):
            raise InvalidRequest("partitions names a partition twice", details={"partitions": partitions})
        if unknown:
            raise PartitionNotFound(f"no partition {unknown[0]!r} (GET /v1/cluster/partitions lists them)",
                                    details={"partition": unknown[0]})
        exists_in_p0 = self._replicator.read(lambda sm: sm.queue_stats(queue) is not None)
        if queue in directory.placement or exists_in_p0:
            raise QueuePlacementFixed(
                f"queue {queue!r} lives in {', '.join(directory.placed(queue))}: a queue's partitions are fixed "
                "when it is created (delete it first to place it anew)",
                details={"queue": queue, "partitions": list(directory.placed(queue))})
        term, now_ms = self._stamp()
        result = await self._replicator.submit(QueuePlacement(term, now_ms, queue, tuple(partitions)),
                                               self._config.commit_timeout_s)
        self._raise_refusal(result, f"queue {queue!r}")
        return partitions

    async def forget(self, queue: str) -> None:
        """Forget where ``queue`` was placed (it was deleted in its partition): re-created, it may
        be placed anew. Nothing to forget writes no entry."""
        if queue not in self._read().placement:
            return
        self._require_level("forgetting a queue's placement")
        term, now_ms = self._stamp()
        result = await self._replicator.submit(QueuePlacement(term, now_ms, queue, ()), self._config.commit_timeout_s)
        self._raise_refusal(result, f"queue {queue!r}")

    @staticmethod
    def _raise_refusal(result: Any, what: str) -> None:
        if result == DirectoryResult("done"):
            return
        if not isinstance(result, DirectoryResult) or result.reason in ("stale_leader", "level_too_low"):
            raise Unavailable(f"{what}: the entry was not applied ({result!r}); retry")
        details = dict(result.details)
        error = REFUSALS.get(result.reason or "", InvalidRequest)
        raise error(f"{what}: {result.reason}" + (f" ({details})" if details else ""), details=details)

    # ---------------------------------------------------------------- reading
    def listing(self, only: str | None = None) -> list[dict[str, Any]]:
        """Every partition (p0 first, then by number) with its members and preferred leader."""
        directory = self._read()
        rows = [{"name": P0, "number": 0, "members": sorted(self._voting()), "preferred_leader": None}]
        rows += [{"name": p.name, "number": p.number, "members": list(p.members), "preferred_leader": p.preferred_leader}
                 for p in sorted(directory.partitions.values(), key=lambda p: p.number)]
        return [row for row in rows if only is None or row["name"] == only]
