"""Membership changes above Raft (docs/membership.md): the directory entry (commands, state machine,
snapshots), the configuration merged with it, and the leader's steps and checks over the
in-memory replicator (real clusters: tests/integration/test_membership.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rcq.errors import (
    InvalidRequest,
    MemberExists,
    MemberNotFound,
    MembershipConflict,
    NodeUnreachable,
    NotLeader,
    NotReady,
    WouldLoseQuorum,
)
from rcq.server.config import PeerConfig
from rcq.server.core.commands import (
    COMMAND_VERSION,
    KIND_MEMBER,
    ApplyFailed,
    Barrier,
    MemberRecord,
    MemberRecordResult,
    decode,
    encode,
)
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.leader.membership import Membership
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import make_config

SELF = "memory:0"  # the in-memory replicator's own Raft address


def record(node_id: str, raft_address: str, url: str, term: int = 1) -> MemberRecord:
    return MemberRecord(term=term, now_ms=1, action="record", node_id=node_id, raft_address=raft_address,
                        http_url=url)


# ------------------------------------------------------------------ the entry
def test_a_member_record_round_trips_through_its_encoding() -> None:
    for command in (record("n4", "10.0.0.4:7000", "http://10.0.0.4:8000"),
                    MemberRecord(term=3, now_ms=9, action="forget", node_id="n2")):
        assert decode(encode(command)) == command


@pytest.mark.parametrize("raw", [
    (COMMAND_VERSION, KIND_MEMBER, 1, 1, "promote", "n4", "a:1", "http://a"),  # unknown action
    (COMMAND_VERSION, KIND_MEMBER, 1, 1, "record", 4, "a:1", "http://a"),  # node id not str
    (COMMAND_VERSION, KIND_MEMBER, 1, 1, "record", "n4", None, "http://a"),  # address not str
    (COMMAND_VERSION, KIND_MEMBER, 1, 1, "record", "n4", "a:1"),  # a field short
    (COMMAND_VERSION, KIND_MEMBER, "1", 1, "record", "n4", "a:1", "http://a"),  # term not int
])
def test_a_malformed_member_record_changes_nothing(raw: tuple[Any, ...]) -> None:
    sm = QueueStateMachine()
    assert isinstance(sm.apply(raw, 1), ApplyFailed)
    assert sm.member_directory() == {} and "members" not in sm.snapshot_meta()


def test_the_directory_records_replaces_and_forgets() -> None:
    sm = QueueStateMachine()
    empty_digest = sm.digest()
    assert sm.apply(encode(record("n4", "h4:7000", "http://h4")), 1) == MemberRecordResult("done", "n4")
    assert sm.member_directory() == {"n4": ("h4:7000", "http://h4")}
    sm.apply(encode(record("n4", "h4:7001", "http://h4b")), 2)  # the same node moved
    sm.apply(encode(record("n5", "h4:7001", "http://h5")), 3)  # its address given to another node
    assert sm.member_directory() == {"n5": ("h4:7001", "http://h5")}
    sm.apply(encode(MemberRecord(term=1, now_ms=1, action="forget", node_id="n5")), 4)
    assert sm.member_directory() == {}
    assert sm.digest() != empty_digest  # the index moved; the empty directory adds nothing to the meta
    assert "members" not in sm.snapshot_meta()


def test_a_deposed_leaders_record_is_fenced() -> None:
    sm = QueueStateMachine()
    sm.apply(encode(Barrier(term=5, now_ms=1)), 1)
    assert sm.apply(encode(record("n4", "h:1", "http://h", term=4)), 2) == MemberRecordResult(
        "rejected", "n4", reason="stale_leader")
    assert sm.member_directory() == {}


def test_the_directory_is_in_snapshots_and_the_digest() -> None:
    sm = QueueStateMachine()
    sm.apply(encode(record("n4", "h4:7000", "http://h4")), 1)
    copy = QueueStateMachine()
    copy.restore(sm.snapshot_meta(), list(sm.snapshot_items()))
    assert copy.member_directory() == sm.member_directory() and copy.digest() == sm.digest()
    other = QueueStateMachine()
    other.apply(encode(record("n4", "h4:7000", "http://elsewhere")), 1)
    assert other.digest() != sm.digest()


# ------------------------------------------------------------ configuration + directory
AT_SELF: dict[str, Any] = dict(raft_address=SELF, advertise_url="http://n1")  # node n1 is the replicator's own


def test_recorded_members_win_over_the_configuration() -> None:
    config = make_config(**AT_SELF, peers=[{"node_id": "n2", "raft_address": "h2:1", "http_url": "http://n2"},
                                          {"node_id": "n3", "raft_address": "h3:1", "http_url": "http://n3"}])
    directory = config.directory({"n3": ("h3b:1", "http://n3b"), "n4": ("h4:1", "http://n4"),
                                  "n1": ("elsewhere:1", "http://not-me")})
    assert {address: (p.node_id, p.http_url) for address, p in directory.items()} == {
        SELF: ("n1", "http://n1"), "h2:1": ("n2", "http://n2"), "h3b:1": ("n3", "http://n3b"),
        "h4:1": ("n4", "http://n4")}
    assert isinstance(directory["h4:1"], PeerConfig)


@pytest.mark.parametrize("dial", [{"h2:1": "not an address"}, {"h2:1": "proxy:port"}])
def test_a_bad_dial_address_is_refused(dial: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="raft_dial_addresses"):
        make_config(**AT_SELF, raft_dial_addresses=dial)


# ------------------------------------------------------------------ the leader's steps
class Probe:
    def __init__(self) -> None:
        self.answers: dict[str, str | None] = {}
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, url: str, node_id: str) -> str | None:
        self.asked.append((url, node_id))
        return self.answers.get(url)


@pytest.fixture
async def setup() -> Any:
    replicator = InMemoryReplicator()
    replicator.other_members = ["h2:1", "h3:1"]
    config = make_config(**AT_SELF, peers=[{"node_id": "n2", "raft_address": "h2:1", "http_url": "http://n2"},
                                          {"node_id": "n3", "raft_address": "h3:1", "http_url": "http://n3"}])
    manager = TransactionManager(config, replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    probe = Probe()
    yield Membership(config, manager, replicator, probe), replicator, probe
    await manager.stop()


async def test_adding_records_the_directory_entry_then_the_vote(setup: Any) -> None:
    membership, replicator, probe = setup
    answer = await membership.add("n4", "h4:1", "http://n4", catch_up_timeout_s=1)
    assert probe.asked == [("http://n4", "n4")]
    kinds = [type(c).__name__ for c in replicator.submitted]
    assert kinds[-1] == "MemberRecord" and replicator.other_members == ["h2:1", "h3:1", "h4:1"]
    assert answer["caught_up"] is True
    assert answer["added"]["node_id"] == "n4" and answer["added"]["url"] == "http://n4"
    assert {m["node_id"] for m in answer["members"]} == {"n1", "n2", "n3", "n4"}
    assert membership.leader_id() == "n1"


@pytest.mark.parametrize("node_id, address, url, error", [
    ("n2", "h9:1", "http://n9", MemberExists),  # an id in use
    ("n9", "h3:1", "http://n9", MemberExists),  # an address in use
    ("n 9", "h9:1", "http://n9", InvalidRequest),
    ("n9", "h9", "http://n9", InvalidRequest),
    ("n9", "h9:1", "ftp://n9", InvalidRequest),
    ("n9", "h9:1", "http://unreachable", NodeUnreachable),
])
async def test_a_refused_add_proposes_nothing(setup: Any, node_id: str, address: str, url: str,
                                              error: type[Exception]) -> None:
    membership, replicator, probe = setup
    probe.answers["http://unreachable"] = "connection refused"
    submitted = len(replicator.submitted)
    with pytest.raises(error):
        await membership.add(node_id, address, url, catch_up_timeout_s=1)
    assert len(replicator.submitted) == submitted and replicator.other_members == ["h2:1", "h3:1"]


async def test_a_change_that_would_leave_no_reachable_majority_is_refused(setup: Any) -> None:
    membership, replicator, _probe = setup
    replicator.unreachable = {"h3:1"}
    with pytest.raises(WouldLoseQuorum) as refused:  # n1 alone of n1, n3
        await membership.remove("n2")
    assert refused.value.details["unreachable"] == ["n3"]
    await membership.add("n4", "h4:1", "http://n4", catch_up_timeout_s=0)  # 3 of 4 reachable: fine
    replicator.unreachable = {"h2:1", "h3:1", "h4:1"}
    with pytest.raises(WouldLoseQuorum):  # n1 and n5 are not 3 of 5
        await membership.add("n5", "h5:1", "http://n5", catch_up_timeout_s=0)


async def test_removing_a_member_takes_the_vote_then_forgets_its_entry(setup: Any) -> None:
    membership, replicator, _probe = setup
    await membership.add("n4", "h4:1", "http://n4", catch_up_timeout_s=0)
    answer = await membership.remove("n4")
    assert answer["removed"]["node_id"] == "n4" and replicator.other_members == ["h2:1", "h3:1"]
    last = replicator.submitted[-1]
    assert isinstance(last, MemberRecord) and last.action == "forget" and last.node_id == "n4"
    with pytest.raises(MemberNotFound):
        await membership.remove("n4")


async def test_removing_the_leader_hands_leadership_over_and_redirects(setup: Any) -> None:
    membership, replicator, _probe = setup
    with pytest.raises(NotLeader):
        await membership.remove("n1")
    assert replicator.transfers == [None] and not replicator.is_leader()
    assert replicator.other_members == ["h2:1", "h3:1"]  # nothing removed here: the new leader does it


async def test_one_change_at_a_time(setup: Any) -> None:
    membership, replicator, _probe = setup
    replicator.refuse_membership_changes = True  # Raft's own refusal (H16)
    with pytest.raises(MembershipConflict):
        await membership.remove("n2")
    replicator.refuse_membership_changes = False
    async with membership._changing:  # a change in progress on this leader
        with pytest.raises(MembershipConflict):
            await membership.remove("n2")


async def test_only_a_serving_leader_changes_membership(setup: Any) -> None:
    membership, replicator, _probe = setup
    replicator.elect()  # a new term whose barrier has not been applied yet
    with pytest.raises((NotReady, MembershipConflict)):
        membership._exclusive()
