"""The AsyncAPI 3.0 description of the session channel (``GET /v1/session``), generated from the
pydantic models the channel validates its frames with.

One message per request ``op``: the sub-request model of ``POST /v1/batch`` that the channel's
frame union (:data:`~rcq.server.http.session_channel.FRAME`) picks for that ``op``, or
:class:`~rcq.server.http.session_channel.ChannelBatch`, with the frame's ``id`` added; then the
answer, and the error frame a node sends for what it cannot attribute to a request. The
operations are the node's: it receives the requests and sends the answers. Close codes, limits,
the subprotocol and the upgrade's refusals are in the channel's description and its ``x-rcq-*``
fields. :func:`asyncapi_spec` without a config is the document committed as ``docs/asyncapi.json``
(its limits the defaults; ``python -m rcq.server.http.asyncapi > docs/asyncapi.json`` writes it);
``GET /v1/asyncapi.json`` serves it with the node's own URL and limits. A test checks the messages
against the frame union both ways.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import json
from typing import Any, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, create_model
from pydantic.json_schema import models_json_schema

from rcq.server.config import NodeConfig
from rcq.server.http.models import BatchOperation, ErrorBody
from rcq.server.http.openapi import API_VERSION
from rcq.server.http.session_channel import (
    CLOSE_CODES,
    FRAME_ID_MAX,
    PATH,
    SUBPROTOCOL,
    ChannelBatch,
)

CHANNEL = "session"
RECEIVE = "receiveRequest"  # the node receives request frames...
SEND = "sendAnswer"  # ...and sends answer frames
ANSWER = "answer"
ERROR_FRAME = "unattributedError"
ID_DESCRIPTION = f"chosen by the client: an integer 1..{FRAME_ID_MAX}, unique among the channel's requests in flight"

UPGRADE_REFUSALS: dict[int, str] = {
    307: "not_leader: a follower; error.leader_url in the body names the leader, and there is no Location "
         "header (a WebSocket client would follow it and drop the token)",
    400: "invalid_request: not a WebSocket upgrade",
    401: "a valid token is needed", 403: "the token does not grant this",
    404: "route_not_found: a node too old to have the channel (use HTTP)",
    429: "too_many_requests", 503: "no_leader / not_ready, or too_many_connections past "
                                   "session_channels_per_client_max",
}
LIMITS: dict[str, str] = {
    "body_bytes_max": "largest frame (bytes); a larger one closes the channel with 1009",
    "session_in_flight_max": "requests in flight per channel; past it the node stops reading the channel "
                             "until answers go out (back-pressure), it refuses nothing",
    "session_idle_timeout_s": "a channel with nothing in flight and no frame this long is closed (1000)",
    "session_channels_per_client_max": "channels one client may hold open; past it the upgrade gets 503",
    "session_unsent_bytes_max": "answer bytes written to a channel and not yet taken by its client; past it the "
                                "node stops reading the channel until they are taken",
    "session_unsent_timeout_s": "unsent answers past session_unsent_bytes_max this long: the channel is closed "
                                "(4000); a close not taken within as long again (at least 5 s) ends the connection",
}

# One valid request of each op (without its id): the documented messages' examples.
_TX = "1f.0123456789abcdef01234567"
EXAMPLES: dict[str, dict[str, Any]] = {
    "begin": {"op": "begin", "timeout_s": 30, "label": "import"},
    "enqueue": {"op": "enqueue", "transaction_id": _TX, "queue": "jobs",
                "items": ["hello", {"value": "traced", "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-"
                                                                                 "b7ad6b7169203331-01"}}]},
    "dequeue": {"op": "dequeue", "transaction_id": _TX, "queue": "jobs", "max_items": 10, "wait_ms": 5000},
    "commit": {"op": "commit", "transaction_id": _TX, "idempotency_key": "import-7"},
    "abort": {"op": "abort", "transaction_id": _TX},
    "extend": {"op": "extend", "transaction_id": _TX, "timeout_s": 60},
    "status": {"op": "status", "transaction_id": _TX},
    "execute": {"op": "execute", "operations": [{"op": "enqueue", "queue": "jobs", "items": ["a", "b"]}],
                "idempotency_key": "batch-42"},
    "commit_many": {"op": "commit_many", "transaction_ids": [_TX, "20.0123456789abcdef01234567"]},
    "reject": {"op": "reject", "transaction_id": _TX, "queue": "jobs", "item_ids": [7], "reason": "unparseable"},
    "receive": {"op": "receive", "queue": "jobs", "max_items": 10, "wait_ms": 20000},
    "batch": {"op": "batch", "requests": [{"op": "begin"}, {"op": "receive", "queue": "jobs", "wait_ms": 1000}]},
}


class Answer(BaseModel):
    """The answer to the request with this ``id``: the status and body HTTP would answer."""

    id: int = Field(ge=1, le=FRAME_ID_MAX, description="the request's id")
    status: int = Field(ge=200, le=599, description=(
        "the HTTP status the same request would get; 421 wrong_partition for a request another partition "
        "runs, as a channel is not forwarded: its body names the partition and, when known, its leader's "
        "URL, where a channel of its own goes (docs/partitions.md)"))
    body: ErrorBody | dict[str, Any] = Field(
        description="the JSON body HTTP would answer; an error is the rcq error body; the answer to a "
                    "'batch' is {\"responses\": [{\"status\", \"body\"}, ...]}, one per sub-request")


class UnattributedError(BaseModel):
    """What a node sends when no request is to blame: a frame it cannot attribute (not JSON, not an
    object, no valid id: 400, the channel stays open), or the channel's token revoked or expired
    (401, then close 1008)."""

    id: None = Field(description="null: no request")
    status: int = Field(ge=400, le=499)
    body: ErrorBody


def request_models() -> dict[str, type[BaseModel]]:
    """op -> the model a request frame of that op is validated into (the frame union's members)."""
    union, _field = get_args(BatchOperation)
    models: list[type[BaseModel]] = [*get_args(union), ChannelBatch]
    return {get_args(model.model_fields["op"].annotation)[0]: model for model in models}


def frame_model(model: type[BaseModel]) -> type[BaseModel]:
    """``model`` with the frame's ``id``."""
    frame: type[BaseModel] = create_model(f"{model.__name__}Frame", __base__=model,
                                          id=(int, Field(ge=1, le=FRAME_ID_MAX, description=ID_DESCRIPTION)))
    frame.__doc__ = model.__doc__
    return frame


def asyncapi_spec(config: NodeConfig | None = None) -> dict[str, Any]:
    """The document; ``config``: a node's (its URL as the server, its limits), else the defaults."""
    frames = {op: frame_model(model) for op, model in request_models().items()}
    models: list[type[BaseModel]] = [*frames.values(), Answer, UnattributedError]
    refs, definitions = models_json_schema([(m, "validation") for m in models],
                                           ref_template="#/components/schemas/{model}")
    schemas = {name: _asyncapi_schema(schema) for name, schema in definitions.get("$defs", {}).items()}
    for frame in frames.values():
        _id_first(schemas[frame.__name__])
    messages: dict[str, Any] = {op: _message(op, f"the '{op}' request", refs[(frame, "validation")],
                                             [{"id": index, **EXAMPLES[op]}])
                                for index, (op, frame) in enumerate(frames.items(), start=1)}
    messages[ANSWER] = _message(ANSWER, Answer.__doc__ or "", refs[(Answer, "validation")], [
        {"id": 2, "status": 200, "body": {"transaction_id": _TX, "queue": "jobs", "enqueued": 1}},
        {"id": 3, "status": 404, "body": {"error": {"code": "transaction_not_found", "message": "no transaction "
                                                    + _TX, "retryable": False, "maybe_committed": False}}}])
    messages[ERROR_FRAME] = _message(ERROR_FRAME, UnattributedError.__doc__ or "",
                                     refs[(UnattributedError, "validation")], [
        {"id": None, "status": 400, "body": {"error": {"code": "invalid_request", "message": "a frame is one JSON "
                                                       "object: this one is not JSON", "retryable": False,
                                                       "maybe_committed": False}}}])
    channel_messages = {name: {"$ref": f"#/components/messages/{name}"} for name in messages}
    requests = [{"$ref": f"#/channels/{CHANNEL}/messages/{op}"} for op in frames]
    answers = [{"$ref": f"#/channels/{CHANNEL}/messages/{name}"} for name in (ANSWER, ERROR_FRAME)]
    security = [{"$ref": "#/components/securitySchemes/token"}, {"$ref": "#/components/securitySchemes/basic"}]
    limits = {name: getattr(config, name) if config is not None else NodeConfig.model_fields[name].default
              for name in LIMITS}
    spec: dict[str, Any] = {
        "asyncapi": "3.0.0",
        "info": {"title": "rcq session channel", "version": API_VERSION, "description": _description(limits)},
        "defaultContentType": "application/json",
        "channels": {CHANNEL: {
            "address": PATH, "title": "The session channel", "messages": channel_messages,
            "description": "Text frames, one JSON object each. Close codes: " + "; ".join(
                f"{code} {text}" for code, text in sorted(CLOSE_CODES.items())) + ".",
            "bindings": {"ws": {"method": "GET", "bindingVersion": "0.1.0", "headers": {
                "type": "object", "properties": {
                    "Authorization": {"type": "string", "description": "Bearer <token> (or Basic, the token as "
                                                                       "the password); not on a node without tokens"},
                    "Sec-WebSocket-Protocol": {"type": "string", "const": SUBPROTOCOL,
                                               "description": "the subprotocol; the node selects it"}}}}},
            "x-rcq-close-codes": {str(code): text for code, text in sorted(CLOSE_CODES.items())},
            "x-rcq-upgrade-refusals": {str(status): text for status, text in sorted(UPGRADE_REFUSALS.items())},
            "x-rcq-limits": {name: {"value": limits[name], "description": text} for name, text in LIMITS.items()},
            "x-rcq-subprotocol": SUBPROTOCOL,
        }},
        "operations": {
            RECEIVE: {"action": "receive", "channel": {"$ref": f"#/channels/{CHANNEL}"},
                      "summary": "A request from the client: a sub-request of POST /v1/batch plus its id",
                      "messages": requests, "security": security,
                      "reply": {"channel": {"$ref": f"#/channels/{CHANNEL}"}, "messages": answers[:1]}},
            SEND: {"action": "send", "channel": {"$ref": f"#/channels/{CHANNEL}"},
                   "summary": "One answer per request, in any order; an id-null error for what no request "
                              "is to blame", "messages": answers, "security": security},
        },
        "components": {"schemas": schemas, "messages": messages, "securitySchemes": {
            "token": {"type": "http", "scheme": "bearer", "description": "an rcq API token, at the upgrade"},
            "basic": {"type": "http", "scheme": "basic", "description": "the token as the password"}}},
    }
    if config is not None:
        url = urlsplit(config.url)
        spec["servers"] = {"node": {"host": url.netloc, "protocol": "wss" if url.scheme == "https" else "ws",
                                    "description": "this node (the channel is served by the leader)",
                                    "security": security}}
    return spec


def _description(limits: dict[str, Any]) -> str:
    return (f"GET {PATH} upgraded to a WebSocket (subprotocol {SUBPROTOCOL}) on the leader. Each text frame "
            "is one request: a sub-request of POST /v1/batch (same fields, same op) plus an integer id, or "
            "op 'batch' carrying a whole /v1/batch; each gets one answer frame {id, status, body} with the "
            "status and body HTTP would answer, in any order. Limits: " + "; ".join(
                f"{name} ({limits[name]}): {text}" for name, text in LIMITS.items()) + ".")


def _message(name: str, summary: str, payload: dict[str, Any], examples: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "title": name, "summary": " ".join(summary.split()), "contentType": "application/json",
            "payload": payload, "examples": [{"payload": example} for example in examples]}


def _id_first(schema: dict[str, Any]) -> None:
    """The frame's id, then its op, first among the properties and required fields (for readers)."""
    properties = schema["properties"]
    schema["properties"] = {**{key: properties[key] for key in ("id", "op")}, **properties}
    schema["required"] = ["id", *(key for key in schema.get("required", []) if key != "id")]


def _asyncapi_schema(node: Any) -> Any:
    """A pydantic JSON schema as an AsyncAPI schema: a discriminator is the property's name there."""
    if isinstance(node, list):
        return [_asyncapi_schema(value) for value in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _asyncapi_schema(value) for key, value in node.items()}
    if isinstance(converted.get("discriminator"), dict):
        converted["discriminator"] = converted["discriminator"]["propertyName"]
    return converted


def main() -> None:
    """Print the document as committed in ``docs/asyncapi.json``."""
    print(json.dumps(asyncapi_spec(), indent=2))


if __name__ == "__main__":
    main()
