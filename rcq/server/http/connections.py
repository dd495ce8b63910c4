"""HTTP connection limits: a cap on open connections, a request-head deadline, a body deadline.

One client holding many idle connections, or sending heads or bodies byte by byte (slowloris),
must not use up the node's file descriptors: Raft's peer connections, the journal and the
snapshot live in the same process. What aiohttp 3.x offers is used as is: the size of a
request head is bounded by default (``max_line_size``, ``max_field_size``, ``max_headers``), and
``keepalive_timeout`` (set to ``http_keepalive_s``) closes a connection still waiting for a
complete head that long after connect or after its last response. What it lacks is here:

* :class:`ConnectionLimiter`, the protocol factory of the node's listening socket, wrapping
  aiohttp's (``runner.server``). Every accepted connection gets a :class:`_Connection`: while
  fewer than ``connections_max`` are open it hands the connection to aiohttp's
  ``RequestHandler``; past the cap it answers ``503 too_many_connections`` with ``Retry-After``
  and closes, before any request handling, so a flood costs one descriptor per refused
  connection for a moment and existing connections keep being served. The count is of
  ``connection_made``/``connection_lost`` pairs, which asyncio always delivers in pairs;
* the head deadline: a connection must deliver a complete request head within
  ``http_header_timeout_s`` of connecting, or of the first byte of its next request after a
  response (the idle wait between requests is ``http_keepalive_s``, aiohttp's), or be closed;
* :func:`read_body`: a request body not fully read within ``http_body_timeout_s`` is answered
  ``408 request_timeout`` and its connection closed;
* :class:`HttpListener`: the listening socket with all of the above, for :class:`~rcq.server.node.Node`.

The cap defaults to three quarters of the process's ``RLIMIT_NOFILE`` soft limit; the rest is
left to Raft, the journal, the snapshot and the logs. Refused connections take some of it for a
moment: asyncio accepts up to ``backlog`` connections per loop iteration before any protocol
runs, so the backlog is an eighth of the rest, and a refused connection lingers (at most
``REFUSAL_LINGER_S``, until its request arrives, so that closing does not reset the connection
and lose the 503) only while fewer than another eighth do. Should ``accept()`` still fail with
EMFILE (a cap set above the limit), asyncio logs it, stops accepting for a second, then tries
again; open connections are served meanwhile, but Raft, which opens files too (pysyncobj's tick
thread fails when it cannot), is not safe there: that is what the reserve is for. (A retry that
finds the listener closed is asyncio's own harmless mistake: see :class:`HttpListener`.)

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from rcq.errors import InvalidRequest, RequestTimeout, TooManyConnections
from rcq.server.config import NodeConfig
from rcq.server.http.peer_faults import SERVER_LOGGER, peer_fault
from rcq.server.security.tls import server_context

log = logging.getLogger(__name__)

ACCEPT_PAUSED = "socket.accept() out of system resource"  # asyncio's message; it retries a second later
ACCEPT_BACKLOG_MAX = 1024
ACCEPT_BACKLOG_MIN = 16
REFUSAL_LINGER_S = 0.25  # a refused connection that sent nothing is closed after this (FIN, not RST)
REFUSAL_REPORT_INTERVAL_S = 10.0
NOFILE_UNLIMITED = 1 << 20  # stands in for an infinite RLIMIT_NOFILE

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def _refusal_bytes() -> bytes:
    body = json.dumps(TooManyConnections().to_body(), separators=(",", ":")).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


REFUSAL = _refusal_bytes()


# ------------------------------------------------------------------ sizing
def nofile_soft_limit() -> int:
    """This process's open-file soft limit (RLIMIT_NOFILE)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NOFILE_UNLIMITED if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def connections_max_for(config: NodeConfig, nofile: int) -> int:
    """``http_connections_max``, or three quarters of ``nofile`` when it is None."""
    if config.http_connections_max is not None:
        return config.http_connections_max
    return max(1, nofile * 3 // 4)


def accept_backlog(connections_max: int, nofile: int) -> int:
    """listen() backlog, which is also how many connections asyncio accepts per loop iteration:
    an eighth of the descriptors the cap leaves free, within [16, 1024]."""
    return max(ACCEPT_BACKLOG_MIN, min(ACCEPT_BACKLOG_MAX, (nofile - connections_max) // 8))


def runner_options(config: NodeConfig) -> dict[str, Any]:
    """aiohttp's own settings for the node's AppRunner."""
    # handler_cancellation stays off (aiohttp's default): a handler whose client went away runs to
    # its end (bounded by dequeue_wait_max_ms and commit_timeout_s) rather than being cancelled at
    # any await of the transaction manager; its descriptor is released at disconnect either way.
    # logger: requests the peer broke are logged at INFO, not as ERROR tracebacks (peer_faults).
    return {"keepalive_timeout": config.http_keepalive_s, "logger": SERVER_LOGGER}


# ------------------------------------------------------------------ body deadline
async def read_body(request: web.BaseRequest, timeout_s: float) -> bytes:
    """The request's whole body (``request.read()``, so ``client_max_size`` still applies).

    Raises :class:`~rcq.errors.InvalidRequest` (400) for a body aiohttp cannot decode (a broken
    chunked or content encoding), :class:`~rcq.errors.RequestTimeout` (408) if it is not all read within ``timeout_s``;
    the connection is then closed right after that answer, without reading the rest of the body.
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except RequestPayloadError as exc:  # e.g. Content-Encoding: gzip over bytes that are not gzip
        fault = peer_fault(exc)
        raise InvalidRequest(f"the request body cannot be read: {fault.message if fault else exc}") from None
    except TimeoutError:
        # RequestHandler.close(): no further request on this connection, which is closed once the
        # answer is written. Ending the payload spares aiohttp's lingering read of the rest of
        # the body (up to lingering_time) before it closes.
        request.protocol.close()
        request.content.feed_eof()
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s "
                             "(http_body_timeout_s); the connection is closed") from None


# ------------------------------------------------------------------ the protocol factory
class ConnectionLimiter:
    """Protocol factory for ``loop.create_server``: aiohttp's ``server`` behind a connection cap
    and a request-head deadline (see the module docstring)."""

    def __init__(self, server: web.Server, *, connections_max: int, header_timeout_s: float,
                 lingering_refusals_max: int) -> None:
        self._server = server
        self.connections_max = connections_max
        self.header_timeout_s = header_timeout_s
        self.lingering_refusals_max = lingering_refusals_max
        self.admitted: dict[web.RequestHandler, _Connection] = {}
        self.lingering: set[_Connection] = set()  # refused, answered, waiting a moment to close
        self.refused_total = 0
        self.header_timeouts_total = 0
        self._refused_unreported = 0
        self._next_report = 0.0
        # A RequestHandler takes server.request_handler when created: wrap it before the first one.
        server.request_handler = self._tracking(server.request_handler)

    def __call__(self) -> _Connection:
        return _Connection(self)

    def new_handler(self) -> web.RequestHandler:
        return self._server()

    @property
    def open_count(self) -> int:
        """Admitted connections open now."""
        return len(self.admitted)

    def close_refused(self) -> None:
        """Close refused connections still lingering (admitted ones are aiohttp's to shut down)."""
        for connection in list(self.lingering):
            connection.close_now()

    def _tracking(self, handle: Handler) -> Handler:
        admitted = self.admitted

        async def tracked(request: web.BaseRequest) -> web.StreamResponse:
            connection = admitted.get(request.protocol)
            if connection is None:
                return await handle(request)
            connection.request_started()
            try:
                return await handle(request)
            finally:
                connection.request_finished()

        return tracked

    def note_refusal(self) -> None:
        self.refused_total += 1
        self._refused_unreported += 1
        now = time.monotonic()
        if now >= self._next_report:
            log.warning("HTTP connection cap reached (%d open, http_connections_max %d): refused %d "
                        "new connection(s) since the last report", self.open_count, self.connections_max,
                        self._refused_unreported)
            self._refused_unreported = 0
            self._next_report = now + REFUSAL_REPORT_INTERVAL_S


class _Connection(asyncio.Protocol):
    """One accepted connection: refused, or admitted and handed to aiohttp's RequestHandler, whose
    protocol methods it forwards while it keeps the head deadline.

    The deadline costs a timer per connection, not per request: a head's start is a timestamp
    (``_head_since``), and the one timer, when it fires, closes the connection if the head it
    waits for is late, or else waits again until that head's deadline (as aiohttp's keep-alive
    timer does). Requests back to back on a kept-alive connection arm and cancel nothing."""

    def __init__(self, limiter: ConnectionLimiter) -> None:
        self._limiter = limiter
        self._transport: asyncio.Transport | None = None
        self._handler: web.RequestHandler | None = None
        self._timer: asyncio.TimerHandle | None = None  # the head deadline's, or a refusal's linger
        self._head_since: float | None = None  # when the awaited head began to arrive; None: none awaited
        self._busy = False  # a request of this connection is in its handler

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        limiter = self._limiter
        if limiter.open_count >= limiter.connections_max:
            self._refuse()
            return
        handler = limiter.new_handler()
        self._handler = handler
        limiter.admitted[handler] = self
        handler.connection_made(transport)
        self._head_started()

    def data_received(self, data: bytes) -> None:
        if self._handler is None:  # refused: its request has been read, so closing sends FIN
            self.close_now()
            return
        if not self._busy and self._head_since is None:  # the first byte of a new request head
            self._head_started()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self._handler is not None:
            self._handler.eof_received()
        return None  # as aiohttp's: the transport closes itself

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._transport = None
        handler = self._handler
        if handler is None:
            self._limiter.lingering.discard(self)
            return
        self._limiter.admitted.pop(handler, None)
        handler.connection_lost(exc)

    # ------------------------------------------------------------ requests
    def request_started(self) -> None:
        """Its head is complete and handled: no deadline while the handler runs (the timer, if
        armed, finds nothing awaited when it fires)."""
        self._busy = True
        self._head_since = None

    def request_finished(self) -> None:
        # The next head is timed from its first byte; until then the connection is idle, which
        # aiohttp's keepalive_timeout bounds.
        self._busy = False

    # ------------------------------------------------------------ internals
    def close_now(self) -> None:
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    def _refuse(self) -> None:
        limiter = self._limiter
        limiter.note_refusal()
        assert self._transport is not None
        self._transport.write(REFUSAL)
        if len(limiter.lingering) >= limiter.lingering_refusals_max:
            self._transport.close()
            return
        # Wait a moment for the request to read it before closing: closing with unread bytes
        # would reset the connection, and the client could lose the 503.
        limiter.lingering.add(self)
        self._timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, self.close_now)

    def _head_started(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_since = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(self._head_since + self._limiter.header_timeout_s, self._head_deadline)

    def _head_deadline(self) -> None:
        self._timer = None
        if self._busy or self._head_since is None or self._transport is None:
            return  # no head awaited: the next one arms the timer again
        loop = asyncio.get_running_loop()
        deadline = self._head_since + self._limiter.header_timeout_s
        if loop.time() < deadline:  # a later head than the one this timer was set for
            self._timer = loop.call_at(deadline, self._head_deadline)
            return
        self._limiter.header_timeouts_total += 1
        log.debug("closing an HTTP connection from %s: no complete request head within %g s",
                  self._transport.get_extra_info("peername"), self._limiter.header_timeout_s)
        self._transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# ------------------------------------------------------------------ the listening socket
class HttpListener:
    """The node's HTTP listening socket: the runner's aiohttp server behind a ConnectionLimiter.

    Replaces ``web.TCPSite`` (which would hand the runner's server to asyncio directly): call
    :meth:`start` after ``runner.setup()``; :meth:`close` before ``runner.cleanup()`` (which
    shuts the admitted connections down), :meth:`wait_closed` after.

    A workaround lives here (docs/dependency-workarounds.md): after an EMFILE, asyncio stops
    watching the socket and calls ``_start_serving`` on it a second later, without checking that
    the socket is still open. Closed meanwhile (the node stopping), that call raises ``ValueError:
    Invalid file descriptor: -1``, which the loop logs at ERROR with a traceback. The listener's
    loop exception handler recognises exactly that (a pause on this socket before it closed, then
    that error from that callback) and logs one INFO line instead; everything else goes on to the
    handler that was there before.
    """

    def __init__(self, runner: web.AppRunner, config: NodeConfig) -> None:
        self._runner = runner
        self._config = config
        self._server: asyncio.Server | None = None
        self.limiter: ConnectionLimiter | None = None
        self.port: int | None = None
        self._accept_paused = False  # asyncio met EMFILE on this socket: a retry may be pending
        self._closed_while_paused = False

    async def start(self) -> int:
        """Listen; returns the bound port (``http_port`` 0 binds a free one)."""
        server = self._runner.server
        if server is None:
            raise RuntimeError("call runner.setup() before HttpListener.start()")
        config = self._config
        nofile = nofile_soft_limit()
        connections_max = connections_max_for(config, nofile)
        if connections_max * 4 > nofile * 3:
            log.warning("http_connections_max %d leaves less than a quarter of the open-file limit (%d) "
                        "to Raft, the journal and the snapshot; accept() may fail with EMFILE",
                        connections_max, nofile)
        self.limiter = ConnectionLimiter(
            server, connections_max=connections_max, header_timeout_s=config.http_header_timeout_s,
            lingering_refusals_max=max(1, (nofile - connections_max) // 8))
        loop = asyncio.get_running_loop()
        tls = server_context(config)
        self._server = await loop.create_server(
            self.limiter, config.http_host, config.http_port, backlog=accept_backlog(connections_max, nofile),
            ssl=tls, ssl_handshake_timeout=config.http_header_timeout_s if tls is not None else None)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1]) if sockets else config.http_port
        loop.set_exception_handler(self._exception_handler(loop.get_exception_handler(),
                                                           {sock.fileno() for sock in sockets}))
        log.info("HTTP%s: at most %d connections (open-file limit %d), head within %g s, body within %g s, "
                 "idle keep-alive %g s", "S (TLS)" if tls is not None else "", connections_max, nofile,
                 config.http_header_timeout_s, config.http_body_timeout_s, config.http_keepalive_s)
        return self.port

    def _exception_handler(self, previous: Any, fds: set[int]) -> Any:
        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            sock = context.get("socket")
            if context.get("message") == ACCEPT_PAUSED and sock is not None and sock.fileno() in fds:
                self._accept_paused = True
            elif (self._closed_while_paused and isinstance(context.get("exception"), ValueError)
                  and "._start_serving(" in repr(context.get("handle"))):
                log.info("asyncio's accept() retry found the HTTP listener closed (harmless: it had "
                         "paused accepting, out of descriptors, before the node closed it)")
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        return handle

    def close(self) -> None:
        """Stop accepting; close refused connections still lingering."""
        if self._server is not None:
            self._closed_while_paused = self._accept_paused
            self._server.close()
        if self.limiter is not None:
            self.limiter.close_refused()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
