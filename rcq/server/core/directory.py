"""The partition directory: which partitions exist, where nodes serve them, where queues live.

Part of p0's replicated state from feature level 4 (docs/partitions.md). Three commands change it,
each one log entry:

* :class:`PartitionChange` creates a partition (a name, a number, its members and preferred
  leader), deletes one that holds no queue, or sets its members (``members``: the members it
  should have; p0's leader then changes the partition's own Raft membership to match, one node at
  a time: rcq.server.leader.partition_controller);
* :class:`NodePorts` records where a node serves partitions: its ``partition_ports``, the ports as
  others reach them, its Raft host and its URL (a node records its own when it serves);
* :class:`QueuePlacement` places a queue in partitions, once; with no partitions it forgets a
  placement (the queue was deleted in its partition, and may be placed anew).

Numbers are never reused: a partition's ports derive from its number, and a deleted partition's
processes may still hold them. p0 is never in ``partitions``: its members are Raft's own
membership. Applying never raises; a refusal is a :class:`DirectoryResult` with a reason, the same
on every replica.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from rcq.immutable import immutable
from rcq.names import P0 as P0  # re-exported: the directory's modules have always found it here
from rcq.names import PARTITION_NAME

KIND_PARTITION = "partition"
KIND_NODE_PORTS = "node_ports"
KIND_PLACEMENT = "placement"
PARTITION_ACTIONS = ("create", "delete", "members")
# Safe in a path, a metric label, a transaction id and a URL; p0 is the cluster's own.
PARTITION_NAME_PATTERN = re.compile(rf"^{PARTITION_NAME}$")
PARTITION_MEMBERS_MAX = 9
PARTITIONS_MAX = 64  # partitions of a cluster besides p0 (docs/limits.md)
NODE_PARTITIONS_MAX = 16  # partition processes one node may host (each ~66 MiB and its own fsyncs)
PLACEMENT_PARTITIONS_MAX = PARTITIONS_MAX + 1  # a queue spread over every partition, p0 included
NO_RANGE = (0, 0)  # a node's partition_ports when it has named ports only (NodePorts.named)


def partition_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a new partition, or None."""
    if not isinstance(name, str) or not PARTITION_NAME_PATTERN.match(name):
        return "a partition name is 1 to 32 of a-z, 0-9, '_' and '-', starting with a letter"
    if name == P0:
        return "p0 is the partition every cluster has"
    return None


@immutable
class PartitionChange:
    term: int
    now_ms: int
    action: Literal["create", "delete", "members"]
    name: str
    number: int = 0  # create: the partition's number (its ports derive from it)
    members: tuple[str, ...] = ()  # create, members: node ids
    preferred_leader: str | None = None


@immutable
class NodePorts:
    term: int
    now_ms: int
    node_id: str
    raft_host: str
    url: str  # the URL the node advertises for p0
    partition_ports: tuple[int, int]  # NO_RANGE: none
    partition_advertise_ports: tuple[int, int]
    # Partitions with ports of their own on this node, sorted by name: (name, HTTP, Raft, advertised
    # HTTP, advertised Raft). Written only when there are any, so entries without keep their form.
    named: tuple[tuple[str, int, int, int, int], ...] = ()

    def serves(self, name: str, number: int) -> bool:
        """Whether this node has ports for partition ``name`` (number ``number``)."""
        return any(entry[0] == name for entry in self.named) or number <= _partitions_max(self.partition_ports)


@immutable
class QueuePlacement:
    term: int
    now_ms: int
    queue: str
    partitions: tuple[str, ...]


DirectoryCommand = PartitionChange | NodePorts | QueuePlacement


@immutable
class DirectoryResult:
    status: Literal["done", "rejected"]
    reason: str | None = None
    # stale_leader, level_too_low, partition_exists, partition_not_found, partition_not_empty,
    # node_has_no_partition_ports, partition_ports_exhausted, too_many_partitions,
    # node_partitions_full, queue_placement_fixed,
    # queue_spread_unsupported, invalid
    details: tuple[tuple[str, Any], ...] = ()


@immutable
class Partition:
    name: str
    number: int
    members: tuple[str, ...]
    preferred_leader: str | None


def _refused(reason: str, **details: Any) -> DirectoryResult:
    return DirectoryResult("rejected", reason, tuple(sorted(details.items())))


def _members_refused(command: PartitionChange) -> DirectoryResult | None:
    """Why ``command``'s members cannot be a partition's: 1 to 9 distinct ones, the preferred
    leader among them."""
    if not command.members or len(set(command.members)) != len(command.members) \
            or len(command.members) > PARTITION_MEMBERS_MAX:
        return _refused("invalid", problem=f"1 to {PARTITION_MEMBERS_MAX} distinct members")
    if command.preferred_leader is not None and command.preferred_leader not in command.members:
        return _refused("invalid", problem="the preferred leader must be a member")
    return None


