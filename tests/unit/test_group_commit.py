"""GroupCommitter's adaptive depth: a lone commit is proposed at once; while an entry is in flight
and its round trip is known, commits fill the next entry instead of each going alone."""

from __future__ import annotations

import asyncio
from typing import Any

from rcq.server.core.commands import BatchResult, CommitBatch, CommitUnit, UnitOutcome
from rcq.server.leader.group_commit import GroupCommitter
from tests.helpers import LOCAL_WAIT_S


class GatedReplicator:
    """Answers each proposed entry when the test opens its gate; records the entries."""

    def __init__(self) -> None:
        self.entries: list[CommitBatch] = []
        self.gates: list[asyncio.Event] = []
        self.proposed = asyncio.Condition()

    async def submit(self, command: Any, timeout_s: float) -> BatchResult:
        gate = asyncio.Event()
        async with self.proposed:
            self.entries.append(command)
            self.gates.append(gate)
            self.proposed.notify_all()
        await gate.wait()
        return BatchResult(outcomes=tuple(UnitOutcome(status="committed", index=len(self.entries))
                                          for _ in command.units))

    async def wait_for_entries(self, count: int) -> None:
        async with self.proposed:
            await asyncio.wait_for(self.proposed.wait_for(lambda: len(self.entries) >= count), LOCAL_WAIT_S)


def _committer(replicator: GatedReplicator) -> GroupCommitter:
    return GroupCommitter(replicator, units_max=100, bytes_max=1 << 20, in_flight_max=32,  # type: ignore[arg-type]
                          timeout_s=LOCAL_WAIT_S)


async def test_a_lone_commit_is_proposed_at_once_and_later_ones_fill_the_next_entry() -> None:
    replicator = GatedReplicator()
    committer = _committer(replicator)
    committer._round_trip_s = LOCAL_WAIT_S  # a known round trip, long: partial entries wait for it
    first = committer.commit(CommitUnit(transactions=()), 10)
    await replicator.wait_for_entries(1)  # nothing in flight: proposed at once
    later = []
    for _ in range(5):  # each in a loop iteration of its own, which would propose it alone
        later.append(committer.commit(CommitUnit(transactions=()), 10))
        for _ in range(3):
            await asyncio.sleep(0)  # lets the loop run the flush, and a proposal's task start
    assert len(replicator.entries) == 1  # they wait while the first entry is in flight
    replicator.gates[0].set()
    assert (await asyncio.wait_for(first, LOCAL_WAIT_S)).status == "committed"
    await replicator.wait_for_entries(2)
    assert len(replicator.entries[1].units) == 5  # one entry for the five
    replicator.gates[1].set()
    assert [outcome.status for outcome in await asyncio.gather(*later)] == ["committed"] * 5
    await committer.close()


async def test_a_full_entry_is_proposed_while_others_are_in_flight() -> None:
    replicator = GatedReplicator()
    committer = GroupCommitter(replicator, units_max=3, bytes_max=1 << 20, in_flight_max=32,  # type: ignore[arg-type]
                               timeout_s=LOCAL_WAIT_S)
    committer._round_trip_s = LOCAL_WAIT_S
    futures = [committer.commit(CommitUnit(transactions=()), 10)]
    await replicator.wait_for_entries(1)
    futures += [committer.commit(CommitUnit(transactions=()), 10) for _ in range(4)]
    await replicator.wait_for_entries(2)  # three units: a full entry goes at once
    assert [len(entry.units) for entry in replicator.entries] == [1, 3]
    for gate in replicator.gates:
        gate.set()
    await replicator.wait_for_entries(3)  # the last unit, once nothing is in flight
    replicator.gates[2].set()
    assert len(await asyncio.gather(*futures)) == 5
    await committer.close()
