"""The AsyncAPI description of the session channel: every op the channel's frame union accepts is
documented and every documented request is accepted, the document holds together (AsyncAPI 3.0:
operations name channels and messages that exist, every reference resolves), the committed
``docs/asyncapi.json`` is the generated one, and a node serves it with its own URL and limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jsonschema_rs
import pytest
from pydantic import ValidationError

from rcq.server.http import session_channel
from rcq.server.http.asyncapi import ANSWER, CHANNEL, CLOSE_CODES, ERROR_FRAME, RECEIVE, SEND, asyncapi_spec
from tests.helpers.nodes import make_config, serving_node

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "asyncapi.json"
REGENERATE = ".venv/bin/python -m rcq.server.http.asyncapi > docs/asyncapi.json"


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def message_at(document: dict[str, Any], ref: str) -> dict[str, Any]:
    """The message a channel's or an operation's reference names, followed to its definition."""
    message = resolve(document, ref)
    while "$ref" in message:
        message = resolve(document, message["$ref"])
    return dict(message)


def refs_in(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*([node["$ref"]] if isinstance(node.get("$ref"), str) else []),
                *(ref for value in node.values() for ref in refs_in(value))]
    if isinstance(node, list):
        return [ref for value in node for ref in refs_in(value)]
    return []


def payload_validator(document: dict[str, Any], message: dict[str, Any]) -> jsonschema_rs.Draft202012Validator:
    """A validator of ``message``'s payload, its references resolved in ``document``."""
    return jsonschema_rs.Draft202012Validator({**message["payload"], "components": document["components"]})


def server_accepts(frame: dict[str, Any]) -> Any:
    """What the channel makes of a frame (id removed, as it does): the validated model, or ValidationError."""
    body = {key: value for key, value in frame.items() if key != "id"}
    adapter = session_channel.BATCH_FRAME if body.get("op") == "batch" else session_channel.FRAME
    return adapter.validate_python(body)


def request_messages(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    operation = document["operations"][RECEIVE]
    return {ref.rsplit("/", 1)[1]: message_at(document, ref) for ref in (m["$ref"] for m in operation["messages"])}


def test_every_op_the_channel_accepts_is_documented_and_every_documented_request_is_accepted() -> None:
    document = asyncapi_spec()
    accepted_ops = {*session_channel.FRAME.json_schema()["discriminator"]["mapping"],
                    session_channel.BATCH_FRAME.json_schema()["properties"]["op"]["const"]}
    messages = request_messages(document)
    assert set(messages) == accepted_ops
    for op, message in messages.items():
        validator = payload_validator(document, message)
        assert message["examples"], op
        for example in message["examples"]:
            frame = example["payload"]
            validator.validate(frame)  # the document accepts its example...
            assert server_accepts(frame).op == op  # ...and so does the channel, as that op
            # What the document refuses the channel refuses too: an unknown field...
            assert not validator.is_valid({**frame, "unknown": 1})
            with pytest.raises(ValidationError):
                server_accepts({**frame, "unknown": 1})
            # ...and a frame without an id (the channel answers it id null) or with an id out of range.
            assert not validator.is_valid({key: value for key, value in frame.items() if key != "id"})
            assert not validator.is_valid({**frame, "id": 0})
            assert not validator.is_valid({**frame, "id": session_channel.FRAME_ID_MAX + 1})


def test_the_answer_and_the_error_frame_are_documented_with_valid_examples() -> None:
    document = asyncapi_spec()
    sent = [message_at(document, m["$ref"]) for m in document["operations"][SEND]["messages"]]
    assert [message["name"] for message in sent] == [ANSWER, ERROR_FRAME]
    for message in sent:
        validator = payload_validator(document, message)
        for example in message["examples"]:
            validator.validate(example["payload"])
    error_frame = payload_validator(document, sent[1])
    assert not error_frame.is_valid({"id": 3, "status": 400, "body": sent[1]["examples"][0]["payload"]["body"]})


def test_the_document_is_a_coherent_asyncapi_3_document() -> None:
    document = asyncapi_spec()
    assert document["asyncapi"] == "3.0.0"
    assert {"title", "version", "description"} <= set(document["info"])
    for ref in refs_in(document):
        resolve(document, ref)
    channel = document["channels"][CHANNEL]
    assert channel["address"] == session_channel.PATH
    assert channel["bindings"]["ws"]["method"] == "GET"
    assert channel["bindings"]["ws"]["headers"]["properties"]["Sec-WebSocket-Protocol"]["const"] == \
        session_channel.SUBPROTOCOL
    for operation_id, operation in document["operations"].items():
        assert operation["action"] in ("send", "receive"), operation_id
        operation_channel = resolve(document, operation["channel"]["$ref"])
        assert operation_channel is channel
        for message in operation["messages"]:
            # an operation's messages are its channel's (AsyncAPI 3.0)
            prefix = operation["channel"]["$ref"] + "/messages/"
            assert message["$ref"].startswith(prefix), (operation_id, message)
            assert message["$ref"][len(prefix):] in channel["messages"]
        for scheme in operation["security"]:
            assert resolve(document, scheme["$ref"])["type"] == "http"
    assert {message["$ref"] for message in document["operations"][RECEIVE]["reply"]["messages"]} <= \
        {message["$ref"] for message in document["operations"][SEND]["messages"]}
    for name, message in document["components"]["messages"].items():
        assert message["name"] == name
        assert message["payload"]["$ref"].startswith("#/components/schemas/")
    # every code a node sends (tests/unit/test_session_channel_close_codes.py provokes each one)
    assert channel["x-rcq-close-codes"] == {str(code): text for code, text in sorted(CLOSE_CODES.items())}
    assert {"307", "400", "401", "503"} <= set(channel["x-rcq-upgrade-refusals"])
    assert set(channel["x-rcq-limits"]) == {"body_bytes_max", "session_in_flight_max", "session_idle_timeout_s",
                                            "session_channels_per_client_max", "session_unsent_bytes_max",
                                            "session_unsent_timeout_s"}


def test_the_committed_document_is_the_generated_one() -> None:
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert committed == asyncapi_spec(), f"docs/asyncapi.json is out of date: regenerate it with `{REGENERATE}`"


async def test_a_node_serves_the_document_with_its_url_and_limits() -> None:
    config = make_config(session_in_flight_max=7, session_idle_timeout_s=12.5)
    async with serving_node(config) as url, aiohttp.ClientSession() as http, \
            http.get(f"{url}/v1/asyncapi.json") as response:
        assert response.status == 200
        served = await response.json()
    limits = served["channels"][CHANNEL]["x-rcq-limits"]
    assert (limits["session_in_flight_max"]["value"], limits["session_idle_timeout_s"]["value"]) == (7, 12.5)
    assert served["servers"]["node"]["host"] == urlsplit(config.url).netloc  # the URL it advertises
    assert served["servers"]["node"]["protocol"] == "ws"
    assert served["components"] == asyncapi_spec()["components"]
    assert served["operations"] == asyncapi_spec()["operations"]
