"""Fuzzing the session channel (``GET /v1/session``) of a live 3-node cluster with raw frames.

Every frame gets a clear answer or a clean close with the documented code: a frame no request can
be blamed for (not JSON, truncated, nested too deeply, not an object, no valid id) an id-null 400
``invalid_request`` and the channel stays open; a frame with a valid id but a broken request
(unknown op, wrong field types, unknown fields) its own 4xx answer; a binary frame close 1003, one
larger than ``body_bytes_max`` close 1009, an id already in flight close 1002. Never a 5xx answer,
close 1011 or a node crash; the node keeps serving another channel throughout; a refused frame
changes nothing (the leader's state digest is the same before and after it). Pipelined requests
are answered as they finish, not in order. The node ERROR-log check of the suite applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rcq.local.cluster import LocalCluster
from rcq.server.http.asyncapi import EXAMPLES
from rcq.server.http.session_channel import FRAME_ID_MAX
from tests.helpers import QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import running_cluster
from tests.helpers.raw_channel import RawChannel, gather_answers, open_channel

pytestmark = pytest.mark.cluster

BODY_BYTES_MAX = 64 << 10
# A small body_bytes_max makes oversized frames cheap; items must fit in it. Long polls capped at
# 1 s: a fuzzed wait_ms is then at most 1 s of waiting, or a 400.
FUZZED_NODE_SETTINGS = {"body_bytes_max": BODY_BYTES_MAX, "item_bytes_max": 32 << 10, "dequeue_wait_max_ms": 1000}
LONG_POLL_MAX_MS = 1000  # the longest long poll the fuzzed nodes allow
EXAMPLES_PER_TEST = 100  # bounded: the whole module stays well under a minute on 2 cores
PROBE = {"op": "status", "transaction_id": "not-a-transaction"}  # changes nothing; answered 404

JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(max_size=16))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
BAD_IDS = (st.none() | st.booleans() | st.text(max_size=8) | st.floats(allow_nan=False, allow_infinity=False)
           | st.integers(max_value=0) | st.integers(min_value=FRAME_ID_MAX + 1) | st.lists(st.integers(), max_size=2))
VALID_FRAMES = st.sampled_from(sorted(EXAMPLES)).map(lambda op: dict(EXAMPLES[op]))


def valid_id(frame: Any) -> bool:
    """Whether the channel would attribute ``frame`` (a JSON text) to a request."""
    try:
        value = json.loads(frame)
    except (ValueError, RecursionError):
        return False
    frame_id = value.get("id") if isinstance(value, dict) else None
    return isinstance(frame_id, int) and not isinstance(frame_id, bool) and 1 <= frame_id <= FRAME_ID_MAX


@st.composite
def unattributable_frames(draw: st.DrawFn) -> str:
    """Text frames no request can be blamed for."""
    kind = draw(st.sampled_from(["text", "truncated", "not an object", "bad id", "no id"]))
    if kind == "text":
        frame = draw(st.text(max_size=64))
    elif kind == "truncated":
        whole = json.dumps({"id": draw(st.integers(1, 1000)), **draw(VALID_FRAMES)})
        frame = whole[:draw(st.integers(0, len(whole) - 1))]
    elif kind == "not an object":
        frame = json.dumps(draw(JSON_VALUES.filter(lambda value: not isinstance(value, dict))))
    elif kind == "bad id":
        frame = json.dumps({"id": draw(BAD_IDS), **draw(VALID_FRAMES)})
    else:
        frame = json.dumps(draw(VALID_FRAMES))
    assume(not valid_id(frame))
    return frame


@st.composite
def broken_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request (the AsyncAPI document's examples) broken in one place, with a valid id."""
    frame = draw(VALID_FRAMES)
    fields = sorted(key for key in frame if key != "op")
    kind = draw(st.sampled_from(["unknown op", "no op", "field", "extra field"] if fields else ["unknown op"]))
    if kind == "unknown op":
        frame["op"] = draw(JSON_VALUES.filter(lambda value: not (isinstance(value, str) and value in EXAMPLES)))
    elif kind == "no op":
        del frame["op"]
    elif kind == "field":
        frame[draw(st.sampled_from(fields))] = draw(JSON_VALUES)
    else:
        frame[draw(st.text(min_size=1, max_size=12).filter(lambda key: key not in frame and key != "id"))] = \
            draw(JSON_VALUES)
    return {"id": draw(st.integers(1, FRAME_ID_MAX)), **frame}


