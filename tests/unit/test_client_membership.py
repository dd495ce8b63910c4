"""The client side of cluster membership changes against recording fake nodes: the exact requests of
``cluster_members``, ``add_node``, ``remove_node`` and ``transfer_leadership``, the redirects they follow,
each error code as its class, and what is re-sent: only what the server says was not applied; an
attempt that may have applied (a change carries no key) is never re-sent.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import rcq.client
import rcq.client.client
import rcq.client.partition_admin
from rcq.client import (
    CommitOutcomeUnknown,
    InvalidRequest,
    MemberExists,
    MemberNotFound,
    MembershipConflict,
    NodeUnreachable,
    NoLeader,
    NotLeader,
    RcqClient,
    RcqError,
    Unavailable,
    WouldLoseQuorum,
)
from rcq.client.wire import member_path
from rcq.errors import error_from_body
from tests.helpers.fakes import (
    ADD_BODY,
    ADDED,
    LEADERSHIP,
    MEMBERS,
    N1,
    N2,
    REMOVED,
    TRANSFERRED,
    FakeNode,
    Wire,
    serving_fake,
)


class SlowFakeNode(FakeNode):
    """A :class:`FakeNode` that holds every answer ``delay_s`` (a leader waiting for a catch-up)."""

    delay_s = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        response = await super().handle(request)  # the request is recorded (executed) at once
        await asyncio.sleep(self.delay_s)  # pace: the answer of a leader that waits for a catch-up
        return response


@pytest.fixture
async def other() -> AsyncIterator[FakeNode]:
    async with serving_fake(FakeNode()) as node:
        yield node


# The three changes, each as (method, path, the fake's success answer, the call).
Change = Callable[[RcqClient], Awaitable[dict[str, Any]]]
CHANGES: dict[str, tuple[str, str, dict[str, Any], Change]] = {
    "add": ("POST", MEMBERS, ADDED,
            lambda c: c.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004")),
    "remove": ("DELETE", f"{MEMBERS}/n2", REMOVED, lambda c: c.remove_node("n2")),
    "transfer": ("POST", LEADERSHIP, TRANSFERRED, lambda c: c.transfer_leadership("n2")),
}


def sent(node: FakeNode, method: str, path: str) -> int:
    return len(node.bodies(method, path))


# -------------------------------------------------------------------- the requests
async def test_cluster_members_lists_the_members(fake: FakeNode, client: RcqClient):
    fake.answer("GET", MEMBERS, {"leader_id": "n1", "members": [N1, N2]})
    assert await client.cluster_members() == [N1, N2]
    assert fake.requests == [("GET", MEMBERS, None)]


async def test_cluster_members_of_one_node_asks_exactly_that_node(fake: FakeNode, other: FakeNode, client: RcqClient):
    other.answer("GET", MEMBERS, {"leader_id": "n1", "members": [{**N1, "self": False}, {**N2, "self": True}]})
    members = await client.cluster_members(other.url)
    assert [m["self"] for m in members] == [False, True]
    assert fake.requests == [] and other.requests == [("GET", MEMBERS, None)]


async def test_add_node_sends_exactly_the_specified_body(fake: FakeNode, client: RcqClient):
    fake.answer("POST", MEMBERS, ADDED)
    assert await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004") == ADDED
    await client.add_node("n4", "[::1]:10004", "https://node4.example:7004", catch_up_timeout_s=0)
    await client.add_node("n4", "node4:10004", "http://node4:7004", catch_up_timeout_s=600)
    assert fake.bodies("POST", MEMBERS) == [
        ADD_BODY,
        {"node_id": "n4", "raft_address": "[::1]:10004", "url": "https://node4.example:7004", "catch_up_timeout_s": 0},
        {"node_id": "n4", "raft_address": "node4:10004", "url": "http://node4:7004", "catch_up_timeout_s": 600},
    ]


async def test_remove_node_sends_a_delete_without_a_body(fake: FakeNode, client: RcqClient):
    fake.answer("DELETE", f"{MEMBERS}/n2", REMOVED)
    assert await client.remove_node("n2") == REMOVED
    assert fake.requests == [("DELETE", f"{MEMBERS}/n2", None)]


def test_a_member_path_escapes_the_node_id():
    assert member_path("n2") == "/v1/cluster/members/n2"
    assert member_path("a/b c") == "/v1/cluster/members/a%2Fb%20c"


async def test_transfer_leadership_names_the_target_or_lets_the_leader_choose(fake: FakeNode, client: RcqClient):
    fake.answer("POST", LEADERSHIP, TRANSFERRED)
    assert await client.transfer_leadership("n2") == TRANSFERRED
    assert await client.transfer_leadership() == TRANSFERRED
    assert fake.bodies("POST", LEADERSHIP) == [{"node_id": "n2"}, {"node_id": None}]


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.add_node("", "h:1", "http://h:2"), "a node id is a non-empty string"),
    (lambda c: c.add_node("n4", "no-port", "http://h:2"), "raft_address must be host:port"),
    (lambda c: c.add_node("n4", "h:0", "http://h:2"), "raft_address must be host:port"),
    (lambda c: c.add_node("n4", "h:65536", "http://h:2"), "raft_address must be host:port"),
    (lambda c: c.add_node("n4", ":7000", "http://h:2"), "raft_address must be host:port"),
    (lambda c: c.add_node("n4", "h:1", "h:2"), "url must be the node's http://host:port"),
    (lambda c: c.add_node("n4", "h:1", "ftp://h:2"), "url must be the node's http://host:port"),
    (lambda c: c.add_node("n4", "h:1", "http://h:2", catch_up_timeout_s=-1), "catch_up_timeout_s must be"),
    (lambda c: c.add_node("n4", "h:1", "http://h:2", catch_up_timeout_s=600.5), "catch_up_timeout_s must be"),
    (lambda c: c.add_node("n4", "h:1", "http://h:2", catch_up_timeout_s=math.nan), "catch_up_timeout_s must be"),
    (lambda c: c.add_node("n4", "h:1", "http://h:2", catch_up_timeout_s=True), "catch_up_timeout_s must be"),
    (lambda c: c.remove_node(""), "a node id is a non-empty string"),
    (lambda c: c.transfer_leadership(""), "a node id is a non-empty string"),
], ids=["node-id", "no-port", "port-0", "port-high", "no-host", "no-scheme", "ftp", "negative", "over-600", "nan",
        "bool", "remove-empty", "transfer-empty"])
async def test_bad_arguments_are_refused_before_sending(fake: FakeNode, client: RcqClient, call: Change, message: str):
    with pytest.raises(InvalidRequest, match=message):
        await call(client)
    assert fake.requests == []


# ------------------------------------------------------------------------ redirects
@pytest.mark.parametrize("change", CHANGES)
async def test_a_follower_redirects_every_change_to_the_leader(fake: FakeNode, other: FakeNode, change: str):
    method, path, answer, call = CHANGES[change]
    fake.answer(method, path, NotLeader(leader_url=other.url).to_body(), status=307)  # fake: a follower
    other.answer(method, path, answer)
    async with RcqClient(fake.url, retry_timeout_s=2) as client:
        assert await call(client) == answer
        assert client.leader_url == other.url
    assert sent(fake, method, path) == sent(other, method, path) == 1
    assert fake.bodies(method, path) == other.bodies(method, path)  # the same request, re-sent as it was


async def test_removing_the_leader_follows_it_to_the_node_it_handed_leadership_to(fake: FakeNode, other: FakeNode):
    fake.answer("DELETE", f"{MEMBERS}/n1", NotLeader("handed over", leader_url=other.url).to_body(), status=307)
    other.answer("DELETE", f"{MEMBERS}/n1", {"removed": N1, "members": [{**N2, "role": "leader"}]})
    async with RcqClient(fake.url, retry_timeout_s=2) as client:
        answer = await client.remove_node("n1")
        assert answer["removed"] == N1 and client.leader_url == other.url
    assert fake.requests == other.requests == [("DELETE", f"{MEMBERS}/n1", None)]


async def test_a_not_leader_without_a_leader_is_retried_until_one_is_known(fake: FakeNode, client: RcqClient):
    fake.answer("POST", MEMBERS, NotLeader(leader_url=None).to_body(), status=307)
    fake.answer("POST", MEMBERS, ADDED)
    assert await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004") == ADDED
    assert fake.bodies("POST", MEMBERS) == [ADD_BODY, ADD_BODY]


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("change", "error", "status"), [
    ("add", MemberExists, 409),
    ("add", WouldLoseQuorum, 409),
    ("add", NodeUnreachable, 422),
    ("add", InvalidRequest, 400),
    ("remove", MemberNotFound, 404),
    ("remove", WouldLoseQuorum, 409),
    ("transfer", MemberNotFound, 404),
], ids=lambda value: value.__name__ if isinstance(value, type) else str(value))
async def test_each_error_raises_its_class_and_is_not_resent(fake: FakeNode, client: RcqClient, change: str,
                                                            error: type[RcqError], status: int):
    method, path, _, call = CHANGES[change]
    fake.answer(method, path, error("what the server said").to_body(), status=status)
    with pytest.raises(error) as raised:
        await call(client)
    assert type(raised.value) is error and raised.value.message == "what the server said"
    assert sent(fake, method, path) == 1  # node_unreachable is retryable, but the caller decides when


@pytest.mark.parametrize(("code", "status", "error"), [
    ("membership_conflict", 409, MembershipConflict), ("member_exists", 409, MemberExists),
    ("member_not_found", 404, MemberNotFound), ("node_unreachable", 422, NodeUnreachable),
    ("would_lose_quorum", 409, WouldLoseQuorum),
])
def test_each_code_maps_to_its_class(code: str, status: int, error: type[RcqError]):
    rebuilt = error_from_body(status, {"error": {"code": code, "message": "m"}})
    assert type(rebuilt) is error and (rebuilt.code, rebuilt.http_status, rebuilt.message) == (code, status, "m")
    assert rebuilt.retryable == (code in ("membership_conflict", "node_unreachable"))
    assert code in {cls.code for cls in map(lambda name: getattr(rcq.client, name), rcq.client.__all__)
                    if isinstance(cls, type) and issubclass(cls, RcqError)}


@pytest.mark.parametrize("change", CHANGES)
async def test_a_membership_conflict_is_retried_until_the_change_goes_through(fake: FakeNode, client: RcqClient,
                                                                              change: str):
    method, path, answer, call = CHANGES[change]
    fake.answer(method, path, MembershipConflict().to_body(), status=409)
    fake.answer(method, path, MembershipConflict().to_body(), status=409)
    fake.answer(method, path, answer)
    assert await call(client) == answer
    assert sent(fake, method, path) == 3
    assert len({str(body) for body in fake.bodies(method, path)}) == 1


async def test_a_lasting_membership_conflict_is_raised_when_the_budget_is_spent(fake: FakeNode):
    fake.answer("POST", MEMBERS, MembershipConflict().to_body(), status=409)
    async with RcqClient(fake.url, retry_timeout_s=0.3) as client:
        with pytest.raises(MembershipConflict):
            await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004")
    assert sent(fake, "POST", MEMBERS) >= 2


async def test_no_leader_is_retried(fake: FakeNode, client: RcqClient):
    fake.answer("POST", MEMBERS, NoLeader().to_body(), status=503)
    fake.answer("POST", MEMBERS, ADDED)
    assert await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004") == ADDED
    assert sent(fake, "POST", MEMBERS) == 2


async def test_a_refused_connection_is_retried_on_the_next_node(fake: FakeNode):
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    fake.answer("POST", MEMBERS, ADDED)
    async with RcqClient([dead_url, fake.url], retry_timeout_s=2) as client:
        assert await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004") == ADDED
    assert sent(fake, "POST", MEMBERS) == 1


# ------------------------------------------------------------- unknown outcomes
@pytest.mark.parametrize("change", CHANGES)
async def test_a_commit_outcome_unknown_is_surfaced_not_resent(fake: FakeNode, client: RcqClient, change: str):
    method, path, answer, call = CHANGES[change]
    fake.answer(method, path, CommitOutcomeUnknown("the entry may yet commit").to_body(), status=504)
    fake.answer(method, path, answer)  # what a blind re-send would get
    with pytest.raises(CommitOutcomeUnknown, match="cannot safely be re-sent: the entry may yet commit") as raised:
        await call(client)
    assert raised.value.maybe_committed
    assert sent(fake, method, path) == 1


@pytest.mark.parametrize("change", ["add", "transfer"])
async def test_a_change_whose_answer_was_lost_is_not_resent(fake: FakeNode, change: str):
    method, path, answer, call = CHANGES[change]
    fake.answer(method, path, answer)
    recorder = Wire()
    recorder.lose[path] = 1
    async with aiohttp.ClientSession(middlewares=[recorder]) as session, \
            RcqClient(fake.url, session=session, retry_timeout_s=2) as client:
        with pytest.raises(CommitOutcomeUnknown, match="cannot safely be re-sent"):
            await call(client)
    assert sent(fake, method, path) == 1 and recorder.count(path) == 1


async def test_a_remove_whose_answer_was_lost_is_not_resent_by_the_client(fake: FakeNode):
    """aiohttp itself sends an idempotent DELETE once more when the connection drops (RFC 9112
    9.3.1), below the transport; rcq adds no re-send of its own."""
    fake.answer("DELETE", f"{MEMBERS}/n2", REMOVED)
    recorder = Wire()
    recorder.lose[f"{MEMBERS}/n2"] = 2
    async with aiohttp.ClientSession(middlewares=[recorder]) as session, \
            RcqClient(fake.url, session=session, retry_timeout_s=2) as client:
        with pytest.raises(CommitOutcomeUnknown, match="cannot safely be re-sent"):
            await client.remove_node("n2")
    assert sent(fake, "DELETE", f"{MEMBERS}/n2") == recorder.count(f"{MEMBERS}/n2") == 2


async def test_an_add_may_take_as_long_as_its_catch_up_timeout():
    async with serving_fake(SlowFakeNode()) as slow:
        slow.delay_s = 0.6  # the leader waits for the new node to catch up
        slow.answer("POST", MEMBERS, ADDED)
        async with RcqClient(slow.url, request_timeout_s=0.2, retry_timeout_s=2) as client:
            assert await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004",
                                         catch_up_timeout_s=1) == ADDED
        assert sent(slow, "POST", MEMBERS) == 1


async def test_an_add_that_outlasts_its_timeout_has_an_unknown_outcome(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(rcq.client.partition_admin, "MEMBERSHIP_CHANGE_S", 0.0)
    async with serving_fake(SlowFakeNode()) as slow:
        slow.delay_s = 0.6
        slow.answer("POST", MEMBERS, ADDED)
        async with RcqClient(slow.url, request_timeout_s=0.2, retry_timeout_s=2) as client:
            with pytest.raises(CommitOutcomeUnknown, match="cannot safely be re-sent"):
                await client.add_node("n4", "127.0.0.1:10004", "http://127.0.0.1:7004", catch_up_timeout_s=0.1)
        assert sent(slow, "POST", MEMBERS) == 1


def test_the_membership_errors_are_exported():
    assert {"MembershipConflict", "MemberExists", "MemberNotFound", "NodeUnreachable",
            "WouldLoseQuorum"} <= set(rcq.client.__all__)


async def test_a_complete_transaction_listing_refuses_one_missing_a_partition() -> None:
    async with serving_fake() as node:
        node.answer("GET", "/v1/transactions", {"transactions": [{"transaction_id": "p1.x", "label": "t"}],
                                               "unanswered": ["p2"]})
        async with RcqClient(node.url, channel=False, retry_timeout_s=0.5) as client:
            assert len(await client.transactions("t")) == 1  # a listing as it came
            with pytest.raises(Unavailable, match="p2") as refused:
                await client.transactions("t", complete=True)  # "not listed" would not mean "not open"
            assert refused.value.details["unanswered"] == ["p2"]
