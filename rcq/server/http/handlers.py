"""What every route handler shares: the app's typed keys, a body validated into its model, JSON
answers, errors rendered as JSON, who is calling, and the admin guard.

**One parser and one validation for every request**: an HTTP body and a session channel frame are
parsed by :func:`parse_json` (pydantic's parser, which refuses what cannot be encoded again, such
as a lone UTF-16 surrogate in any string) and validated by :func:`validate` (the model's Python
validation of the parsed value), so the two front doors refuse the same inputs with the same code.

The route modules (``transaction_routes``, ``queue_routes``, ``cluster_routes``,
``membership_routes``) import this; ``api`` puts them together into the app.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import pydantic_core
from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError

from rcq.errors import InvalidQueueName, InvalidRequest, NotLeader, RcqError, Unauthorized
from rcq.server.config import NodeConfig
from rcq.server.http.auth import CHALLENGE, principal_of
from rcq.server.http.connections import read_body
from rcq.server.http.metrics import NodeMetrics
from rcq.server.http.operations import Caller
from rcq.server.leader.partition_controller import PartitionController
from rcq.server.leader.transactions import TransactionManager
from rcq.server.partitions.host import PartitionHost
from rcq.server.raft.protocol import Replicator
from rcq.tokens import TokenRegistry

CONFIG = web.AppKey("config", NodeConfig)
MANAGER = web.AppKey("manager", TransactionManager)
REPLICATOR = web.AppKey("replicator", Replicator)
METRICS = web.AppKey("metrics", NodeMetrics)
TOKENS = web.AppKey("tokens", TokenRegistry)
# The node's partition processes (rcq.server.partitions.host), set by the node when it hosts any.
PARTITION_HOST = web.AppKey("partition_host", PartitionHost)
# p0's controller of the other partitions (rcq.server.leader.partition_controller), at a node's own port.
PARTITION_CONTROLLER = web.AppKey("partition_controller", PartitionController)

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# Answers, HTTP's and the session channel's alike, are written with orjson: 0.6 us for a dequeue
# answer of three items with a header each, against 5.6 us for the standard library's json (which
# was ~5% of a leader's busy samples under single-item load). What orjson cannot write (an integer
# beyond 64 bits) goes to json.
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # the fallback: json.dumps(..., separators) makes one per call
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS  # as json does: keys that are numbers become strings


def render_json(data: Any) -> bytes:
    """``data`` as compact UTF-8 JSON, as json would write it (non-ASCII as UTF-8, not escaped)."""
    try:
        return orjson.dumps(data, option=_ORJSON_OPTIONS)
    except TypeError:  # what orjson cannot write (an integer beyond 64 bits): json can
        return _ENCODER.encode(data).encode()


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=render_json(data), status=status, content_type="application/json")


def error_response(error: RcqError, request: web.Request | None = None) -> web.Response:
    response = json_response(error.to_body(), status=error.http_status)
    if isinstance(error, NotLeader) and error.leader_url and request is not None:
        response.headers["Location"] = error.leader_url.rstrip("/") + request.path_qs
    if error.retryable and error.http_status in (429, 503, 507):
        response.headers["Retry-After"] = "1"
    if isinstance(error, Unauthorized):
        response.headers["WWW-Authenticate"] = CHALLENGE
    return response


def parse_json(raw: str | bytes, what: str) -> Any:
    """``raw`` (UTF-8 JSON text) parsed; :class:`~rcq.errors.InvalidRequest` naming ``what`` if it is
    not JSON, is nested deeper than the parser allows, or holds a string that is not Unicode text
    (a lone surrogate): such a string could not be encoded again anywhere it would go."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError as exc:  # jiter's errors: "lone leading surrogate in hex escape at line 1 column 12"
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None


def validate(model: type[M] | TypeAdapter[Any], value: Any, what: str) -> Any:
    """``value`` (from :func:`parse_json`) validated into ``model``; the first problem named."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(value)
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid_body(what, exc) from exc


async def read_model(request: web.Request, model: type[M]) -> M:
    """The request's body validated into ``model`` (an empty body is ``{}``); the first problem named."""
    raw = await read_body(request, request.app[CONFIG].http_body_timeout_s)
    validated: M = validate(model, parse_json(raw or b"{}", "the request body"), model.__name__)
    return validated


def invalid_body(what: str, exc: ValidationError) -> InvalidRequest:
    """The error a body that fails validation gets: the first problem named, up to 20 listed."""
    problems = [{"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
                for e in exc.errors(include_url=False)[:20]]
    first = problems[0] if problems else {"field": "", "problem": "invalid"}
    error_class = InvalidQueueName if first["field"].split(".")[-1] == "queue" else InvalidRequest
    return error_class(f"invalid {what}: {first['field']}: {first['problem']}", details={"problems": problems})


def caller_of(request: web.Request) -> Caller:
    """Who is asking: the token's principal; per-client caps count the principal, or the peer
    address on a node without tokens (where every caller is the same anonymous principal)."""
    principal = principal_of(request)
    return Caller(principal, principal.name if principal.authenticated else request.remote or "")


def admin_only(what: str, handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        principal_of(request).require_admin(what)
        return await handler(request)

    return guarded
