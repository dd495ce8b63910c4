"""A partition's share of its node's memory budget, end to end in one process: the leader's
admission takes the allowance it is given and stamps it on its entries (rcq.server.leader.admission),
a partition process takes it over HTTP and reports it (``PUT /v1/cluster/storage-budget``,
``/readyz``, ``/v1/cluster/storage``), and p0's controller gives it out by the rules of
rcq.server.leader.storage_sharing: lowerings first, raises only once they are taken, to every
member, and p0's own here."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from rcq.errors import StorageFull
from rcq.server.core.commands import CommitBatch, Limits, encode
from rcq.server.core.directory import Directory, Partition
from rcq.server.core.state_machine import ITEM_OVERHEAD_BYTES
from rcq.server.leader.partition_controller import PartitionController, PartitionView
from rcq.server.leader.storage_budget import MemberStorage, change_threshold, static_share
from rcq.server.leader.storage_sharing import StorageSharing
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import call, enqueue_committed, make_config, running_node, url_of

MIB = 1 << 20
NODES = ["n1", "n2", "n3"]


async def serving(replicator: InMemoryReplicator, **overrides: object) -> TransactionManager:
    manager = TransactionManager(make_config(**overrides), replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    return manager


# ---------------------------------------------------------------- the leader's admission
async def test_a_partition_process_starts_with_its_static_share_and_stamps_the_allowance_it_is_given():
    replicator = InMemoryReplicator()
    manager = await serving(replicator, storage_bytes_max=4 * MIB, storage_share_partitions=2)
    try:
        assert (manager.storage_bytes_max, manager.node_storage_bytes_max) == (2 * MIB, 4 * MIB)
        item = b"x" * 1000
        fits = 2 * MIB // (len(item) + ITEM_OVERHEAD_BYTES)
        await enqueue_committed(manager, "q", *[item] * fits)
        with pytest.raises(StorageFull) as refused:
            await enqueue_committed(manager, "q", item)
        message = str(refused.value)
        assert f"share of the node's budget is {2 * MIB} of {4 * MIB}" in message, message
        assert refused.value.details == {"storage_bytes_max": 2 * MIB, "node_storage_bytes_max": 4 * MIB}
        assert manager.set_storage_budget(3 * MIB) == 3 * MIB
        await enqueue_committed(manager, "q", item)  # room again: the entry carries the new allowance
        stamped = [c.limits.storage_bytes_max for c in replicator.submitted if isinstance(c, CommitBatch) and c.limits]
        assert stamped[0] == 2 * MIB and stamped[-1] == 3 * MIB
        assert manager.set_storage_budget(64 * MIB) == 4 * MIB  # never above the node's budget
    finally:
        await manager.stop()


async def test_a_node_alone_keeps_its_whole_budget_and_the_message_it_always_gave():
    manager = await serving(InMemoryReplicator(), storage_bytes_max=MIB)
    try:
        assert manager.storage_bytes_max == manager.node_storage_bytes_max == MIB
        with pytest.raises(StorageFull, match=f"the node's budget is {MIB}$"):
            await enqueue_committed(manager, "q", *[b""] * (MIB // ITEM_OVERHEAD_BYTES + 1))
    finally:
        await manager.stop()


async def test_a_follower_of_p0_shows_the_allowance_its_leader_stamps_and_hooks_run_before_serving():
    replicator = InMemoryReplicator()
    manager = await serving(replicator, storage_bytes_max=8 * MIB)
    seen_serving: list[bool] = []
    manager.on_serving.append(lambda: seen_serving.append(manager.serving))
    try:
        replicator.depose()
        stamped = Limits(storage_bytes_max=3 * MIB, queue_items_max=10, queue_bytes_max=MIB)
        replicator.apply_raw(encode(CommitBatch(term=replicator.term, now_ms=1, units=(), limits=stamped)))
        assert manager.storage_bytes_max == 3 * MIB
        replicator.elect()
        await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving again")
        assert seen_serving == [False]  # run once, before the first verb could be let in
    finally:
        await manager.stop()


# ---------------------------------------------------------------- over HTTP
async def test_a_partition_process_takes_its_allowance_over_http_and_reports_it(tmp_path: Path):
    async with running_node(tmp_path, storage_bytes_max=8 * MIB, storage_share_partitions=4,
                            partition_name="p1") as node, aiohttp.ClientSession(url_of(node)) as session:
        _, ready = await call(session, "GET", "/readyz")
        assert (ready["storage_bytes"], ready["storage_bytes_max"], ready["node_storage_bytes_max"]) == (
            0, 2 * MIB, 8 * MIB)
        status, body = await call(session, "PUT", "/v1/cluster/storage-budget", json={"storage_bytes_max": 5 * MIB})
        assert status == 200 and body["storage_bytes_max"] == 5 * MIB and body["partition"] == "p1", body
        _, storage = await call(session, "GET", "/v1/cluster/storage")
        assert (storage["storage_bytes_max"], storage["node_storage_bytes_max"]) == (5 * MIB, 8 * MIB)
        status, body = await call(session, "PUT", "/v1/cluster/storage-budget", json={"storage_bytes_max": 0})
        assert status == 400 and body["error"]["code"] == "invalid_request"


async def test_a_nodes_own_port_refuses_an_allowance_p0s_leader_sets_itself(tmp_path: Path):
    async with running_node(tmp_path) as node, aiohttp.ClientSession(url_of(node)) as session:
        status, body = await call(session, "PUT", "/v1/cluster/storage-budget", json={"storage_bytes_max": MIB})
        assert status == 400 and "p0's leader" in body["error"]["message"], body


# ---------------------------------------------------------------- p0's controller
class FakeP0:
    """p0 in this process: holds ``used``, stamps ``allowance``."""

    def __init__(self, budget_bytes: int, used: int = 0) -> None:
        self.node_id, self.budget_bytes = "n1", budget_bytes
        self.used, self.allowance = used, budget_bytes

    def used_bytes(self) -> int:
        return self.used

    def allowance_bytes(self) -> int:
        return self.allowance

    def set_allowance(self, storage_bytes_max: int) -> int:
        self.allowance = min(storage_bytes_max, self.budget_bytes)
        return self.allowance


class FakeProcesses:
    """Partition processes played in memory: each member's figures, and the allowances it takes."""

    def __init__(self, budget_bytes: int, partitions: dict[str, tuple[str, ...]]) -> None:
        self.budget_bytes = budget_bytes
        self.directory = Directory()
        for number, (name, members) in enumerate(sorted(partitions.items()), start=1):
            self.directory.partitions[name] = Partition(name, number, members, None)
        share = static_share(budget_bytes, 1 + max(self.directory.hosted().values(), default=0))
        self.allowance = {(n, m): share for n, ms in partitions.items() for m in ms}
        self.used: dict[str, int] = dict.fromkeys(partitions, 0)
        self.calls: list[tuple[str, str, int]] = []
        self.refusing: set[tuple[str, str]] = set()  # (partition, member) that do not take a call
        self.silent: set[str] = set()  # members whose processes do not answer

    async def survey(self, directory: Directory) -> list[PartitionView]:
        views = []
        for p in sorted(directory.partitions.values(), key=lambda p: p.number):
            answering = [m for m in p.members if m not in self.silent]
            views.append(PartitionView(
                p.name, p.number, p.members, None, leader=p.members[0], leader_url=f"http://{p.members[0]}",
                leader_for_s=120.0, raft_members=p.members, applied=dict.fromkeys(p.members, 10), commit_index=10,
                urls={m: f"http://{m}/{p.name}" for m in p.members},
                storage={m: MemberStorage(self.used[p.name], self.allowance[p.name, m], self.budget_bytes)
                         for m in answering}))
        return views

    async def set_storage_budget(self, view: PartitionView, node_id: str, storage_bytes_max: int) -> str | None:
        self.calls.append((view.name, node_id, storage_bytes_max))
        if (view.name, node_id) in self.refusing:
            return "it did not answer within 5 s"
        self.allowance[view.name, node_id] = storage_bytes_max
        return None

    async def transfer(self, view: PartitionView, to_node: str | None) -> str | None:
        raise AssertionError("no move is expected")

    async def add_member(self, view: PartitionView, node_id: str) -> str | None:
        raise AssertionError("no member change is expected")

    async def remove_member(self, view: PartitionView, node_id: str) -> str | None:
        raise AssertionError("no member change is expected")

    def held(self, name: str) -> set[int]:
        return {value for (n, _), value in self.allowance.items() if n == name}


