"""The HTTP API v1: ``create_app()`` and the one middleware every request goes through.

Thin by design: parse and validate (pydantic), call the TransactionManager or read the state
machine, render JSON. The routes live by job in ``transaction_routes``, ``queue_routes``,
``cluster_routes`` and ``membership_routes``, sharing ``handlers``; what a verb does apart from
HTTP is in ``operations``. Every failure becomes ``{"error": {...}}`` with the status of its
:mod:`rcq.errors` class. A follower relays leader-only requests to the leader over HTTP and
answers with the leader's answer (:mod:`~rcq.server.http.forwarding`); a client that asks for it
(``Rcq-Redirect: 1``) gets 307 and the leader's URL instead (``Location`` and
``error.leader_url``). Raft never forwards a command.

The middleware authenticates (:func:`~rcq.server.http.auth.authenticate`), renders errors, turns
``NotLeader`` into a forward or a 307 (and ``WrongPartition`` into a forward to another
partition's leader or a 421, rcq.server.http.partition_routes), and counts and times each request
(:meth:`~rcq.server.http.metrics.NodeMetrics.observe_request`): one layer, where nested ones cost
a coroutine frame, a call and a ``try`` each per request.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.typedefs import Middleware

from rcq.errors import (
    InternalError,
    MethodNotAllowed,
    NotLeader,
    PayloadTooLarge,
    RcqError,
    RouteNotFound,
    WrongPartition,
)
from rcq.server.config import NodeConfig
from rcq.server.http import (
    cluster_routes,
    feature_level_routes,
    membership_routes,
    partition_ops_routes,
    queue_routes,
    readiness,
    session_channel,
    transaction_routes,
)
from rcq.server.http.auth import authenticate, authenticate_cluster_call
from rcq.server.http.feature_level_routes import FEATURE_LEVELS, make_survey
from rcq.server.http.forwarding import Forwarder
from rcq.server.http.handlers import (
    CONFIG,
    MANAGER,
    METRICS,
    PARTITION_CONTROLLER,
    PARTITION_HOST,
    REPLICATOR,
    TOKENS,
    Handler,
    error_response,
)
from rcq.server.http.membership_routes import MEMBERSHIP, make_probe
from rcq.server.http.metrics import NodeMetrics
from rcq.server.http.partition_control import PartitionCalls
from rcq.server.http.partition_metrics import PartitionCollector
from rcq.server.http.partition_routes import PARTITION_DIRECTORY, PARTITION_ROUTER, add_partition_routes
from rcq.server.leader.feature_levels import FeatureLevels
from rcq.server.leader.membership import Membership
from rcq.server.leader.partition_controller import PartitionController
from rcq.server.leader.partition_directory import PartitionDirectory
from rcq.server.leader.storage_sharing import LocalP0, StorageSharing
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator, known_nodes
from rcq.server.security.tls import peer_context
from rcq.tokens import TokenRegistry

log = logging.getLogger(__name__)


def request_middleware(metrics: NodeMetrics, tokens: TokenRegistry, forwarder: Forwarder | None = None) -> Middleware:
    """Authentication, errors as JSON, and the request counted (with the status it is answered
    with, rendered errors included) and timed, for every request. With a ``forwarder``, a
    leader-only request on a follower is forwarded to the leader (or redirected, if it asks), and a
    forwarded request takes the caller a member vouches for; without one, it is always the 307."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        status = 500  # what a cancelled request is counted as
        try:
            try:
                if forwarder is not None:
                    request = forwarder.trusted(request)
                config = request.app.get(CONFIG)
                if config is None or not await authenticate_cluster_call(request, config):
                    authenticate(request, tokens)
                response = await handler(request)
            except NotLeader as exc:
                response = (await forwarder.answer(request, exc) if forwarder is not None
                            else error_response(exc, request))
            except WrongPartition as exc:
                router = request.app.get(PARTITION_ROUTER)
                response = await router.answer(request, exc) if router is not None else error_response(exc, request)
            except RcqError as exc:
                response = error_response(exc, request)
            except web.HTTPException as exc:
                status = exc.status
                response = _http_error_response(exc, request)
            except Exception:
                log.exception("unexpected error in %s %s", request.method, request.path)
                response = error_response(InternalError())
            status = response.status
            return response
        finally:
            metrics.observe_request(request, status, started)

    return middleware