# ============================================================================ the arena
class Arena:
    """The leader of a live cluster, a channel to fuzz (reopened after each close), a bystander
    channel that must keep being served, and the leader's state digest."""

    def __init__(self, cluster: LocalCluster, http: aiohttp.ClientSession, stack: contextlib.AsyncExitStack) -> None:
        self.cluster = cluster
        self.http = http
        self.stack = stack
        self.url = cluster.url(cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S))
        self.fuzzed: RawChannel | None = None
        self.bystander: RawChannel | None = None
        self.probes = 0

    async def open(self) -> RawChannel:
        return await self.stack.enter_async_context(open_channel(self.http, self.url, self.cluster.token))

    async def channel(self) -> RawChannel:
        if self.fuzzed is None or self.fuzzed.ws.closed:
            self.fuzzed = await self.open()
        return self.fuzzed

    async def digest(self) -> str:
        async with self.http.get(f"{self.url}/v1/cluster/digest", headers=self.cluster.auth_headers()) as response:
            assert response.status == 200
            return str((await response.json())["digest"])

    async def bystander_served(self) -> None:
        """The other channel still gets answers (it is opened once, and never closed by the node)."""
        if self.bystander is None:
            self.bystander = await self.open()
        self.probes += 1
        answer = await self.bystander.request({"id": self.probes, **PROBE})
        assert answer["status"] == 404 and answer["body"]["error"]["code"] == "transaction_not_found", answer

    async def refused_changes_nothing(self, send: Callable[[RawChannel], Any]) -> Any:
        """Run ``send`` on the fuzzed channel; the digest is the same before and after."""
        before = await self.digest()
        outcome = await send(await self.channel())
        assert await self.digest() == before, f"a refused frame changed the state: {outcome}"
        await self.bystander_served()
        return outcome


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster(overrides=FUZZED_NODE_SETTINGS) as local_cluster:
        yield local_cluster


@pytest.fixture
def arena(cluster: LocalCluster) -> Iterator[tuple[Arena, asyncio.AbstractEventLoop]]:
    """An arena on an event loop of its own: hypothesis drives sync tests, each example runs on it."""
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        http = loop.run_until_complete(_session(stack))
        fuzz = Arena(cluster, http, stack)
        yield fuzz, loop
        loop.run_until_complete(fuzz.bystander_served())  # still served, after all of it
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
    assert cluster.unexpected_exits() == {}


async def _session(stack: contextlib.AsyncExitStack) -> aiohttp.ClientSession:
    return await stack.enter_async_context(aiohttp.ClientSession())  # made on the running loop