def controller_of(processes: FakeProcesses, p0: FakeP0) -> tuple[PartitionController, StorageSharing]:
    sharing = StorageSharing(p0, processes)
    controller = PartitionController(lambda: True, lambda: processes.directory, lambda: NODES, processes,
                                     balance=False, sharing=sharing)
    return controller, sharing


async def test_a_filling_partition_is_given_more_at_every_member_and_p0_less():
    budget = 8 * MIB
    processes, p0 = FakeProcesses(budget, {"hot": tuple(NODES)}), FakeP0(budget)
    controller, sharing = controller_of(processes, p0)
    sharing.began_serving(processes.directory)
    assert p0.allowance == budget // 2  # the static share until the first round
    await controller._one_round(controller.hold_s)
    assert processes.calls == [] and p0.allowance == budget // 2  # nothing held yet: the even split stands
    seen = []
    for _ in range(10):
        processes.used["hot"] = max(processes.held("hot"))  # it filled what it was allowed
        processes.calls.clear()
        await controller._one_round(controller.hold_s)
        if not processes.calls:
            break  # within a threshold of all it can get
        (allowance,) = processes.held("hot")  # every member holds the same, followers too
        assert {m for _, m, _ in processes.calls} == set(NODES)
        assert allowance + p0.allowance <= budget
        seen.append(allowance)
    assert len(seen) >= 3 and seen == sorted(seen) and seen[0] > budget // 2, seen
    assert budget - MIB - seen[-1] <= 2 * change_threshold(budget)  # all but p0's floor, nearly
    assert p0.allowance < budget // 2


