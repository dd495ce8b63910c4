"""Which partition leader to move next, if any, so that each node leads about P/N of the P
partitions (docs/partitions.md, "Leaders spread"). Pure: what the partitions' processes said goes
in, one move (or none) comes out; the controller (rcq.server.leader.partition_controller) asks
and acts.

The rules, each against a way balancers go wrong:

* **Only a clear imbalance moves a leader**: a move from L to T only while L leads at least two
  more partitions than T. Leaders one apart stay put, so two nodes never trade a leader back and
  forth (no flapping), and a balanced cluster makes no move at all.
* **Never to a lagging member**: T must have answered and be within ``lag_max`` entries of the
  leader's commit index (a hand-over holds commits until the target has the whole log: a far
  behind target would hold them long).
* **Not within ``hold_s`` of a leader change**: the leader must have led that long (as it says
  itself, on its own clock), so a partition that just elected a leader, or was just moved, is
  left to settle, and a node that restarts gets its share back once it has served a while.
* **One move at a time** (the controller waits for a move to be seen before the next), the
  largest imbalance first; among equal moves, towards the partition's preferred leader, then by
  partition name, so that the choice is the same on every run.
* **p0 is not moved**: its leader does the cluster's own work (the directory, the balancer), and
  the count is of the other partitions' leaders.

Greedy, one hop at a time: a node that is not a member of the partitions the busiest node leads
gets no leader from it directly (members are the operator's choice, or chosen at creation to
spread); such a cluster may stay two apart where a chain of moves would even it.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

LAG_MAX = 1000  # entries a member may be behind the leader's commit index and still be given the lead
IMBALANCE_MIN = 2  # a move only from a node leading at least this many more than the target


@dataclass(frozen=True)
class PartitionLeaders:
    """What one partition's members said: its leader, how long it has led, each member's lag."""

    name: str
    members: tuple[str, ...]
    leader: str | None
    leader_for_s: float | None = None  # as the leader says; None: it did not say
    lag: Mapping[str, int | None] = field(default_factory=dict)  # member -> entries behind; None: no answer
    preferred_leader: str | None = None


@dataclass(frozen=True)
class Move:
    partition: str
    from_node: str
    to_node: str


def leaders_per_node(partitions: Iterable[PartitionLeaders], nodes: Iterable[str]) -> dict[str, int]:
    """node -> how many of ``partitions`` it leads, for each of ``nodes`` (0 included)."""
    counts = dict.fromkeys(nodes, 0)
    for partition in partitions:
        if partition.leader in counts:
            counts[partition.leader] += 1
    return counts


def next_move(partitions: Iterable[PartitionLeaders], nodes: Iterable[str], hold_s: float,
              lag_max: int = LAG_MAX) -> Move | None:
    """The move to make now among ``partitions`` (not p0) led by ``nodes`` (the nodes that may lead:
    serving, answering), or None: balanced, or no move allowed by the rules above."""
    partitions = list(partitions)
    counts = leaders_per_node(partitions, nodes)
    best: tuple[tuple[int, int, str, str], Move] | None = None
    for partition in partitions:
        leader = partition.leader
        if leader not in counts or partition.leader_for_s is None or partition.leader_for_s < hold_s:
            continue
        for target in partition.members:
            lag = partition.lag.get(target)
            if target == leader or target not in counts or lag is None or lag > lag_max:
                continue
            gap = counts[leader] - counts[target]
            if gap < IMBALANCE_MIN:
                continue
            # larger gap first, then the preferred leader, then by name (smallest key wins)
            key = (-gap, 0 if target == partition.preferred_leader else 1, partition.name, target)
            if best is None or key < best[0]:
                best = (key, Move(partition.name, leader, target))
    return best[1] if best is not None else None


def spread(partitions: Iterable[PartitionLeaders], nodes: Iterable[str]) -> int:
    """Most leaders on one node minus fewest: 0 or 1 is balanced."""
    counts = leaders_per_node(partitions, nodes)
    return max(counts.values()) - min(counts.values()) if counts else 0