def fuzz_settings() -> Any:
    return settings(max_examples=EXAMPLES_PER_TEST, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


# ============================================================================ the tests
def test_frames_no_request_can_be_blamed_for_get_an_id_null_400_and_the_channel_stays_open(
        arena: tuple[Arena, asyncio.AbstractEventLoop]) -> None:
    fuzz, loop = arena

    async def refused(channel: RawChannel, frame: str) -> dict[str, Any]:
        await channel.send(frame)
        return await channel.answer()

    @fuzz_settings()
    @given(frame=unattributable_frames())
    @example(frame="[" * 30_000 + "]" * 30_000)  # deeper than the parser's stack, within body_bytes_max
    @example(frame='{"id": 1, "op": "begin", "label": ' + "[" * 20_000 + "]" * 20_000 + "}")
    @example(frame='{"id": ' + "9" * 5000 + ', "op": "begin"}')  # more digits than Python parses
    @example(frame='{"id": 1e400, "op": "begin"}')
    @example(frame="")
    def fuzz_one(frame: str) -> None:
        answer = loop.run_until_complete(fuzz.refused_changes_nothing(lambda channel: refused(channel, frame)))
        assert answer["id"] is None and answer["status"] == 400, (frame[:200], answer)
        assert answer["body"]["error"]["code"] == "invalid_request", answer
        assert not fuzz.fuzzed.ws.closed  # type: ignore[union-attr]

    fuzz_one()


def test_broken_requests_get_their_own_4xx_answer_and_refused_ones_change_nothing(
        arena: tuple[Arena, asyncio.AbstractEventLoop]) -> None:
    fuzz, loop = arena
    statuses: set[int] = set()

    async def run(frame: dict[str, Any]) -> dict[str, Any]:
        before = await fuzz.digest()
        answer = await (await fuzz.channel()).request(frame)
        if 400 <= answer["status"] < 500:
            assert await fuzz.digest() == before, f"refused {frame} changed the state: {answer}"
        await fuzz.bystander_served()
        return answer

    @fuzz_settings()
    @given(frame=broken_requests())
    def fuzz_one(frame: dict[str, Any]) -> None:
        answer = loop.run_until_complete(run(frame))
        statuses.add(answer["status"])
        assert answer["status"] < 500, (frame, answer)
        if answer["status"] >= 400:
            assert set(answer["body"]["error"]) >= {"code", "message", "retryable", "maybe_committed"}, answer

    fuzz_one()
    print(f"statuses seen: {sorted(statuses)}")
    assert 400 in statuses


def enqueue_frame(frame_id: int, item_bytes: int = 10) -> dict[str, Any]:
    """A request that would change the state: a one-request transaction enqueueing one item."""
    return {"id": frame_id, "op": "execute", "operations": [{"op": "enqueue", "queue": "fuzz", "items": ["x" * item_bytes]}]}


async def closed_with(channel: RawChannel, frame: Any) -> tuple[int, str]:
    await channel.send(frame)
    return await channel.close_code()


@pytest.mark.parametrize(("name", "frame", "code"), [
    ("binary", json.dumps(enqueue_frame(1)).encode(), 1003),
    ("one byte over body_bytes_max", json.dumps(enqueue_frame(1, 1)).ljust(BODY_BYTES_MAX + 1), 1009),
    ("far over body_bytes_max", json.dumps(enqueue_frame(1, 3 * BODY_BYTES_MAX)), 1009),
])
def test_binary_and_oversized_frames_close_the_channel_with_their_code_and_change_nothing(
        arena: tuple[Arena, asyncio.AbstractEventLoop], name: str, frame: Any, code: int) -> None:
    fuzz, loop = arena
    assert loop.run_until_complete(fuzz.refused_changes_nothing(lambda channel: closed_with(channel, frame)))[0] \
        == code, name


def test_a_frame_of_exactly_body_bytes_max_is_served(arena: tuple[Arena, asyncio.AbstractEventLoop]) -> None:
    fuzz, loop = arena
    frame = json.dumps({"id": 1, **PROBE})
    padded = frame[:-1].ljust(BODY_BYTES_MAX - 1) + "}"  # JSON allows the spaces
    assert len(padded.encode()) == BODY_BYTES_MAX

    async def run() -> dict[str, Any]:
        channel = await fuzz.channel()
        await channel.send(padded)
        return await channel.answer()

    answer = loop.run_until_complete(run())
    assert (answer["id"], answer["status"]) == (1, 404), answer


def test_an_id_already_in_flight_closes_the_channel_with_1002_and_its_frame_is_not_run(
        arena: tuple[Arena, asyncio.AbstractEventLoop]) -> None:
    fuzz, loop = arena

    async def duplicate(channel: RawChannel) -> tuple[int, str]:
        await channel.send({"id": 7, "op": "receive", "queue": "fuzz-empty", "wait_ms": LONG_POLL_MAX_MS})  # waits
        return await closed_with(channel, enqueue_frame(7))

    code, reason = loop.run_until_complete(fuzz.refused_changes_nothing(duplicate))
    assert code == 1002 and "7" in reason, (code, reason)


def test_pipelined_requests_are_answered_as_they_finish_not_in_order(
        arena: tuple[Arena, asyncio.AbstractEventLoop]) -> None:
    fuzz, loop = arena

    async def run() -> list[dict[str, Any]]:
        channel = await fuzz.channel()
        await channel.send({"id": 1, "op": "receive", "queue": "fuzz-empty", "wait_ms": LONG_POLL_MAX_MS})
        for frame_id in range(2, 12):
            await channel.send({"id": frame_id, **PROBE})
        return await gather_answers(channel, 11)

    answers = loop.run_until_complete(run())
    assert [a["id"] for a in answers[:10]] == list(range(2, 12))  # each probe is answered at once...
    assert answers[10]["id"] == 1 and answers[10]["status"] == 200  # ...the long poll after it, empty
    assert answers[10]["body"]["items"] == [] and answers[10]["body"]["transaction_id"] is None


def test_many_pipelined_frames_valid_or_not_each_get_exactly_one_answer(
        arena: tuple[Arena, asyncio.AbstractEventLoop]) -> None:
    fuzz, loop = arena
    frames: list[Any] = []
    for frame_id in range(1, 301):
        frames.append({"id": frame_id, **PROBE} if frame_id % 3 else
                      {"id": frame_id, "op": "status", "transaction_id": frame_id})  # wrong type: 400
        if frame_id % 50 == 0:
            frames.append("{not json")

    async def run() -> list[dict[str, Any]]:
        channel = await fuzz.channel()
        for frame in frames:
            await channel.send(frame)
        return await gather_answers(channel, len(frames))

    answers = loop.run_until_complete(run())
    by_id = {a["id"]: a for a in answers if a["id"] is not None}
    assert sorted(by_id) == list(range(1, 301))
    assert sum(a["id"] is None for a in answers) == 6
    assert {by_id[i]["status"] for i in by_id if i % 3} == {404}
    assert {by_id[i]["status"] for i in by_id if not i % 3} == {400}
