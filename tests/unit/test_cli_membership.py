"""``rcq cluster members|add-node|remove-node|transfer-leader`` against recording fake nodes: what each
action puts on the wire, what it prints, and a clear two-line message (the server's, then what to do)
with exit status 2 for every error of the membership API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rcq.cli import main
from rcq.errors import (
    CommitOutcomeUnknown,
    Forbidden,
    InvalidRequest,
    MemberExists,
    MemberNotFound,
    MembershipConflict,
    NodeUnreachable,
    NotLeader,
    RcqError,
    WouldLoseQuorum,
)
from tests.helpers.cli import rcq
from tests.helpers.fakes import ADD_BODY, ADDED, LEADERSHIP, MEMBERS, N1, N2, REMOVED, TRANSFERRED, FakeNode, serving_fake

ADD = ["cluster", "add-node", "--node-id", "n4", "--raft-address", "127.0.0.1:10004", "--node-url",
       "http://127.0.0.1:7004"]


async def test_members_prints_a_table_or_json(fake: FakeNode, capsys):
    unknown = {"node_id": "n3", "raft_address": "127.0.0.1:10003", "url": "http://127.0.0.1:7003", "role": "unknown",
               "self": False, "connected": None, "match_index": None}
    fake.answer("GET", MEMBERS, {"leader_id": "n1", "members": [N1, N2, unknown]})
    code, out, err = await rcq(capsys, "cluster", "members", "--url", fake.url)
    assert (code, err) == (0, "") and out.splitlines() == [
        "NODE  ROLE      RAFT_ADDRESS     URL                    CONNECTED  MATCH_INDEX",
        "n1    leader    127.0.0.1:10001  http://127.0.0.1:7001  yes        42",
        "n2    follower  127.0.0.1:10002  http://127.0.0.1:7002  yes        41",
        "n3    unknown   127.0.0.1:10003  http://127.0.0.1:7003  -          -",
    ]
    code, out, _ = await rcq(capsys, "cluster", "members", "--json", "--url", fake.url)
    assert code == 0 and json.loads(out) == [N1, N2, unknown]
    assert fake.requests == [("GET", MEMBERS, None)] * 2


def as_a_follower_sees_them(leader_url: str) -> dict[str, Any]:
    """The members answer of follower n2: the leader is n1 at ``leader_url``; no match index is known."""
    return {"leader_id": "n1", "members": [
        {**N1, "url": leader_url, "self": False, "match_index": None},
        {**N2, "self": True, "connected": None, "match_index": None}]}


async def test_members_asked_of_a_follower_come_from_the_leader_it_names(fake: FakeNode, capsys):
    async with serving_fake() as leader:
        fake.answer("GET", MEMBERS, as_a_follower_sees_them(leader.url))
        leaders_view = {"leader_id": "n1", "members": [{**N1, "url": leader.url}, N2]}
        leader.answer("GET", MEMBERS, leaders_view)
        code, out, err = await rcq(capsys, "cluster", "members", "--url", fake.url)
        assert (code, err) == (0, "")
        assert [line.split()[-1] for line in out.splitlines()] == ["MATCH_INDEX", "42", "41"]
        code, out, err = await rcq(capsys, "cluster", "members", "--json", "--url", fake.url)
        assert (code, err) == (0, "") and json.loads(out) == leaders_view["members"]
        assert fake.requests == leader.requests == [("GET", MEMBERS, None)] * 2


@pytest.mark.parametrize("leader_known", [True, False], ids=["leader_down", "no_leader"])
async def test_members_of_a_follower_alone_say_that_only_the_leader_knows_match_indexes(
        fake: FakeNode, capsys, leader_known: bool):
    async with serving_fake() as gone:
        leader_url = gone.url  # nothing listens there once the block ends
    answer = as_a_follower_sees_them(leader_url)
    if not leader_known:
        answer = {"leader_id": None, "members": [{**member, "role": "unknown"} for member in answer["members"]]}
    fake.answer("GET", MEMBERS, answer)
    code, out, err = await rcq(capsys, "cluster", "members", "--url", fake.url)
    assert code == 0 and [line.split()[-1] for line in out.splitlines()] == ["MATCH_INDEX", "-", "-"]
    note = err.splitlines()
    assert len(note) == 1 and note[0].startswith("rcq: match indexes are known only to the leader: n2 answered")
    if leader_known:
        assert "the leader did not (unavailable: cannot connect to" in note[0]
        assert note[0].endswith(f"; ask it with --url {leader_url}")
    else:
        assert note[0].endswith("n2 answered and knows no leader now; ask it with --url LEADER_URL (rcq status "
                                "names the leader)")
    code, out, json_err = await rcq(capsys, "cluster", "members", "--json", "--url", fake.url)
    assert code == 0 and json.loads(out) == answer["members"] and json_err.splitlines() == note


async def test_add_node_sends_the_specified_body_and_says_whether_the_node_caught_up(fake: FakeNode, capsys):
    fake.answer("POST", MEMBERS, ADDED)
    fake.answer("POST", MEMBERS, {**ADDED, "caught_up": False})
    code, out, err = await rcq(capsys, *ADD, "--url", fake.url)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "added node n4 (127.0.0.1:10004, http://127.0.0.1:7004): it has caught up"
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["NODE", "n1", "n2", "n4"]
    code, out, _ = await rcq(capsys, *ADD, "--url", fake.url, "--catch-up-timeout-s", "2.5")
    assert code == 0 and out.splitlines()[0] == ("added node n4 (127.0.0.1:10004, http://127.0.0.1:7004): it has not "
                                                 "caught up within 2.5 s and keeps catching up")
    code, out, _ = await rcq(capsys, *ADD, "--json", "--url", fake.url)
    assert code == 0 and json.loads(out) == {**ADDED, "caught_up": False}
    assert fake.bodies("POST", MEMBERS) == [ADD_BODY, {**ADD_BODY, "catch_up_timeout_s": 2.5}, ADD_BODY]


async def test_remove_node_and_transfer_leader(fake: FakeNode, capsys):
    fake.answer("DELETE", f"{MEMBERS}/n2", REMOVED)
    code, out, _ = await rcq(capsys, "cluster", "remove-node", "n2", "--url", fake.url)
    assert code == 0 and out.splitlines()[0] == ("removed node n2 (127.0.0.1:10002, http://127.0.0.1:7002); "
                                                 "1 member(s) left: stop it now")
    code, out, _ = await rcq(capsys, "cluster", "remove-node", "--json", "n2", "--url", fake.url)
    assert code == 0 and json.loads(out) == REMOVED
    fake.answer("POST", LEADERSHIP, TRANSFERRED)
    assert await rcq(capsys, "cluster", "transfer-leader", "n2", "--url", fake.url) == (
        0, "leadership moved from n1 to n2\n", "")
    code, out, _ = await rcq(capsys, "cluster", "transfer-leader", "--json", "--url", fake.url)
    assert code == 0 and json.loads(out) == TRANSFERRED
    assert fake.requests == [("DELETE", f"{MEMBERS}/n2", None)] * 2 + [
        ("POST", LEADERSHIP, {"node_id": "n2"}), ("POST", LEADERSHIP, {"node_id": None})]


async def test_a_change_sent_to_a_follower_reaches_the_leader(fake: FakeNode, capsys):
    async with serving_fake() as leader:
        fake.answer("DELETE", f"{MEMBERS}/n1", NotLeader("handing over", leader_url=leader.url).to_body(), status=307)
        leader.answer("DELETE", f"{MEMBERS}/n1", {"removed": N1, "members": [N2]})
        code, out, _ = await rcq(capsys, "cluster", "remove-node", "n1", "--url", fake.url)
        assert code == 0 and out.startswith("removed node n1 ")
        assert len(leader.requests) == len(fake.requests) == 1


REMOVE = ["cluster", "remove-node", "n2"]
TRANSFER = ["cluster", "transfer-leader", "n2"]


@pytest.mark.parametrize(("argv", "method", "path", "error", "status", "hint"), [
    (ADD, "POST", MEMBERS, MemberExists("n4 is a member"), 409,
     "node n4 or the Raft address 127.0.0.1:10004 is already a member: see rcq cluster members"),
    (ADD, "POST", MEMBERS, WouldLoseQuorum("2 of 4 reachable"), 409,
     "refused, nothing changed: afterwards fewer members would be reachable than a majority; rcq cluster members "
     "shows which are not connected: bring them back first"),
    (ADD, "POST", MEMBERS, NodeUnreachable("connection refused"), 422,
     "the leader cannot reach http://127.0.0.1:7004/healthz as node n4: start the node first (rcq serve with this "
     "node id and Raft address, and the current members as --peer) and check that the leader can reach that URL"),
    (ADD, "POST", MEMBERS, MembershipConflict("a change is pending"), 409,
     "another membership change is still being committed, or the new leader has not yet committed an entry of its "
     "term: try again in a moment"),
    (ADD, "POST", MEMBERS, InvalidRequest("node_id: bad characters"), 400, None),
    (ADD, "POST", MEMBERS, CommitOutcomeUnknown("the entry may yet commit"), 504,
     "the change may or may not have been applied: see rcq cluster members before trying again"),
    (ADD, "POST", MEMBERS, Forbidden("admin only"), 403,
     "rcq cluster add-node needs an admin token (rcq token create --admin)"),
    (REMOVE, "DELETE", f"{MEMBERS}/n2", MemberNotFound("no n2"), 404,
     "no member has the node id n2: see rcq cluster members"),
    (REMOVE, "DELETE", f"{MEMBERS}/n2", WouldLoseQuorum("1 of 2 reachable"), 409,
     "refused, nothing changed: afterwards fewer members would be reachable than a majority; rcq cluster members "
     "shows which are not connected: bring them back first"),
    (REMOVE, "DELETE", f"{MEMBERS}/n2", MembershipConflict("a change is pending"), 409,
     "another membership change is still being committed, or the new leader has not yet committed an entry of its "
     "term: try again in a moment"),
    (TRANSFER, "POST", LEADERSHIP, MemberNotFound("no n2"), 404,
     "no member has the node id n2: see rcq cluster members"),
    (TRANSFER, "POST", LEADERSHIP, MembershipConflict("n2 is behind"), 409,
     "another membership change is still being committed, or the new leader has not yet committed an entry of its "
     "term, or the target has not caught up: try again in a moment"),
    (["cluster", "members"], "GET", MEMBERS, Forbidden("admin only"), 403,
     "rcq cluster members needs an admin token (rcq token create --admin)"),
], ids=lambda value: value.code if isinstance(value, RcqError) else None)
async def test_every_error_is_the_servers_message_then_what_to_do(
        fake: FakeNode, capsys, argv: list[str], method: str, path: str, error: RcqError, status: int,
        hint: str | None):
    fake.answer(method, path, error.to_body(), status=status)
    code, out, err = await rcq(capsys, *argv, "--url", fake.url, "--retry-timeout-s", "0.2")
    lines = err.splitlines()
    assert (code, out) == (2, "")
    assert lines[0].startswith(f"rcq: {error.code}: ") and error.message in lines[0]
    assert lines[1:] == ([f"rcq: {hint}"] if hint is not None else [])
    # not re-sent unless the server says it was not applied (membership_conflict)
    assert len(fake.bodies(method, path)) >= 2 if isinstance(error, MembershipConflict) else len(fake.requests) == 1


async def test_bad_flags_are_clear_errors_and_send_nothing(fake: FakeNode, capsys):
    code, out, err = await rcq(capsys, *ADD, "--url", fake.url, "--catch-up-timeout-s", "601")
    assert (code, out) == (2, "") and err == (
        "rcq: invalid_request: catch_up_timeout_s must be a number of seconds from 0 to 600, not 601.0\n")
    code, _, err = await rcq(capsys, "cluster", "add-node", "--node-id", "n4", "--raft-address", "n4", "--node-url",
                             "http://n4:7004", "--url", fake.url)
    assert code == 2 and err == "rcq: invalid_request: raft_address must be host:port, not 'n4'\n"
    for argv in (ADD[:-2], [*ADD, "--catch-up-timeout-s", "nan"], ["cluster", "remove-node"], ["cluster"]):
        with pytest.raises(SystemExit) as raised:
            main([*argv, "--url", fake.url])
        assert raised.value.code == 2
    assert "the following arguments are required: --node-url" in capsys.readouterr().err
    assert fake.requests == []
