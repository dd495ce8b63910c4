"""The session channel's JSON: frames parsed by the parser of HTTP bodies
(``rcq.server.http.handlers.parse_json``), answers written as HTTP's are (``render_json``), with
orjson where it can and the standard library where it refuses, so that every answer reads as json
would write it."""

from __future__ import annotations

import json

import pydantic
import pytest

from rcq.errors import InvalidRequest
from rcq.server.http.handlers import parse_json, render_json


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


@pytest.mark.parametrize("frame", [
    '{"id": 1, "op": "begin"}',
    '{"id": 2, "op": "enqueue", "queue": "q", "items": ["a", "\\u00e9", "\\ud83d\\ude00"]}',
    '{"id": 3, "label": NaN}',  # read (the request is then invalid, not unparsed), as pydantic reads a body
    '{"id": 4, "wait_ms": 123456789012345678901234567890}',  # beyond 64 bits
])
def test_a_frame_parses_as_an_http_body_parses(frame: str) -> None:
    parsed = parse_json(frame, "frame")
    assert json.dumps(parsed) == json.dumps(_Body.model_validate_json(frame).model_dump())


@pytest.mark.parametrize("frame", [
    "", "{", '{"id": 1,}', "[" * 30_000 + "]" * 30_000,
    '{"id": 1, "label": "\\ud800"}',  # a lone surrogate: no UTF-8 for it, anywhere it would be written
    '{"id": 1, "items": [{"value": "v", "headers": {"k": "\\udc00x"}}]}',
    '{"\\ud800": 1}',
])
def test_what_an_http_body_may_not_hold_is_refused_400(frame: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        _Body.model_validate_json(frame)
    with pytest.raises(InvalidRequest) as refused:
        parse_json(frame, "this frame")
    assert refused.value.http_status == 400 and "this frame is not valid JSON" in refused.value.message


@pytest.mark.parametrize("answer", [
    {"id": 1, "status": 200, "body": {"transaction_id": "t-1", "items": [{"id": 5, "value": "é"}]}},
    {"id": None, "status": 400, "body": {"error": {"code": "invalid_request", "message": "m"}}},
    {"id": 2, "status": 200, "body": {"counts": {0: 1, 3: 2}}},  # number keys become strings, as with json
    {"id": 3, "status": 200, "body": {"index": 1 << 70}},  # beyond 64 bits: json writes it
])
def test_an_answer_is_written_as_json_writes_it(answer: dict) -> None:
    assert json.loads(render_json(answer)) == json.loads(json.dumps(answer))
