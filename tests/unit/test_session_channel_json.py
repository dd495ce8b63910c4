"""The session channel's JSON (frames parsed by rcq.json_text, answers written by
rcq.server.http.session_channel): orjson where it can, the standard library where it refuses, so
that every frame gets the answer it got with json alone."""

from __future__ import annotations

import json

import pytest

from rcq.json_text import loads as _parse
from rcq.server.http.session_channel import _render


@pytest.mark.parametrize("frame", [
    '{"id": 1, "op": "begin"}',
    '{"id": 2, "op": "enqueue", "queue": "q", "items": ["a", "\\u00e9"]}',
    '{"id": 3, "label": NaN}',  # orjson refuses NaN; json reads it (the request is then invalid, not unparsed)
    '{"id": 4, "wait_ms": 1e400}',  # beyond a double: json reads inf
    '"\\ud800"',  # a lone surrogate: json reads it
])
def test_a_frame_parses_as_json_parses_it(frame: str) -> None:
    parsed, expected = _parse(frame), json.loads(frame)
    assert json.dumps(parsed) == json.dumps(expected)


@pytest.mark.parametrize("frame", ["", "{", "[" * 30_000 + "]" * 30_000, '{"id": 1,}'])
def test_what_json_refuses_is_refused_with_json_s_error(frame: str) -> None:
    with pytest.raises((ValueError, RecursionError)):
        json.loads(frame)
    with pytest.raises((ValueError, RecursionError)):
        _parse(frame)


@pytest.mark.parametrize("answer", [
    {"id": 1, "status": 200, "body": {"transaction_id": "t-1", "items": [{"id": 5, "value": "é"}]}},
    {"id": None, "status": 400, "body": {"error": {"code": "invalid_request", "message": "m"}}},
    {"id": 2, "status": 200, "body": {"counts": {0: 1, 3: 2}}},  # number keys become strings, as with json
    {"id": 3, "status": 200, "body": {"index": 1 << 70}},  # beyond 64 bits: json writes it
])
def test_an_answer_is_written_as_json_writes_it(answer: dict) -> None:
    assert json.loads(_render(answer)) == json.loads(json.dumps(answer))
