"""The session channel and HTTP refuse the same inputs the same way: one request sent as a channel
frame and as the only sub-request of ``POST /v1/batch`` gets the same status and error code, and
never a 500 — whatever it holds, lone UTF-16 surrogates (which no UTF-8 can carry) in keys, values,
headers, labels and reasons included.

One node over the in-memory replicator, on an event loop of its own: hypothesis drives a sync
test and each example runs on that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rcq.server.http.asyncapi import EXAMPLES
from tests.helpers.nodes import running_node, url_of
from tests.helpers.raw_channel import RawChannel, open_channel

EXAMPLES_PER_TEST = 150
WAIT_MAX_MS = 20  # long polls of generated requests stay short (a longer wait_ms is a 400 on both doors)
LONE_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
TEXT = st.text(max_size=8) | st.sampled_from(LONE_SURROGATES).map(lambda s: "k" + s)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
OPS = sorted(op for op in EXAMPLES if op != "batch")  # a batch frame is a whole POST /v1/batch, not a sub-request


def with_surrogate(value: Any, path: list[int], surrogate: str) -> Any:
    """``value`` with ``surrogate`` put into one of its strings (or keys), chosen by ``path``."""
    if isinstance(value, str):
        return value + surrogate
    if isinstance(value, dict) and value:
        keys = sorted(value)
        key = keys[path[0] % len(keys)] if path else keys[0]
        if len(path) > 1 and path[1] % 3 == 0:  # the key itself
            return {(k + surrogate if k == key else k): v for k, v in value.items()}
        return {**value, key: with_surrogate(value[key], path[1:], surrogate)}
    if isinstance(value, list) and value:
        position = path[0] % len(value) if path else 0
        return [with_surrogate(v, path[1:], surrogate) if i == position else v for i, v in enumerate(value)]
    return surrogate


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request of each op (the AsyncAPI examples), kept, broken in one field, or given a
    lone surrogate somewhere (a header, a label, a reason, a key, a queue name...)."""
    request = json.loads(json.dumps(EXAMPLES[draw(st.sampled_from(OPS))]))
    kind = draw(st.sampled_from(["valid", "field", "extra field", "surrogate"]))
    fields = sorted(key for key in request if key != "op")
    if kind == "field" and fields:
        request[draw(st.sampled_from(fields))] = draw(JSON_VALUES)
    elif kind == "extra field":
        request[draw(TEXT.filter(lambda key: key not in request and key != "id"))] = draw(JSON_VALUES)
    elif kind == "surrogate":
        path = draw(st.lists(st.integers(0, 10), min_size=1, max_size=6))
        request = {"op": request["op"], **with_surrogate({k: v for k, v in request.items() if k != "op"}, path,
                                                          draw(st.sampled_from(LONE_SURROGATES)))}
    if "wait_ms" in request and isinstance(request["wait_ms"], int):
        request["wait_ms"] = min(request["wait_ms"], WAIT_MAX_MS)
    return request


def outcome(status: int, body: Any) -> tuple[int, str | None]:
    return status, (body.get("error") or {}).get("code") if isinstance(body, dict) else None


class Doors:
    """The node's two front doors: a channel and HTTP."""

    def __init__(self, url: str, http: aiohttp.ClientSession, channel: RawChannel) -> None:
        self.url, self.http, self.channel, self.frame_id = url, http, channel, 0

    async def by_channel(self, request: dict[str, Any]) -> tuple[int, str | None]:
        self.frame_id += 1
        await self.channel.send(json.dumps({"id": self.frame_id, **request}))  # ensure_ascii: "\ud800" escapes
        answer = await self.channel.answer()
        assert answer["id"] in (self.frame_id, None), answer  # None: refused before its id was read
        return outcome(answer["status"], answer["body"])

    async def by_http(self, request: dict[str, Any]) -> tuple[int, str | None]:
        async with self.http.post(self.url + "/v1/batch", data=json.dumps({"requests": [request]}),
                                  headers={"Content-Type": "application/json"}) as response:
            body = await response.json()
            if response.status != 200:
                return outcome(response.status, body)
            (answer,) = body["responses"]
            return outcome(answer["status"], answer["body"])


@pytest.fixture
def doors(tmp_path: Path) -> Iterator[tuple[Doors, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()

    async def open_doors() -> Doors:
        node = await stack.enter_async_context(running_node(tmp_path, dequeue_wait_max_ms=WAIT_MAX_MS))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        channel = await stack.enter_async_context(open_channel(http, url_of(node), None))
        return Doors(url_of(node), http, channel)

    try:
        yield loop.run_until_complete(open_doors()), loop
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


def test_a_request_gets_the_same_status_and_code_by_channel_and_by_http(
        doors: tuple[Doors, asyncio.AbstractEventLoop]) -> None:
    front, loop = doors
    seen: set[tuple[int, str | None]] = set()

    @settings(max_examples=EXAMPLES_PER_TEST, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request=requests())
    @example(request={"op": "execute", "operations": [
        {"op": "enqueue", "queue": "ch.frames", "items": [{"value": "v", "headers": {"k": "\ud800"}}]}]})
    @example(request={"op": "begin", "label": "x\udc00"})
    @example(request={"op": "reject", "transaction_id": "1f.0123456789abcdef01234567", "reason": "\udfff"})
    def both_doors(request: dict[str, Any]) -> None:
        by_channel = loop.run_until_complete(front.by_channel(request))
        by_http = loop.run_until_complete(front.by_http(request))
        assert by_channel == by_http, (request, by_channel, by_http)
        assert by_channel[0] < 500, (request, by_channel)
        seen.add(by_channel)

    both_doors()
    print(f"outcomes seen: {sorted(seen, key=str)}")
    assert (400, "invalid_request") in seen and any(status < 300 for status, _ in seen), seen
