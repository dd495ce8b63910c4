"""The client's JSON (``rcq.client.wire.dumps`` for requests, ``rcq.json_text.loads`` for answers):
orjson where it writes and reads what json does, json everywhere else, so every request body and
every answer is what it was with json alone."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from typing import Any

import pytest

from rcq.client.wire import dumps
from rcq.json_text import loads

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def json_bytes(body: Any) -> bytes:
    return _JSON.encode(body).encode("utf-8")


class Label(str):
    pass


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize("body", [
    {"op": "execute", "idempotency_key": "k" * 32,
     "operations": [{"op": "enqueue", "queue": "q", "items": ["x" * 100, "ünï cödé ✓"], "encoding": "utf-8"}]},
    {"op": "enqueue", "queue": "q", "items": [{"value": "v", "headers": {"traceparent": "00-ab-cd-01"}}],
     "encoding": "base64", "priority": 3, "delay_s": 0.5, "ttl_s": 2},
    {"op": "batch", "requests": [{"op": "dequeue", "queue": "q", "max_items": 10, "wait_ms": 0}, {"op": "begin"}]},
    {"flag": True, "other": False, "empty": [], "nested": {"a": [1, -2, 3.25]}, "big": 2**63 - 1},
])
def test_request_bodies_are_written_as_json_writes_them(body: dict[str, Any]):
    assert dumps(body) == json_bytes(body)


@pytest.mark.parametrize("body", [
    {"timeout_s": math.nan}, {"timeout_s": math.inf}, {"delay_s": -math.inf},  # orjson: null; json: NaN
    {"label": None}, {"items": ["null"]},  # a null anywhere: json's output whatever it is
    {"big": 2**64}, {"negative": -(2**63) - 1},  # beyond 64 bits
    {1: "a", 2.5: "b", None: "c", False: "d"},  # keys that are not str
    {"label": Label("x"), "count": True},  # a subclass of str
])
def test_what_orjson_would_write_otherwise_is_written_by_json(body: dict[str, Any]):
    assert dumps(body) == json_bytes(body)


@pytest.mark.parametrize("value", [Point(1), datetime.datetime(2026, 11, 26), object(), b"bytes"])
def test_what_json_refuses_is_still_refused(value: Any):
    with pytest.raises(TypeError):
        dumps({"value": value})


def test_a_lone_surrogate_is_refused_as_before():
    with pytest.raises(UnicodeEncodeError):
        dumps({"label": "\ud800"})


@pytest.mark.parametrize("text", [
    '{"id":1,"status":200,"body":{"index":7,"duplicate":false,"transaction_ids":["1.2"]}}',
    '{"id":1,"status":200,"body":{"value":NaN,"big":18446744073709551616,"neg":-Infinity}}',  # orjson refuses
    '{"id":1,"body":"\\ud800"}',  # a lone surrogate, escaped
    "[" * 900 + "]" * 900,  # deep, within what json parses
])
def test_answers_are_read_as_json_reads_them(text: str):
    assert repr(loads(text)) == repr(json.loads(text))
    assert repr(loads(text.encode())) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["", "{", "not json", '{"a":1}}'])
def test_what_is_not_json_raises_value_error(text: str):
    with pytest.raises(ValueError):
        loads(text)


def test_nesting_deeper_than_either_parses_fails_as_with_json():
    text = "[" * 5000 + "]" * 5000
    with pytest.raises(RecursionError):
        json.loads(text)
    with pytest.raises(RecursionError):
        loads(text)