class Directory:
    """The directory's state; :meth:`apply` is called by the state machine for its entries."""

    def __init__(self) -> None:
        self.partitions: dict[str, Partition] = {}
        self.node_ports: dict[str, NodePorts] = {}
        self.placement: dict[str, tuple[str, ...]] = {}
        self.next_number = 1

    # ------------------------------------------------------------------ apply
    def apply(self, command: DirectoryCommand, barrier_term: int, queue_exists: Callable[[str], bool]
              ) -> DirectoryResult:
        if command.term < barrier_term:
            return _refused("stale_leader")
        if isinstance(command, NodePorts):
            self.node_ports[command.node_id] = command
            return DirectoryResult("done")
        if isinstance(command, QueuePlacement):
            return self._place(command, queue_exists)
        if command.action == "create":
            return self._create(command)
        if command.action == "members":
            return self._set_members(command)
        return self._delete(command)

    def _create(self, command: PartitionChange) -> DirectoryResult:
        problem = partition_name_problem(command.name)
        if problem is not None:
            return _refused("invalid", problem=problem)
        if command.name in self.partitions:
            return _refused("partition_exists", partition=command.name)
        refused = _members_refused(command)
        if refused is not None:
            return refused
        if command.number < self.next_number:
            return _refused("invalid", problem=f"partition numbers are never reused: the next is {self.next_number}")
        if len(self.partitions) >= PARTITIONS_MAX:
            return _refused("too_many_partitions", limit=PARTITIONS_MAX)
        refused = self._hosting_refused(command.members, command.name, command.number)
        if refused is not None:
            return refused
        self.partitions[command.name] = Partition(command.name, command.number, command.members,
                                                  command.preferred_leader)
        self.next_number = command.number + 1
        return DirectoryResult("done")

    def _set_members(self, command: PartitionChange) -> DirectoryResult:
        partition = self.partitions.get(command.name)
        if partition is None:
            return _refused("partition_not_found", partition=command.name)
        refused = _members_refused(command)
        if refused is not None:
            return refused
        # only the members added are counted: one a node already is stays, whatever the limit
        added = [m for m in command.members if m not in partition.members]
        refused = self._hosting_refused(added, partition.name, partition.number)
        if refused is not None:
            return refused
        self.partitions[command.name] = Partition(partition.name, partition.number, command.members,
                                                  command.preferred_leader)
        return DirectoryResult("done")

    def _hosting_refused(self, nodes: list[str] | tuple[str, ...], name: str, number: int) -> DirectoryResult | None:
        """Why ``nodes`` cannot become members of partition ``name`` (number ``number``): one is a
        member of as many partitions as a node may, has no ports recorded, or none for it."""
        hosted = self.hosted()
        full = [m for m in nodes if hosted.get(m, 0) >= NODE_PARTITIONS_MAX]
        if full:
            return _refused("node_partitions_full", nodes=tuple(full), limit=NODE_PARTITIONS_MAX)
        missing = [m for m in nodes if m not in self.node_ports]
        if missing:
            return _refused("node_has_no_partition_ports", nodes=tuple(missing))
        without = [m for m in nodes if not self.node_ports[m].serves(name, number)]
        if without:
            return _refused("partition_ports_exhausted", nodes=tuple(without), number=number)
        return None

    def _delete(self, command: PartitionChange) -> DirectoryResult:
        if command.name not in self.partitions:
            return _refused("partition_not_found", partition=command.name)
        queues = sorted(q for q, where in self.placement.items() if command.name in where)
        if queues:
            return _refused("partition_not_empty", partition=command.name, queues=tuple(queues[:10]))
        del self.partitions[command.name]
        return DirectoryResult("done")

    def _place(self, command: QueuePlacement, queue_exists: Callable[[str], bool]) -> DirectoryResult:
        wanted = command.partitions
        if not wanted:  # the queue was deleted where it lived: forgotten, it may be placed anew
            self.placement.pop(command.queue, None)
            return DirectoryResult("done")
        if len(set(wanted)) != len(wanted):
            return _refused("invalid", problem="a placement names one or more distinct partitions")
        unknown = [p for p in wanted if p != P0 and p not in self.partitions]
        if unknown:
            return _refused("partition_not_found", partition=unknown[0])
        if len(wanted) > PLACEMENT_PARTITIONS_MAX:
            return _refused("queue_spread_unsupported", partitions=wanted)
        placed = self.placed(command.queue)
        if placed == wanted:
            return DirectoryResult("done")
        if command.queue in self.placement or queue_exists(command.queue):
            return _refused("queue_placement_fixed", queue=command.queue, partitions=placed)
        self.placement[command.queue] = wanted
        return DirectoryResult("done")

    # ---------------------------------------------------------------- queries
    def placed(self, queue: str) -> tuple[str, ...]:
        """The partitions ``queue`` lives in (p0 unless placed elsewhere)."""
        return self.placement.get(queue, (P0,))

    def hosted(self) -> dict[str, int]:
        """node id -> how many partitions besides p0 it is a member of."""
        counts: dict[str, int] = {}
        for partition in self.partitions.values():
            for member in partition.members:
                counts[member] = counts.get(member, 0) + 1
        return counts

    def placed_elsewhere(self, queue: str) -> bool:
        """Whether ``queue`` is placed in partitions that do not include p0."""
        placed = self.placement.get(queue)
        return placed is not None and P0 not in placed

    def forget_queue(self, queue: str) -> None:
        """A deleted queue's placement goes with it (re-created, it may be placed anew)."""
        self.placement.pop(queue, None)

    def copy(self) -> Directory:
        """A copy to read outside the replicator's lock (its entries are immutable)."""
        copied = Directory()
        copied.partitions, copied.node_ports = dict(self.partitions), dict(self.node_ports)
        copied.placement, copied.next_number = dict(self.placement), self.next_number
        return copied

    @property
    def empty(self) -> bool:
        return not (self.partitions or self.node_ports or self.placement) and self.next_number == 1

    # --------------------------------------------------------------- snapshot
    def to_meta(self) -> dict[str, Any]:
        """The snapshot's ``directory`` (plain JSON values, sorted)."""
        return {
            "next_number": self.next_number,
            "partitions": [[p.name, p.number, list(p.members), p.preferred_leader]
                           for p in sorted(self.partitions.values(), key=lambda p: p.number)],
            "node_ports": [[n.node_id, n.raft_host, n.url, list(n.partition_ports), list(n.partition_advertise_ports),
                            n.term, n.now_ms, *([[list(e) for e in n.named]] if n.named else [])]
                           for _, n in sorted(self.node_ports.items())],
            "placement": [[queue, list(where)] for queue, where in sorted(self.placement.items())],
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None) -> Directory:
        directory = cls()
        if not meta:
            return directory
        directory.next_number = int(meta["next_number"])
        for name, number, members, preferred in meta["partitions"]:
            directory.partitions[name] = Partition(name, int(number), tuple(members), preferred)
        for row in meta["node_ports"]:
            node_id, raft_host, url, ports, advertised, term, now_ms = row[:7]
            named = tuple(_named_ports(tuple(e)) for e in row[7]) if len(row) > 7 else ()
            directory.node_ports[node_id] = NodePorts(int(term), int(now_ms), node_id, raft_host, url,
                                                      _pair(ports), _pair(advertised), named)
        for queue, where in meta["placement"]:
            directory.placement[queue] = tuple(where)
        return directory


