"""The leader balancer's rules (rcq.server.leader.leader_balance) and p0's controller that acts on
them and on the directory's members (rcq.server.leader.partition_controller), against partition
processes played here: one change at a time, members added before they are removed, a move only
past the hold and to a caught-up member, never flapping, and the proof its calls carry."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcq.server.core.directory import Directory, Partition
from rcq.server.leader.leader_balance import LAG_MAX, Move, PartitionLeaders, leaders_per_node, next_move, spread
from rcq.server.leader.partition_controller import PartitionController, PartitionView
from rcq.server.security import cluster_calls

NODES = ["n1", "n2", "n3"]


def led(name: str, leader: str, for_s: float = 120.0, lag: int | None = 0, members: tuple[str, ...] = tuple(NODES),
        preferred: str | None = None) -> PartitionLeaders:
    return PartitionLeaders(name, members, leader, for_s, dict.fromkeys(members, lag), preferred)


# ---------------------------------------------------------------- the rules
def test_a_balanced_cluster_makes_no_move_and_one_apart_is_balanced():
    assert next_move([led("a", "n1"), led("b", "n2"), led("c", "n3")], NODES, 60) is None
    assert next_move([led("a", "n1"), led("b", "n1"), led("c", "n2")], NODES, 60) == Move("a", "n1", "n3")  # 2-1-0
    assert next_move([led("a", "n1"), led("b", "n2")], NODES, 60) is None  # 1, 1, 0


def test_the_largest_gap_moves_first_towards_the_preferred_leader():
    partitions = [led("a", "n1"), led("b", "n1", preferred="n3"), led("c", "n1"), led("d", "n2")]
    assert next_move(partitions, NODES, 60) == Move("b", "n1", "n3")  # 3 against 0, preferred n3


def test_no_move_within_the_hold_of_a_leader_change_nor_to_a_lagging_or_silent_member():
    assert next_move([led("a", "n1", for_s=59), led("b", "n1", for_s=10)], NODES, 60) is None
    assert next_move([led("a", "n1", for_s=None), led("b", "n1", for_s=None)], NODES, 60) is None
    lagging = [led("a", "n1", lag=LAG_MAX + 1), led("b", "n1", lag=LAG_MAX + 1)]
    assert next_move(lagging, NODES, 60) is None
    silent = [led("a", "n1", lag=None), led("b", "n1", lag=None)]
    assert next_move(silent, NODES, 60) is None
    assert next_move([led("a", "n1"), led("b", "n1")], NODES, 60) == Move("a", "n1", "n2")


def test_a_node_that_may_not_lead_is_not_counted_nor_moved_to():
    partitions = [led("a", "n1"), led("b", "n1")]
    assert next_move(partitions, ["n1", "n2"], 60) == Move("a", "n1", "n2")
    assert next_move(partitions, ["n1"], 60) is None
    assert leaders_per_node(partitions, NODES) == {"n1": 2, "n2": 0, "n3": 0} and spread(partitions, NODES) == 2


@given(st.lists(st.sampled_from(NODES), min_size=0, max_size=12))
def test_moves_made_one_after_the_other_end_balanced_without_flapping(leaders: list[str]):
    partitions = [led(f"p{i}", leader) for i, leader in enumerate(leaders)]
    seen: set[tuple[str, ...]] = set()
    for _ in range(len(partitions) + 1):
        state = tuple(p.leader or "" for p in partitions)
        assert state not in seen, "a move undid an earlier one"
        seen.add(state)
        move = next_move(partitions, NODES, 60)
        if move is None:
            break
        partitions = [led(p.name, move.to_node) if p.name == move.partition else p for p in partitions]
    assert next_move(partitions, NODES, 60) is None
    assert spread(partitions, NODES) <= 1


# ---------------------------------------------------------------- the controller
class FakeCalls:
    """Partition processes played in memory: a call changes what the next survey says."""

    def __init__(self, directory: Directory, raft: dict[str, list[str]], leaders: dict[str, str]) -> None:
        self.directory, self.raft, self.leaders = directory, raft, leaders
        self.calls: list[tuple[str, str, str]] = []
        self.answering = set(NODES)
        self.refuse: str | None = None

    async def survey(self, directory: Directory) -> list[PartitionView]:
        views = []
        for p in sorted(directory.partitions.values(), key=lambda p: p.number):
            applied = {m: 10 if m in self.answering else None for m in p.members}
            leader = self.leaders.get(p.name)
            views.append(PartitionView(p.name, p.number, p.members, p.preferred_leader, leader=leader,
                                       leader_url=f"http://{leader}", leader_for_s=120.0,
                                       raft_members=tuple(self.raft[p.name]), applied=applied, commit_index=10))
        return views

    async def transfer(self, view: PartitionView, to_node: str) -> str | None:
        self.calls.append(("transfer", view.name, to_node))
        if self.refuse:
            return self.refuse
        self.leaders[view.name] = to_node
        return None

    async def add_member(self, view: PartitionView, node_id: str) -> str | None:
        self.calls.append(("add", view.name, node_id))
        self.raft[view.name].append(node_id)
        return None

    async def remove_member(self, view: PartitionView, node_id: str) -> str | None:
        self.calls.append(("remove", view.name, node_id))
        self.raft[view.name].remove(node_id)
        return None


def directory_of(partitions: dict[str, tuple[str, ...]]) -> Directory:
    directory = Directory()
    for number, (name, members) in enumerate(sorted(partitions.items()), start=1):
        directory.partitions[name] = Partition(name, number, members, None)
    return directory


def controller_for(calls: FakeCalls, hold_s: float = 60.0) -> PartitionController:
    return PartitionController(lambda: True, lambda: calls.directory, lambda: NODES, calls, hold_s=hold_s)


async def test_members_change_one_at_a_time_added_before_removed_and_a_new_process_waited_for():
    directory = directory_of({"a": ("n1", "n3"), "b": ("n1", "n2")})
    calls = FakeCalls(directory, {"a": ["n1", "n2"], "b": ["n1", "n2"]}, {"a": "n1", "b": "n1"})
    calls.answering = {"n1", "n2"}  # n3's process of a is not up yet
    controller = controller_for(calls)
    assert await controller._one_round(60) == "member" and calls.calls == []
    assert "waiting for n3" in (controller.status.last_problem or "")
    calls.answering = set(NODES)
    assert await controller._one_round(60) == "member"
    assert await controller._one_round(60) == "member"
    assert calls.calls == [("add", "a", "n3"), ("remove", "a", "n2")]
    # the members match: then leaders, 2-0-0, are spread
    assert await controller._one_round(60) == "move" and calls.calls[-1][0] == "transfer"
    assert controller.status.member_changes_total == 2


async def test_a_move_waits_to_be_seen_and_a_refused_one_is_counted():
    directory = directory_of({"a": tuple(NODES), "b": tuple(NODES), "c": tuple(NODES)})
    calls = FakeCalls(directory, {n: list(NODES) for n in "abc"}, {"a": "n1", "b": "n1", "c": "n1"})
    controller = controller_for(calls)
    assert await controller._one_round(60) == "move"
    assert await controller._one_round(60) == "move"
    assert await controller._one_round(60) is None
    assert sorted(leaders_per_node([v.leaders() for v in controller.views], NODES).values()) == [1, 1, 1]
    assert controller.status.moves_total == 2
    calls.leaders = {"a": "n2", "b": "n2", "c": "n2"}
    calls.refuse = "HTTP 503 unavailable"
    assert await controller._one_round(60) == "move"
    assert controller.status.moves_failed_total == 1 and "503" in (controller.status.last_problem or "")


async def test_rebalance_by_hand_ignores_the_hold_and_stops_balanced():
    directory = directory_of({name: tuple(NODES) for name in "abcdef"})
    calls = FakeCalls(directory, {n: list(NODES) for n in "abcdef"}, dict.fromkeys("abcdef", "n2"))
    controller = controller_for(calls, hold_s=10_000)
    assert await controller._one_round(controller.hold_s) is None  # held
    answer = await controller.rebalance(timeout_s=10)
    assert len(answer["moves"]) == 4 and sorted(answer["leaders_per_node"].values()) == [2, 2, 2], answer
    again = await controller.rebalance(timeout_s=10)
    assert again["moves"] == []


async def test_without_balance_members_still_change_and_leaders_move_by_hand_only():
    directory = directory_of({"a": ("n1", "n3"), "b": tuple(NODES), "c": tuple(NODES)})
    calls = FakeCalls(directory, {"a": ["n1", "n2", "n3"], "b": list(NODES), "c": list(NODES)},
                      dict.fromkeys("abc", "n1"))
    controller = PartitionController(lambda: True, lambda: calls.directory, lambda: NODES, calls, balance=False)
    assert await controller._one_round(0) == "member" and calls.calls == [("remove", "a", "n2")]
    assert await controller._one_round(0) is None  # 3-0-0, but balance_leaders is false
    answer = await controller.rebalance(timeout_s=10)
    assert len(answer["moves"]) == 2 and sorted(answer["leaders_per_node"].values()) == [1, 1, 1], answer


# ---------------------------------------------------------------- the proof
@pytest.mark.parametrize("change", ["secret", "method", "path", "body", "late", "early", "garbled"])
def test_a_cluster_call_proof_holds_only_for_its_call_its_secret_and_its_window(change: str):
    secret, now = "s" * 32, time.time()
    proof = cluster_calls.sign(secret, "POST", "/v1/cluster/leadership", b'{"node_id": "n2"}', now)
    assert cluster_calls.verify([secret], "POST", "/v1/cluster/leadership", b'{"node_id": "n2"}', proof, now)
    assert cluster_calls.verify(["o" * 32, secret], "POST", "/v1/cluster/leadership", b'{"node_id": "n2"}',
                                proof, now)  # a rotation: any current or previous secret
    call = {"secrets": [secret], "method": "POST", "path": "/v1/cluster/leadership", "body": b'{"node_id": "n2"}',
            "presented": proof, "now": now}
    call.update({"secret": {"secrets": ["x" * 32]}, "method": {"method": "DELETE"},
                 "path": {"path": "/v1/cluster/members/n2"}, "body": {"body": b'{"node_id": "n3"}'},
                 "late": {"now": now + cluster_calls.CALL_WINDOW_S + 1},
                 "early": {"now": now - cluster_calls.CALL_WINDOW_S - 1},
                 "garbled": {"presented": proof.replace(".", "")}}[change])
    assert not cluster_calls.verify(call["secrets"], call["method"], call["path"], call["body"], call["presented"],
                                    call["now"])


def test_a_proof_covers_only_the_members_leadership_and_storage_budget_routes():
    assert all(cluster_calls.covers(p) for p in ("/v1/cluster/leadership", "/v1/cluster/members",
                                                 "/v1/cluster/members/n2", "/v1/cluster/storage-budget"))
    assert not any(cluster_calls.covers(p) for p in ("/v1/queues/q", "/v1/commit", "/v1/cluster/tokens",
                                                     "/v1/cluster/backup", "/v1/cluster/membersx",
                                                     "/v1/cluster/storage"))
