"""How a node's memory budget is shared by the partitions it hosts (docs/partitions.md, "Memory budget").

Every member of a partition holds all of that partition's items in RAM, so a node hosting ``k``
partitions (p0 among them: every node hosts p0) has to split its budget ``B`` (its
``storage_bytes_max``) between them. A static split (``B / k`` each) would refuse a hot partition
while the others sit empty, so p0's controller splits it again at every survey, from what each
partition holds (its leader's ``storage_bytes``):

    floor(n)    = min(FLOOR_BYTES, B(n) // k(n))
    base(p)     = max(used(p), floor(n))                   what p holds, or at least the floor
    free(n)     = B(n) - sum of base over n's partitions
    share(n, p) = base(p) + free(n) // k(n)

Each partition keeps what it holds and gets an equal part of what nobody holds; a partition that
fills its share gets a part of what is left at the next survey, so it grows toward ``B`` minus the
others' bases, the gap shrinking by ``1/k`` a round. When the bases alone are over the budget (it
was lowered, or the node briefly overshot), each share is the floor plus a part of the rest in
proportion to ``base - floor``: the shares still add up to at most ``B(n)``, and a partition over
its share takes nothing more until it drains. A partition's **allowance** is the least of its
shares over its members (each of them holds all of it), so on every node the allowances add up to
at most its budget, none exceeds it, and none is below the least of its members' floors.

:func:`plan` says what the controller changes in a round: an allowance lowered first, and raised
only within the room the others' allowances leave on each member node, so that the allowances in
force never add up to more than a node's budget while the changes are on their way; changes within
:func:`change_threshold` wait (a partition's use moves a little every round).

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time (pure: the controller brings the figures).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

FLOOR_BYTES = 1 << 20  # every partition's allowance, at least (NodeConfig's least storage_bytes_max)
CHANGE_MIN_BYTES = 64 << 10  # an allowance changes only by more than this...
CHANGE_FRACTION = 1024  # ... and by more than this fraction of its smallest member budget


@dataclass(frozen=True)
class MemberStorage:
    """One member process's storage figures, as its ``/readyz`` says (None: it did not say)."""

    used_bytes: int | None  # ``storage_bytes``: what its replica of the partition holds
    allowance_bytes: int | None  # ``storage_bytes_max``: the allowance it stamps on entries when it leads
    node_budget_bytes: int | None  # ``node_storage_bytes_max``: its node's configured budget


@dataclass(frozen=True)
class Plan:
    """The allowances to give in one round: ``lowered`` first; ``raised`` only once every lowering
    was taken (it counts on them)."""

    lowered: dict[str, int] = field(default_factory=dict)
    raised: dict[str, int] = field(default_factory=dict)


def floor_bytes(budget_bytes: int, partitions: int) -> int:
    """The least share of a partition on a node of ``budget_bytes`` hosting ``partitions``."""
    return min(FLOOR_BYTES, budget_bytes // max(1, partitions))


def static_share(budget_bytes: int, partitions: int) -> int:
    """What a partition process takes before p0's controller gives it an allowance: the budget
    split evenly between ``partitions`` (the most any member of its partition hosts)."""
    return max(1, budget_bytes // max(1, partitions))


def change_threshold(budget_bytes: int) -> int:
    """How far an allowance may be from its target before it is changed."""
    return max(CHANGE_MIN_BYTES, budget_bytes // CHANGE_FRACTION)


def node_shares(budget_bytes: int, used: Mapping[str, int]) -> dict[str, int]:
    """partition -> its share of one node's ``budget_bytes``; ``used``: what each partition the node
    hosts holds (see the module's docstring)."""
    hosted = len(used)
    if hosted == 0:
        return {}
    floor = floor_bytes(budget_bytes, hosted)
    base = {name: max(used[name], floor) for name in sorted(used)}
    total = sum(base.values())
    if total <= budget_bytes:
        extra = (budget_bytes - total) // hosted
        return {name: held + extra for name, held in base.items()}
    # Over the budget already: floors, and what is left in proportion to what each holds beyond it.
    rest, beyond = budget_bytes - hosted * floor, total - hosted * floor
    return {name: floor + (held - floor) * rest // beyond for name, held in base.items()}


def members_of(hosted: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    """partition -> the nodes hosting it, from ``hosted`` (node -> its partitions)."""
    members: dict[str, list[str]] = {}
    for node in sorted(hosted):
        for name in sorted(hosted[node]):
            members.setdefault(name, []).append(node)
    return members


def allowances(budgets: Mapping[str, int], hosted: Mapping[str, Collection[str]],
               used: Mapping[str, int]) -> dict[str, int]:
    """partition -> its allowance: the least of its shares over the nodes hosting it.
    ``budgets``: node -> its budget (every node of ``hosted``); ``hosted``: node -> the partitions
    it hosts, p0 included; ``used``: partition -> what it holds (missing: nothing)."""
    result: dict[str, int] = {}
    for node in sorted(hosted):
        shares = node_shares(budgets[node], {name: used.get(name, 0) for name in hosted[node]})
        for name, share in shares.items():
            result[name] = min(result.get(name, share), share)
    return result


def plan(targets: Mapping[str, int], held: Mapping[str, int], budgets: Mapping[str, int],
         hosted: Mapping[str, Collection[str]]) -> Plan:
    """What to change so that each partition's allowance moves toward ``targets`` (from
    :func:`allowances`), given ``held``: the allowance each partition holds now (every partition
    of ``targets``). A lowering comes first; a raise is capped, on each member node, by the budget
    less the others' allowances (lowered ones at their new value), so the allowances in force add
    up to at most each node's budget whichever changes have arrived."""
    members = members_of(hosted)
    now = dict(held)
    lowered: dict[str, int] = {}
    for name, target in sorted(targets.items()):
        if now[name] - target > _threshold(name, members, budgets):
            lowered[name] = now[name] = target
    raised: dict[str, int] = {}
    for name, target in sorted(targets.items()):
        threshold = _threshold(name, members, budgets)
        if target - now[name] <= threshold:
            continue
        room = min(budgets[node] - sum(now[other] for other in hosted[node] if other != name)
                   for node in members[name])
        value = min(target, room)
        if value - now[name] > threshold:
            raised[name] = now[name] = value
    return Plan(lowered, raised)


def _threshold(name: str, members: Mapping[str, list[str]], budgets: Mapping[str, int]) -> int:
    return change_threshold(min(budgets[node] for node in members[name]))