async def test_no_raise_is_given_in_a_round_where_a_lowering_was_not_taken():
    budget = 16 * MIB
    processes, p0 = FakeProcesses(budget, {"cold": ("n1", "n2"), "hot": ("n1", "n2")}), FakeP0(budget)
    controller, sharing = controller_of(processes, p0)
    sharing.began_serving(processes.directory)
    processes.used["hot"] = max(processes.held("hot"))
    processes.refusing = {("cold", "n2")}
    await controller._one_round(controller.hold_s)
    lowered = {(n, m) for n, m, _ in processes.calls if n == "cold"}
    assert lowered == {("cold", "n1"), ("cold", "n2")}
    assert not any(n == "hot" for n, _, _ in processes.calls), processes.calls
    held_then = max(processes.held("hot"))
    processes.refusing = set()
    await controller._one_round(controller.hold_s)  # taken now: the raise follows in the same round
    assert max(processes.held("hot")) > held_then
    for node in ("n1", "n2"):
        in_force = [v for (n, m), v in processes.allowance.items() if m == node]
        assert sum(in_force) + p0.allowance <= budget


async def test_a_member_that_restarted_with_less_is_given_its_partitions_allowance_and_a_silent_one_nothing():
    budget = 8 * MIB
    processes, p0 = FakeProcesses(budget, {"hot": tuple(NODES)}), FakeP0(budget)
    controller, sharing = controller_of(processes, p0)
    sharing.began_serving(processes.directory)
    processes.used["hot"] = max(processes.held("hot"))
    await controller._one_round(controller.hold_s)
    (allowance,) = processes.held("hot")
    processes.allowance["hot", "n3"] = static_share(budget, 4)  # restarted, with a smaller static share
    processes.silent = {"n2"}
    processes.calls.clear()
    await controller._one_round(controller.hold_s)
    assert ("hot", "n3", allowance) in processes.calls
    assert not any(m == "n2" for _, m, _ in processes.calls)


async def test_p0_alone_keeps_its_whole_budget_and_gets_it_back_once_the_partitions_are_gone():
    budget = 8 * MIB
    processes, p0 = FakeProcesses(budget, {"hot": tuple(NODES)}), FakeP0(budget)
    controller, sharing = controller_of(processes, p0)
    p0.allowance = 2 * MIB
    processes.directory = Directory()
    sharing.began_serving(processes.directory)
    assert p0.allowance == 2 * MIB  # never raised before a round
    await controller._one_round(controller.hold_s)
    assert p0.allowance == budget


def test_an_allowance_moves_only_by_more_than_its_threshold():
    assert change_threshold(8 * MIB) == 64 << 10 and change_threshold(1 << 30) == MIB
