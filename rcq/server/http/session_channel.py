"""The session channel: ``GET /v1/session``, a WebSocket carrying the hot verbs as pipelined frames.

Why over 400 lines: one class holds a channel's whole life (read, serve, answer, watch, close), whose parts share its state.

One HTTP request per operation costs a node (and its client) far more than the operation: the
head, the middlewares, a response. A channel pays that once. Each text frame is one request —
exactly a sub-request of ``POST /v1/batch`` (``op`` begin, enqueue, dequeue, commit, abort,
extend, status, execute, commit_many, reject, receive, or ``batch`` for a whole batch) plus an
``id`` the client chose — and gets one answer frame ``{"id", "status", "body"}`` with the status
and body HTTP would answer, in any order: many requests run at once, a waiting dequeue holds up
nothing else. The verbs are those of :mod:`~rcq.server.http.operations`, called as the batch
route calls them, so the channel is the same API with the same error codes, not a second semantics.
The protocol, its limits and close codes: ``docs/session-channel.md`` (and ``docs/asyncapi.json``).

The upgrade is an ordinary request: the token is checked then (the principal is bound to the
channel), a follower answers 307 with the leader's URL, and per-client caps apply. While the
channel is open, a timer looks once a second at what can end it: the token revoked or expired
(an error frame, then close 1008), this node no longer leading (close 1012 once in-flight requests
are answered), nothing happening for ``session_idle_timeout_s`` (close 1000), answers left unread (below). A
channel holds at most ``session_in_flight_max`` requests, each until its answer is written: past
it, the node stops reading that channel until answers go out (TCP back-pressure), it refuses
nothing. Answers the client does not take stay in the connection's write buffer, and aiohttp
waits for it to drain only about once per 64 KiB: so the node also stops reading while more than
``session_unsent_bytes_max`` bytes are unsent, and closes the channel (4000) when that lasts
``session_unsent_timeout_s``; a close not taken within as long again (at least 5 s) drops the connection. What
one client can make the node hold is bounded by configuration, whatever it does. When the node stops, :func:`close_all` ends every
channel the same way: frames that arrive from then on are refused (503, not run), what is in flight
is answered (up to ``LEADERSHIP_DRAIN_S``), then close 1001 (1012 if the node stopped leading).
Without it the node's HTTP shutdown would wait for each channel's handler, which a busy client
keeps busy for ever.

The close codes are listed here, beside the code that sends them.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Literal

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import BaseModel, TypeAdapter

from rcq.errors import InternalError, InvalidRequest, NotLeader, RcqError, TooManyConnections, Unavailable
from rcq.server.http import operations
from rcq.server.http.auth import presented_token
from rcq.server.http.channel_stats import ChannelStats
from rcq.server.http.dispatch import batch_answer, batch_operation
from rcq.server.http.handlers import (
    CONFIG,
    MANAGER,
    METRICS,
    TOKENS,
    caller_of,
    error_response,
    parse_json,
    render_json,
    validate,
)
from rcq.server.http.models import BatchOperation, BatchRequest

log = logging.getLogger(__name__)

PATH = "/v1/session"
SUBPROTOCOL = "rcq.session.v1"
FRAME_ID_MAX = (1 << 53) - 1  # what a JSON number holds exactly in every language
HOUSEKEEPING_INTERVAL_S = 1.0  # token, leadership, idleness and unsent answers are looked at this often
LEADERSHIP_DRAIN_S = 5.0  # after leadership ends, in-flight requests get this long to be answered
UNSENT_POLL_S = 0.02  # while a channel's unsent answers are past the bound, the reader looks this often
CLOSE_ANSWER_TIMEOUT_S = 10.0  # after its close frame, the node waits this long for the client's (aiohttp's default)
# The unsent answers and the close frame get at least this long to be taken: a client that stopped
# reading for a while and reads again is noticed by the node's TCP only at its next zero-window
# probe, and those back off (0.2, 0.4, 0.8, 1.6 s...). Seen in tests: a 1 s grace dropped a client
# that was reading.
UNREAD_CLOSE_GRACE_MIN_S = 5.0

# Frames are parsed as HTTP bodies are (handlers.parse_json: pydantic's parser, 0.55 us a request
# frame against orjson's 0.41 and json's 3.4) and answers written as HTTP's are (handlers.render_json).
CLOSE_LEADERSHIP_ENDED = 1012  # "service restart": the client reconnects, to the new leader
CLOSE_ANSWERS_UNREAD = 4000  # rcq's own (4000-4999 are for applications): the client does not read its answers
SHUTTING_DOWN = "the node is shutting down"
TEST_FAULT_OP = "test_fault"  # with test_session_fault: a frame of this op fails the channel as a bug would

# Every code a node closes a channel with: those of this module and those aiohttp's WebSocket
# reader sends itself (1002 for a broken frame, 1007, 1009). docs/session-channel.md's table and
# the AsyncAPI description list exactly these; tests/unit/test_session_channel_close_codes.py
# makes a node send each one.
CLOSE_CODES: dict[int, str] = {
    WSCloseCode.OK: "idle: nothing in flight and no frame for session_idle_timeout_s",
    WSCloseCode.GOING_AWAY: "the node is shutting down, after answering what was in flight (frames sent meanwhile "
                            "are answered 503 unavailable, not run): reconnect to the leader and re-send what has no "
                            "answer, with its keys",
    WSCloseCode.PROTOCOL_ERROR: "protocol error: a frame reused an id still in flight on the channel, or broke the "
                                "WebSocket protocol (unmasked, a reserved bit or opcode, a fragmented control frame)",
    WSCloseCode.UNSUPPORTED_DATA: "a binary frame: frames are JSON text",
    WSCloseCode.INVALID_TEXT: "a text frame that is not UTF-8",
    WSCloseCode.POLICY_VIOLATION: "the token was revoked or expired (after an id-null 401 error frame)",
    WSCloseCode.MESSAGE_TOO_BIG: "a frame larger than body_bytes_max",
    WSCloseCode.INTERNAL_ERROR: "internal error (a bug: never expected)",
    CLOSE_LEADERSHIP_ENDED: "the node stopped leading, after answering what was in flight: reconnect to the "
                            "leader and re-send what has no answer, with its keys",
    CLOSE_ANSWERS_UNREAD: "answers unread: the client left more than session_unsent_bytes_max bytes of answers "
                          "untaken for session_unsent_timeout_s (the node had stopped reading the channel); the "
                          "close follows every answer written, and if the client does not take it within as long "
                          "again (at least 5 s), the connection is dropped",
}


class ChannelBatch(BatchRequest):
    """``{"op": "batch", "requests": [...]}``: ``POST /v1/batch`` as one frame."""

    op: Literal["batch"]


FRAME = TypeAdapter(BatchOperation)
BATCH_FRAME = TypeAdapter(ChannelBatch)


class _Closing(Exception):
    """Ends the channel with ``code`` (after the error frame, if any, was sent)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _Channel:
    """One open channel: its reader, its requests in flight, its housekeeping timer."""

    def __init__(self, request: web.Request, ws: web.WebSocketResponse, caller: operations.Caller,
                 stats: ChannelStats) -> None:
        self._request = request
        self._ws = ws
        self._caller = caller
        self._stats = stats
        self._manager = request.app[MANAGER]
        self._config = request.app[CONFIG]
        self._token = presented_token(request.headers.get("Authorization"))
        self._slots = asyncio.Semaphore(self._config.session_in_flight_max)
        self._in_flight: dict[int, asyncio.Task[None]] = {}  # by frame id, until the answer is ready
        self._tasks: set[asyncio.Task[None]] = set()  # every request's task, until its answer is written
        self._last_activity = time.monotonic()
        self._closing: _Closing | None = None
        self._refusing = False  # the node stops: frames are answered 503, not run
        self._unsent_max = self._config.session_unsent_bytes_max
        self._unsent_over_since: float | None = None  # when the housekeeping first saw unsent answers past the bound
        self._reading_paused = False  # unsent answers past the bound: the reader waits
        self._close_task: asyncio.Future[None] | None = None  # the one close, once begun

    @property
    def refusing(self) -> bool:
        """The node stops: frames that arrive now are answered 503 without running."""
        return self._refusing

    @property
    def reading_paused(self) -> bool:
        """Nothing is read from the channel: its unsent answers are past ``session_unsent_bytes_max``."""
        return self._reading_paused

    @property
    def closing_code(self) -> int | None:
        """The code the node is closing the channel with, once it decided to."""
        return self._closing.code if self._closing is not None else None

    def connection_info(self, name: str) -> Any:
        """What asyncio knows of the channel's connection (``"socket"``, ``"peername"``...), None
        once it is gone: the back-pressure tests shrink the socket's kernel buffer through it."""
        transport = self._request.transport
        return transport.get_extra_info(name) if transport is not None else None

    def unsent_bytes(self) -> int:
        """Answer bytes written to the connection that the kernel has not taken yet (its client
        does not read them): what the connection's write buffer holds."""
        transport = self._request.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    async def run(self) -> None:
        timer = asyncio.ensure_future(self._housekeeping())
        registry = self._request.app[OPEN_CHANNELS]
        registry.channels.add(self)
        if registry.closing:  # upgraded after close_all (a keep-alive connection): closed at once
            self._closing = _Closing(WSCloseCode.GOING_AWAY, SHUTTING_DOWN)
        try:
            try:
                await self._read()
            except Exception:  # a bug: the connection is a WebSocket now, it cannot carry an HTTP error answer
                log.exception("unexpected error in a session channel")
                self._closing = _Closing(WSCloseCode.INTERNAL_ERROR, "internal error")
            await self._close_ws()
            # Requests in flight run to their end, as an HTTP request whose client went away does:
            # a commit is never cut in the middle. Their answers have nowhere to go.
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        finally:
            registry.channels.discard(self)
            timer.cancel()
            for task in list(self._tasks):  # only when the node itself shuts down, or answers had nowhere to go
                task.cancel()
            # the code the node sent (a close cut short by the deadline leaves aiohttp's 1006), else the peer's
            self._stats.closed_total[self._closing.code if self._closing else self._ws.close_code or WSCloseCode.OK] += 1

    # ------------------------------------------------------------------ reading
    async def _read(self) -> None:
        while self._closing is None:
            await self._slots.acquire()  # back-pressure: nothing more is read while the channel is full
            if self._unsent_bytes_over():
                await self._unsent_below_max()
            if self._closing is not None:
                self._slots.release()
                return
            message = await self._ws.receive()
            self._last_activity = time.monotonic()
            if message.type == WSMsgType.TEXT:
                self._stats.frames_in += 1
                await self._accept(message.data)
            else:
                self._slots.release()
                if message.type == WSMsgType.BINARY:
                    self._closing = _Closing(WSCloseCode.UNSUPPORTED_DATA, "frames are JSON text")
                elif message.type == WSMsgType.ERROR and isinstance(message.data, web.HTTPException | Exception):
                    # aiohttp reports an oversized frame as an error and closes with 1009 itself
                    log.info("session channel of %s ended: %s", self._caller.client, message.data)
                    return
                else:  # CLOSE, CLOSING, CLOSED
                    return

    def _unsent_bytes_over(self) -> bool:
        return self.unsent_bytes() > self._unsent_max

    async def _unsent_below_max(self) -> None:
        """Back-pressure on what the client does not read: nothing more is read from the channel
        while its unsent answers are past ``session_unsent_bytes_max`` (the housekeeping closes it
        if that lasts ``session_unsent_timeout_s``). Answers are written into the connection's
        buffer as they finish, and aiohttp waits for it to drain only about once per 64 KiB, so
        the in-flight cap alone does not bound it."""
        self._stats.reads_paused_total += 1
        self._reading_paused = True
        try:
            while self._closing is None and not self._ws.closed and self._unsent_bytes_over():
                await asyncio.sleep(UNSENT_POLL_S)
        finally:
            self._reading_paused = False

    async def _accept(self, data: str) -> None:
        """Start one request; an unattributable or broken frame is answered here (one slot is ours)."""
        try:  # HTTP's parser: a frame refused here is a body POST /v1/batch refuses too
            frame = parse_json(data, "a frame is one JSON object: this one")
        except InvalidRequest as exc:
            await self._answer_now(None, exc)
            return
        frame_id = frame.get("id") if isinstance(frame, dict) else None
        if not isinstance(frame_id, int) or isinstance(frame_id, bool) or not 1 <= frame_id <= FRAME_ID_MAX:
            await self._answer_now(None, InvalidRequest(f"a frame needs an integer \"id\" in 1..{FRAME_ID_MAX}"))
            return
        if frame_id in self._in_flight:
            self._slots.release()
            self._closing = _Closing(WSCloseCode.PROTOCOL_ERROR, f"id {frame_id} is already in flight")
            return
        if self._config.test_session_fault and frame.get("op") == TEST_FAULT_OP:
            raise RuntimeError("a session channel fault made on purpose (test_session_fault)")
        if self._refusing:  # the node stops: not run, so the client sends it elsewhere at once
            await self._answer_now(frame_id, Unavailable(f"{SHUTTING_DOWN}; this request did not run: send it again"))
            return
        del frame["id"]
        try:
            operation = validate(BATCH_FRAME if frame.get("op") == "batch" else FRAME, frame, "session frame")
        except InvalidRequest as exc:
            await self._answer_now(frame_id, exc)
            return
        self._stats.in_flight += 1
        task = asyncio.ensure_future(self._serve(frame_id, operation))
        self._in_flight[frame_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_now(self, frame_id: int | None, error: RcqError) -> None:
        try:
            await self._send(frame_id, error.http_status, error.to_body())
        finally:
            self._in_flight_done()

    def _in_flight_done(self) -> None:
        self._slots.release()
        self._last_activity = time.monotonic()

    # ------------------------------------------------------------------ serving
    async def _serve(self, frame_id: int, operation: BaseModel) -> None:
        try:
            status, body = await self._execute(operation)
        except RcqError as exc:
            status, body = exc.http_status, exc.to_body()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unexpected error in a session channel request")
            error = InternalError()
            status, body = error.http_status, error.to_body()
        finally:
            del self._in_flight[frame_id]
            self._stats.in_flight -= 1
        try:  # the slot is held until the answer is written: a client that does not read fills them
            await self._send(frame_id, status, body)
        finally:
            self._in_flight_done()

    async def _execute(self, operation: BaseModel) -> operations.Answer:
        manager, config = self._manager, self._config
        if isinstance(operation, ChannelBatch):
            return 200, await batch_answer(manager, config, self._caller, operation.requests)
        return await batch_operation(manager, config, self._caller, manager.answer_budget(), operation)

    async def _send(self, frame_id: int | None, status: int, body: dict[str, Any]) -> None:
        if self._ws.closed:
            return
        try:
            await self._ws.send_frame(render_json({"id": frame_id, "status": status, "body": body}), WSMsgType.TEXT)
        except (ConnectionError, RuntimeError):  # the peer went away; its reader ends the channel
            return
        self._stats.frames_out += 1

    # ------------------------------------------------------------------ ending
    async def _housekeeping(self) -> None:
        idle_s = self._config.session_idle_timeout_s
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            try:
                closing = await self._why_close(idle_s)
            except Exception:  # a bug: a channel nobody watches must not stay open unchecked
                log.exception("unexpected error checking a session channel")
                closing = _Closing(WSCloseCode.INTERNAL_ERROR, "internal error")
            if closing is not None:
                self._closing = closing
                await self._close_ws()  # wakes the reader
                return

    async def _why_close(self, idle_s: float) -> _Closing | None:
        unread = self._answers_unread()
        if unread is not None:
            return unread
        registry = self._request.app[TOKENS]
        if registry.enabled:
            try:
                registry.authenticate(self._token)
            except RcqError as exc:
                with contextlib.suppress(TimeoutError):  # a client that does not read gets the close alone
                    async with asyncio.timeout(HOUSEKEEPING_INTERVAL_S):
                        await self._send(None, exc.http_status, exc.to_body())
                return _Closing(WSCloseCode.POLICY_VIOLATION, exc.message)
        if not self._manager.serving:
            # what is in flight is answered first (new frames meanwhile get a quick 307)
            await self._drain(LEADERSHIP_DRAIN_S)
            return _Closing(CLOSE_LEADERSHIP_ENDED, "this node is no longer the serving leader")
        if not self._in_flight and time.monotonic() - self._last_activity >= idle_s:
            return _Closing(WSCloseCode.OK, f"idle for {idle_s:g} s")
        return None

    def _answers_unread(self) -> _Closing | None:
        """The close of a channel whose unsent answers stayed past the bound for
        ``session_unsent_timeout_s`` (as seen once a second), else None."""
        if not self._unsent_bytes_over():
            self._unsent_over_since = None
            return None
        now, timeout_s = time.monotonic(), self._config.session_unsent_timeout_s
        if self._unsent_over_since is None:
            self._unsent_over_since = now
        if now - self._unsent_over_since < timeout_s:
            return None
        log.info("closing the session channel of %s: %d answer bytes unread for %g s (session_unsent_bytes_max %d)",
                 self._caller.client or "an anonymous client", self.unsent_bytes(), timeout_s, self._unsent_max)
        return _Closing(CLOSE_ANSWERS_UNREAD, f"answers unread: over {self._unsent_max} bytes for {timeout_s:g} s")

    async def _drain(self, timeout_s: float) -> None:
        if self._in_flight:
            await asyncio.wait(list(self._in_flight.values()), timeout=timeout_s)

    async def shut_down(self) -> None:
        """The node stops: refuse new frames, answer what is in flight (bounded), close."""
        self._refusing = True
        await self._drain(LEADERSHIP_DRAIN_S)
        if self._closing is None:
            code = WSCloseCode.GOING_AWAY if self._manager.serving else CLOSE_LEADERSHIP_ENDED
            self._closing = _Closing(code, SHUTTING_DOWN)
        await self._close_ws(LEADERSHIP_DRAIN_S)  # wakes the reader, as the housekeeping's close does

    async def _close_ws(self, grace_s: float | None = None) -> None:
        """Close with ``_closing`` (1000 when none); a close frame also ends the reader's receive (the
        peer's close answers it). One close runs, whoever asks first (the housekeeping, the reader's
        end, the node's stop); the others wait for it, so that the handler does not return, and
        aiohttp end the connection, while the close waits for the peer's."""
        if self._close_task is None:
            if self._ws.closed:
                return
            self._close_task = asyncio.ensure_future(self._close_now(grace_s))
        await asyncio.shield(self._close_task)

    async def _close_now(self, grace_s: float | None) -> None:
        """The close frame goes behind the answers the client has not read: if they are not taken
        within ``grace_s`` (``session_unsent_timeout_s``, at least ``UNREAD_CLOSE_GRACE_MIN_S``),
        the connection is dropped, and what is
        unsent with it; else aiohttp's close waits for the peer's close frame (reading and dropping
        what comes before it) up to ``CLOSE_ANSWER_TIMEOUT_S``, then ends the connection."""
        closing = self._closing or _Closing(WSCloseCode.OK, "")
        try:
            if grace_s is None:
                grace_s = max(self._config.session_unsent_timeout_s, UNREAD_CLOSE_GRACE_MIN_S)
            async with asyncio.timeout(grace_s):
                while self.unsent_bytes() > 0:
                    await asyncio.sleep(UNSENT_POLL_S)
            async with asyncio.timeout(CLOSE_ANSWER_TIMEOUT_S + HOUSEKEEPING_INTERVAL_S):  # aiohttp's own, and a margin
                await self._ws.close(code=closing.code, message=closing.reason[:120].encode())
        except TimeoutError:
            transport = self._request.transport
            if transport is not None:
                transport.abort()


class _OpenChannels:
    """The node's open channels; ``closing`` once :func:`close_all` ran (the node stops)."""

    def __init__(self) -> None:
        self.channels: set[_Channel] = set()
        self.closing = False


OPEN_CHANNELS = web.AppKey("session_channels", _OpenChannels)


async def close_all(app: web.Application) -> None:
    """Every open channel of ``app`` ended as :meth:`_Channel.shut_down` says (the node stops); one
    opened later is closed as soon as it opens."""
    registry = app[OPEN_CHANNELS]
    registry.closing = True
    channels = list(registry.channels)
    if channels:
        log.info("closing %d session channel(s): %s", len(channels), SHUTTING_DOWN)
        results = await asyncio.gather(*(channel.shut_down() for channel in channels), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):  # a bug; the node stops all the same
                log.error("closing a session channel failed", exc_info=result)


async def serve(request: web.Request) -> web.StreamResponse:
    """``GET /v1/session``: checks as any leader-only request, then the channel until it closes."""
    manager, config, stats = request.app[MANAGER], request.app[CONFIG], request.app[METRICS].sessions
    caller = caller_of(request)  # the auth middleware refused a missing or bad token already
    try:
        manager.require_serving()
    except NotLeader as exc:
        # No Location header: a WebSocket client would follow it, and drop the token on the way
        # (a redirect to another origin). The body names the leader; the client goes there itself.
        return error_response(exc)
    if stats.per_client[caller.client] >= config.session_channels_per_client_max:
        raise TooManyConnections(f"{caller.client or 'this client'} holds {config.session_channels_per_client_max}"
                                 " session channels already (session_channels_per_client_max)")
    # aiohttp refuses a message of max_msg_size bytes already; a frame of body_bytes_max is allowed, as a body is
    ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), max_msg_size=config.body_bytes_max + 1, compress=False,
                               autoping=True, timeout=CLOSE_ANSWER_TIMEOUT_S)
    if not ws.can_prepare(request).ok:
        raise InvalidRequest(f"{PATH} is a WebSocket endpoint: send an upgrade request")
    stats.per_client[caller.client] += 1
    stats.opened_total += 1
    try:
        await ws.prepare(request)
        await _Channel(request, ws, caller, stats).run()
    finally:
        stats.per_client[caller.client] -= 1
        if stats.per_client[caller.client] <= 0:
            del stats.per_client[caller.client]
    return ws


def add_routes(app: web.Application) -> None:
    registry = app[OPEN_CHANNELS] = _OpenChannels()
    app[METRICS].sessions.unsent_bytes = lambda: sum(channel.unsent_bytes() for channel in registry.channels)
    app.router.add_get(PATH, serve)
