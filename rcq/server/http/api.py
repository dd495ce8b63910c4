"""The HTTP API v1: ``create_app()``, its middlewares, and the error middleware.

Thin by design: parse and validate (pydantic), call the TransactionManager or read the state
machine, render JSON. The routes live by job in ``transaction_routes``, ``queue_routes``,
``cluster_routes`` and ``membership_routes``, sharing ``handlers``; what a verb does apart from
HTTP is in ``operations``. Every failure becomes ``{"error": {...}}`` with the status of its
:mod:`rcq.errors` class. A follower answers leader-only requests with 307 and the leader's URL
(``Location`` and ``error.leader_url``): clients re-send to the leader themselves; Raft never
forwards a command for them.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from rcq.errors import InternalError, MethodNotAllowed, PayloadTooLarge, RcqError, RouteNotFound
from rcq.server.config import NodeConfig
from rcq.server.http import cluster_routes, membership_routes, queue_routes, session_channel, transaction_routes
from rcq.server.http.auth import auth_middleware
from rcq.server.http.handlers import CONFIG, MANAGER, METRICS, REPLICATOR, TOKENS, Handler, error_response
from rcq.server.http.membership_routes import MEMBERSHIP, make_probe
from rcq.server.http.metrics import NodeMetrics
from rcq.server.leader.membership import Membership
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator
from rcq.server.security.tls import peer_context
from rcq.tokens import TokenRegistry

log = logging.getLogger(__name__)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RcqError as exc:
        return error_response(exc, request)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(PayloadTooLarge(f"request body over the limit: {exc.text}"))
    except web.HTTPNotFound:
        return error_response(RouteNotFound(f"no endpoint {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}"))
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(InternalError())


def create_app(config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> web.Application:
    metrics = NodeMetrics(config, manager, replicator)
    tokens = TokenRegistry(config.tokens, config.tokens_file)
    # The metrics middleware is outermost: it counts the status error_middleware answered with,
    # and error_middleware renders what authentication refuses.
    app = web.Application(middlewares=[metrics.middleware, error_middleware, auth_middleware(tokens)],
                          client_max_size=config.body_bytes_max)
    app[CONFIG] = config
    app[MANAGER] = manager
    app[REPLICATOR] = replicator
    app[METRICS] = metrics
    app[TOKENS] = tokens
    app[MEMBERSHIP] = Membership(config, manager, replicator, make_probe(peer_context(config)))
    cluster_routes.add_routes(app)
    membership_routes.add_routes(app)
    transaction_routes.add_routes(app)
    queue_routes.add_routes(app)
    session_channel.add_routes(app)
    return app