def _pair(value: Any) -> tuple[int, int]:
    first, second = value
    return int(first), int(second)


def _partitions_max(ports: tuple[int, int]) -> int:
    return 0 if ports == NO_RANGE else (ports[1] - ports[0] + 1) // 2


# ------------------------------------------------------------------ the codec
def encode_directory(command: DirectoryCommand, version: int) -> tuple[Any, ...]:
    if isinstance(command, PartitionChange):
        return (version, KIND_PARTITION, command.term, command.now_ms, command.action, command.name, command.number,
                command.members, command.preferred_leader)
    if isinstance(command, NodePorts):
        return (version, KIND_NODE_PORTS, command.term, command.now_ms, command.node_id, command.raft_host,
                command.url, command.partition_ports, command.partition_advertise_ports,
                *((command.named,) if command.named else ()))
    return (version, KIND_PLACEMENT, command.term, command.now_ms, command.queue, command.partitions)


def decode_directory(raw: Any) -> DirectoryCommand | None:
    """The directory command of ``raw`` (a tuple whose version was checked), None for another kind;
    ValueError/TypeError when malformed."""
    kind = raw[1]
    if kind == KIND_PARTITION:
        _, _, term, now_ms, action, name, number, members, preferred = raw
        if action not in PARTITION_ACTIONS:
            raise ValueError(f"unknown partition action {action!r}")
        return PartitionChange(_int(term), _int(now_ms), action, _str(name), _int(number),
                               tuple(_str(m) for m in _tuple(members)), None if preferred is None else _str(preferred))
    if kind == KIND_NODE_PORTS:
        _, _, term, now_ms, node_id, raft_host, url, ports, advertised, *rest = raw
        if len(rest) > 1:
            raise ValueError("a node_ports entry has at most one list of named ports")
        named = tuple(_named_ports(entry) for entry in _tuple(rest[0])) if rest else ()
        return NodePorts(_int(term), _int(now_ms), _str(node_id), _str(raft_host), _str(url),
                         _port_pair(ports), _port_pair(advertised), named)
    if kind == KIND_PLACEMENT:
        _, _, term, now_ms, queue, partitions = raw
        return QueuePlacement(_int(term), _int(now_ms), _str(queue), tuple(_str(p) for p in _tuple(partitions)))
    return None


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected int, got {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    return value


def _tuple(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, tuple):
        raise TypeError(f"expected a tuple, got {type(value).__name__}")
    return value


def _port_pair(value: Any) -> tuple[int, int]:
    first, second = _tuple(value)
    if (first, second) != NO_RANGE and not 1 <= _int(first) < _int(second) <= 65535:
        raise ValueError(f"bad port range {value!r}")
    return first, second


def _named_ports(value: Any) -> tuple[str, int, int, int, int]:
    name, *ports = _tuple(value)
    if len(ports) != 4 or not all(1 <= _int(port) <= 65535 for port in ports):
        raise ValueError(f"bad named partition ports {value!r}")
    return _str(name), ports[0], ports[1], ports[2], ports[3]