def _http_error_response(exc: web.HTTPException, request: web.Request) -> web.Response:
    """aiohttp's own refusals that rcq answers with its JSON errors; any other is re-raised, for
    aiohttp to answer (redirects and the like)."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return error_response(PayloadTooLarge(f"request body over the limit: {exc.text}"))
    if isinstance(exc, web.HTTPNotFound):
        return error_response(RouteNotFound(f"no endpoint {request.method} {request.path}"))
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}"))
    raise exc


def create_app(config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> web.Application:
    metrics = NodeMetrics(config, manager, replicator)
    tokens = TokenRegistry(config.tokens, config.tokens_file)
    peer_tls = peer_context(config)
    forwarder = Forwarder(config, peer_tls, metrics.registry, directory=lambda: known_nodes(config, replicator))
    app = web.Application(middlewares=[request_middleware(metrics, tokens, forwarder)],
                          client_max_size=config.body_bytes_max)
    app.on_cleanup.append(forwarder.close)
    app[CONFIG] = config
    app[MANAGER] = manager
    app[REPLICATOR] = replicator
    app[METRICS] = metrics
    app[TOKENS] = tokens
    app[MEMBERSHIP] = Membership(config, manager, replicator,
                                 make_probe(peer_tls, lambda: replicator.read(lambda sm: sm.level),
                                            lambda: replicator.read(lambda sm: sm.cluster_id)))
    app[FEATURE_LEVELS] = FeatureLevels(config, manager, replicator, app[MEMBERSHIP], make_survey(app, peer_tls))
    membership = app[MEMBERSHIP]
    directory = PartitionDirectory(config, replicator, manager.entry_stamp,
                                   lambda: [m.node_id for m in membership.members()], app[FEATURE_LEVELS].active,
                                   app[FEATURE_LEVELS].require)
    app[PARTITION_DIRECTORY] = directory
    app[FEATURE_LEVELS].on_turn.append(directory.record_ports)
    cluster_routes.add_routes(app)
    membership_routes.add_routes(app)
    feature_level_routes.add_routes(app)
    transaction_routes.add_routes(app)
    queue_routes.add_routes(app)
    session_channel.add_routes(app)
    add_partition_routes(app, peer_tls, forwarder)
    if config.partition_name is None:
        _add_partition_controller(app, directory)
    metrics.registry.register(PartitionCollector(
        lambda: app[PARTITION_HOST].status() if PARTITION_HOST in app else {},
        lambda: app.get(PARTITION_CONTROLLER), lambda: manager.serving and replicator.is_leader()))
    readiness.add_routes(app)
    return app


def _add_partition_controller(app: web.Application, directory: PartitionDirectory) -> None:
    """p0's controller of the other partitions (rcq.server.leader.partition_controller): it acts
    only while this node is p0's serving leader, and shares every node's memory budget between
    the partitions it hosts (rcq.server.leader.storage_sharing)."""
    config, manager, replicator = app[CONFIG], app[MANAGER], app[REPLICATOR]
    read = lambda: replicator.read(lambda sm: sm.directory.copy())  # noqa: E731
    calls = PartitionCalls(app, read)
    sharing = StorageSharing(LocalP0(config, manager, replicator), calls)
    manager.on_serving.append(lambda: sharing.began_serving(replicator.read(lambda sm: sm.directory.copy())))
    controller = PartitionController(lambda: manager.serving and replicator.is_leader(), read,
                                     lambda: [m.node_id for m in app[MEMBERSHIP].members()],
                                     calls, balance=config.balance_leaders,
                                     hold_s=config.balance_hold_s, sharing=sharing)
    partition_ops_routes.add_routes(app, controller)

    async def start(app: web.Application) -> None:
        controller.start()

    async def stop(app: web.Application) -> None:
        await controller.stop()

    app.on_startup.append(start)
    app.on_cleanup.insert(0, stop)
