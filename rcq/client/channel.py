"""One session channel to one node: ``GET /v1/session`` as a WebSocket, its requests pipelined by id.

Why over 400 lines: one channel's connection, frames, timers and close share one state; its failure rules sit beside them.

A request is one sub-request of ``POST /v1/batch`` (or ``{"op": "batch"}`` for a whole batch) plus
an ``id``; its answer frame ``{"id", "status", "body"}`` carries the status and body HTTP would
answer, in any order. :meth:`Channel.exchange` sends one request once and gives back the same
:class:`~rcq.client.exchange.Answer` as one HTTP exchange, or raises the same
:class:`~rcq.client.exchange.ExchangeFailed`: no retry, no leader, no policy here (the transport
owns them). The protocol: ``docs/session-channel.md``.

* **Connecting** is shared: the requests that find no open channel wait for one upgrade.
* **Not over the channel** (:class:`ChannelUnusable`, nothing was sent): a node that answers the
  upgrade with 404/405 has no channel (an older node); any other refusal (307 on a follower, 401,
  503, 429) is not the answer of a request, and aiohttp drops the body of a refused upgrade, so
  the transport sends the request over HTTP to get the node's own answer, body and all. A frame
  over :data:`FRAME_BYTES_MAX` goes over HTTP too: an oversized frame would close the whole channel
  (1009) and make every request in flight on it "may have executed", where HTTP answers 413.
* **A dropped channel** fails every request in flight on it with ``maybe_sent=True`` (it may have
  executed, exactly as a broken HTTP exchange); a frame that was never written, ``maybe_sent=False``.
  A request that times out or is cancelled forgets its id: a late answer is dropped. A timeout with
  no frame at all from the node since the request left closes the channel (it looks dead).
* An error frame with a null id is logged; a 401 one (the token was revoked or expired) closes the
  channel, failing what is in flight as "may have executed".

Must not import: the other client modules but rcq.client.exchange and rcq.client.wire (the transport
builds on this, not the reverse), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import aiohttp
import yarl

from rcq.client.exchange import Answer, ExchangeFailed, certificate_error
from rcq.client.wire import dumps
from rcq.errors import RcqError, Unavailable
from rcq.json_text import loads

log = logging.getLogger(__name__)

PATH = "/v1/session"
SUBPROTOCOL = "rcq.session.v1"
FRAME_ID_MAX = (1 << 53) - 1  # what a JSON number holds exactly in every language
# Larger requests go over HTTP: below any node's body_bytes_max but its smallest settings (1 KiB
# and up; 32 MiB by default), and large enough that HTTP's cost per request no longer matters.
FRAME_BYTES_MAX = 1 << 20
CLOSE_TIMEOUT_S = 1.0  # how long closing waits for the node's close frame
# A ping after this long without a frame; no pong within half of it closes the channel. It finds a
# connection that died silently (as aiohttp's keep-alive limit retires idle HTTP connections) and
# keeps middleboxes from forgetting an idle one.
HEARTBEAT_S = 30.0
NO_CHANNEL_PAUSE_S = 60.0  # a node without the channel (404/405) is asked again after this (a rolling upgrade)
REFUSED_PAUSE_S = 1.0  # after a refused upgrade (307, 401, 503, ...) the node is asked over HTTP this long
# The longest one upgrade may take (or the request timeout, if shorter). An upgrade is one small
# exchange that a serving node answers in milliseconds, even loaded; a node that accepts the
# connection and answers nothing for this long is hung (stopped, or its event loop held in a
# stalled disk's sync), and as no request has left yet, another node is worth a try at once.
UPGRADE_TIMEOUT_S = 3.0


class ChannelUnusable(Exception):
    """This request was not sent over the channel: send it over HTTP. ``pause_s``: how long the node's
    channel should not be tried again (None: only this request is concerned)."""

    def __init__(self, message: str, pause_s: float | None) -> None:
        super().__init__(message)
        self.pause_s = pause_s


class _Connection:
    """One open WebSocket: its requests in flight (id -> request), the one task that reads answers,
    and two timers: the requests' (:meth:`_sweep`) and the heartbeat's (:meth:`_heartbeat`)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, node_url: str) -> None:
        self.loop = loop = asyncio.get_running_loop()
        self.ws = ws
        self.node_url = node_url
        self.pending: dict[int, _Request] = {}
        self.ended: RcqError | None = None  # why no more frames go out on it
        self.last_frame_at = loop.time()  # the last frame but pings and pongs
        self._last_pong_at = -math.inf
        self._last_id = 0
        self._closing: asyncio.Task[Any] | None = None
        # One timer for every request in flight, at the earliest time one of them is due, not one
        # per request: a TimerHandle per request (scheduled, cancelled, heap-sorted) is a good
        # part of a single-item transaction's CPU.
        self._sweep_at = math.inf
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._ping_sent_at: float | None = None
        self._heartbeat_handle: asyncio.TimerHandle | None = loop.call_at(self.last_frame_at + HEARTBEAT_S,
                                                                         self._heartbeat)
        self.reader = loop.create_task(self._read())

    def new_id(self) -> int:
        self._last_id = self._last_id + 1 if self._last_id < FRAME_ID_MAX else 1
        return self._last_id

    def send(self, frame_id: int, frame: bytes, request: _Request) -> asyncio.Future[None] | None:
        """Write one frame, ``request`` in flight from now on. Not written: ExchangeFailed(maybe_sent=False).
        None: written; else the wait for the socket's buffer to drain, for :meth:`drained`."""
        if self.ended is not None or self.ws.closed:
            raise ExchangeFailed(self.ended or Unavailable(f"the session channel to {self.node_url} closed"),
                                 maybe_sent=False)
        self.pending[frame_id] = request
        if request.due < self._sweep_at:
            self._sweep_from(request.due)
        try:
            # Without compression aiohttp writes the frame at once and only waits when the socket's
            # buffer is full: no task for the common case.
            return _start(self.ws.send_frame(frame, aiohttp.WSMsgType.TEXT))
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise self._broke(frame_id, exc) from exc
        except BaseException:
            self.forget(frame_id)
            raise

    async def drained(self, frame_id: int, draining: asyncio.Future[None]) -> None:
        """Wait for the socket's buffer to drain after the frame ``frame_id`` was written."""
        try:
            # Shielded: only the wait can be cut short, and a cancelled drain wait would cancel
            # every other sender's wait with it.
            await asyncio.shield(draining)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise self._broke(frame_id, exc) from exc

    def _broke(self, frame_id: int, exc: BaseException) -> ExchangeFailed:
        # the connection broke while the frame was written or after: it may have left
        self.forget(frame_id)
        self.end(Unavailable(f"the session channel to {self.node_url} broke: {exc!r}"))
        return ExchangeFailed(Unavailable(f"the session channel to {self.node_url} broke while sending: {exc!r}"),
                              maybe_sent=True)

    def forget(self, frame_id: int) -> None:
        request = self.pending.pop(frame_id, None)
        if request is not None and not request.future.done():
            request.future.cancel()

    def end(self, error: RcqError) -> None:
        """No more frames: every request in flight fails as one that may have executed; the socket closes."""
        if self.ended is not None:
            return
        self.ended = error
        for handle in (self._sweep_handle, self._heartbeat_handle):
            if handle is not None:
                handle.cancel()
        self._sweep_handle = self._heartbeat_handle = None
        self._sweep_at = math.inf
        pending, self.pending = self.pending, {}
        for request in pending.values():
            if not request.future.done():
                request.future.set_exception(ExchangeFailed(error, maybe_sent=True))
                request.future.exception()  # retrieved: its waiter may be gone already
        if self.reader is not asyncio.current_task():
            self.reader.cancel()
        if not self.ws.closed:
            self._closing = asyncio.ensure_future(self.ws.close())
            self._closing.add_done_callback(_consume)

    async def close(self) -> None:
        self.end(Unavailable(f"the session channel to {self.node_url} was closed"))
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader
        if self._closing is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._closing

    # ------------------------------------------------------------------ timers
    def _sweep_from(self, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = self.loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Every request whose time has come becomes overdue (its watch starts) or fails
        (:class:`_Expired`, past its deadline), at the time it would with a timer of its own."""
        now = max(self.loop.time(), self._sweep_at)  # a timer may run a hair before its time
        self._sweep_handle, self._sweep_at = None, math.inf
        next_at = math.inf
        for request in list(self.pending.values()):
            if request.future.done():
                continue
            if request.due <= now:
                request.fire()
            if not request.future.done() and request.due < next_at:
                next_at = request.due
        if next_at < math.inf and self.ended is None:
            self._sweep_from(next_at)

    def _heartbeat(self) -> None:
        """A ping once nothing came for HEARTBEAT_S; no frame at all within half of that after it (its
        pong or any other) ends the channel. It finds a connection that died silently within
        1.5 * HEARTBEAT_S of its last frame, as aiohttp's own heartbeat would, without re-arming a
        timer on every frame received."""
        now = self.loop.time()
        heard_at = max(self.last_frame_at, self._last_pong_at)
        if self._ping_sent_at is not None:
            if heard_at < self._ping_sent_at:
                self.end(Unavailable(f"the session channel to {self.node_url} fell silent: no answer to a ping "
                                     f"within {HEARTBEAT_S / 2:g} s"))
                return
            self._ping_sent_at = None
        if now < heard_at + HEARTBEAT_S:
            self._heartbeat_handle = self.loop.call_at(heard_at + HEARTBEAT_S, self._heartbeat)
            return
        self._ping_sent_at = now
        self._heartbeat_handle = self.loop.call_at(now + HEARTBEAT_S / 2, self._heartbeat)
        self._control(self.ws.ping())

    def _control(self, sending: Coroutine[Any, Any, None]) -> None:
        """Send a ping or a pong; a failure ends the channel."""
        try:
            waiting = _start(sending)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            self.end(Unavailable(f"the session channel to {self.node_url} broke: {exc!r}"))
            return
        if waiting is not None:
            waiting.add_done_callback(self._control_done)

    def _control_done(self, waiting: asyncio.Future[None]) -> None:
        if not waiting.cancelled() and waiting.exception() is not None:
            self.end(Unavailable(f"the session channel to {self.node_url} broke: {waiting.exception()!r}"))

    # ------------------------------------------------------------------ reading
    async def _read(self) -> None:
        why = "the node closed it"
        try:
            while True:
                message = await self.ws.receive()
                kind = message.type
                if kind is aiohttp.WSMsgType.TEXT:
                    self.last_frame_at = self.loop.time()
                    if not self._answer(message.data):
                        why = "the node refused the token"
                        break
                    continue
                if kind is aiohttp.WSMsgType.PONG:
                    self._last_pong_at = self.loop.time()
                    continue
                if kind is aiohttp.WSMsgType.PING:  # answered here: aiohttp's autoping is off (see _heartbeat)
                    self._last_pong_at = self.loop.time()
                    self._control(self.ws.pong(message.data))
                    continue
                self.last_frame_at = self.loop.time()
                if kind in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    why = f"the node closed it (code {self.ws.close_code})"
                    break
                if kind is aiohttp.WSMsgType.ERROR:
                    why = f"it failed: {message.data!r}"
                    break
                log.warning("session channel to %s: ignored a %s frame", self.node_url, kind.name)  # binary
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            why = f"it failed: {exc!r}"
        self.end(Unavailable(f"the session channel to {self.node_url} closed: {why}"))

    def _answer(self, data: str) -> bool:
        """Resolve the request ``data`` answers; False: the channel must close (a 401 error frame)."""
        try:
            frame = loads(data)
        except ValueError:
            frame = None
        if not isinstance(frame, dict):
            log.warning("session channel to %s: ignored a frame that is not a JSON object", self.node_url)
            return True
        frame_id, status, body = frame.get("id"), frame.get("status"), frame.get("body")
        if frame_id is None:
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else body
            log.warning("session channel to %s: error frame, HTTP %s: %s", self.node_url, status, message)
            return status != 401
        request = self.pending.pop(frame_id, None) if isinstance(frame_id, int) else None
        if request is None or request.future.done():
            return True  # a late answer of a request that timed out or was cancelled
        if not isinstance(status, int) or isinstance(status, bool):
            # the node broke the protocol after executing who knows what
            request.future.set_exception(ExchangeFailed(
                Unavailable(f"the session channel to {self.node_url} answered a frame without a status"),
                maybe_sent=True))
            return True
        request.future.set_result(Answer(status, body, None, _leader_url(body) if status == 307 else None))
        return True


class Channel:
    """The session channel to the node at ``node_url``, opened on first use and again after a drop.

    ``session()``: the HTTP session to open it on (the transport's, with its TLS settings);
    ``authorization``: the ``Authorization`` header; ``connect_timeout_s`` bounds one upgrade."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession], node_url: str, *,
                 authorization: str | None, connect_timeout_s: float) -> None:
        self.node_url = node_url
        self._session = session
        self._authorization = authorization
        self._connect_timeout_s = connect_timeout_s
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self._closed = False
        self.in_flight = 0  # requests in exchange(), connecting or answered or not
        self._idle = asyncio.Event()  # set when in_flight drops to 0

    async def exchange(self, operation: Mapping[str, Any], timeout_s: float, overdue_s: float | None = None,
                       on_overdue: OverdueWatch | None = None) -> Answer:
        """``operation`` (a ``/v1/batch`` sub-request, or ``{"op": "batch", ...}``) once, within ``timeout_s``.
        Raises ExchangeFailed (no answer) or ChannelUnusable (not sent: use HTTP). With no answer
        ``overdue_s`` after it left, ``on_overdue(abandon)`` runs (a task) until the answer comes; it
        may give up on the request with ``abandon(exception)``, which this then raises."""
        self.in_flight += 1  # in this one coroutine, not around another: it runs on every answer
        try:
            body = dumps(operation)  # encoded once: the id is spliced in front
            if len(body) > FRAME_BYTES_MAX:
                raise ChannelUnusable(f"a request of {len(body)} bytes goes over HTTP", None)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            connection = self._connection
            if connection is None or connection.ended is not None:
                connection = await self._connected_by(deadline, timeout_s)
            frame_id = connection.new_id()
            sent_at = loop.time()
            request = _Request(loop.create_future(), deadline,
                               None if overdue_s is None else sent_at + overdue_s, on_overdue)
            draining = connection.send(frame_id, b'{"id":%d,' % frame_id + body[1:], request)
            try:
                if draining is not None:
                    await connection.drained(frame_id, draining)
                return await request.future
            except _Expired as exc:
                connection.forget(frame_id)
                if connection.last_frame_at < sent_at:  # not a frame since: the connection looks dead
                    connection.end(Unavailable(f"the session channel to {self.node_url} fell silent"))
                raise ExchangeFailed(Unavailable(f"no answer from {self.node_url} within {timeout_s:g} s "
                                                 "on the session channel"), maybe_sent=True) from exc
            except BaseException:  # abandoned, cancelled, or the channel dropped: a late answer is dropped
                connection.forget(frame_id)
                raise
            finally:
                if request.watch is not None:
                    request.watch.cancel()
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def _connected_by(self, deadline: float, timeout_s: float) -> _Connection:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._connected()
        except TimeoutError as exc:
            raise ExchangeFailed(Unavailable(f"cannot open the session channel to {self.node_url} "
                                             f"within {timeout_s:g} s"), maybe_sent=False) from exc

    async def _connected(self) -> _Connection:
        connection = self._connection
        if connection is not None and connection.ended is None:
            return connection
        if self._closed:
            raise ExchangeFailed(Unavailable(f"the session channel to {self.node_url} is closed"), maybe_sent=False)
        connecting = self._connecting
        if connecting is None:
            connecting = self._connecting = asyncio.ensure_future(self._connect())
            connecting.add_done_callback(self._connect_done)
        try:
            # shielded: a waiter that gives up does not cut the upgrade short for the others
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if connecting.cancelled() and task is not None and not task.cancelling():  # close() ended it
                raise ExchangeFailed(Unavailable(f"the session channel to {self.node_url} was closed"),
                                     maybe_sent=False) from None
            raise

    def _connect_done(self, connecting: asyncio.Future[_Connection]) -> None:
        self._connecting = None
        if connecting.cancelled() or connecting.exception() is not None:
            return
        # a connection it replaces has ended: its reader is done and its socket closing
        self._connection = connecting.result()
        if self._closed:  # closed while the upgrade was under way
            self._connection.end(Unavailable(f"the session channel to {self.node_url} was closed"))

    async def _connect(self) -> _Connection:
        headers = {"Authorization": self._authorization} if self._authorization is not None else {}
        url = yarl.URL(self.node_url + PATH, encoded=True)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                # no ssl argument: the session's connector holds the TLS settings, as for every HTTP request
                ws = await self._session().ws_connect(
                    url, protocols=(SUBPROTOCOL,), headers=headers, autoping=False,  # pings: _Connection._heartbeat
                    compress=0, max_msg_size=0,  # answers are unbounded, as over HTTP
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_S))
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (404, 405):
                raise ChannelUnusable(f"{self.node_url} has no session channel (HTTP {exc.status})",
                                      NO_CHANNEL_PAUSE_S) from exc
            raise ChannelUnusable(f"{self.node_url} refused the session channel (HTTP {exc.status})",
                                  REFUSED_PAUSE_S) from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise certificate_error(self.node_url, exc) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:  # no request frame has left
            raise ExchangeFailed(Unavailable(f"cannot open the session channel to {self.node_url}: {exc!r}"),
                                 maybe_sent=False) from exc
        if ws.protocol != SUBPROTOCOL:
            await ws.close()
            raise ChannelUnusable(f"{self.node_url} does not speak {SUBPROTOCOL} on {PATH}", NO_CHANNEL_PAUSE_S)
        return _Connection(ws, self.node_url)

    async def close_when_idle(self) -> None:
        """Close the channel once no request is in flight on it (each is bounded by its own timeout)."""
        while self.in_flight:
            self._idle.clear()
            await self._idle.wait()
        await self.close()

    async def close(self) -> None:
        """Close the channel: its requests in flight fail as "may have executed"; no new ones are taken."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


class _Expired(Exception):
    """A request's ``timeout_s`` passed without its answer."""


# ``on_overdue(abandon)``: watches an overdue request; ``abandon(exception)`` ends its wait with
# ``exception`` and says whether it did (False: the answer came first).
Abandon = Callable[[BaseException], bool]
OverdueWatch = Callable[[Abandon], Coroutine[Any, Any, None]]


class _Request:
    """A request in flight: its answer's future and its times (loop time). ``due``: when the
    connection's sweep acts on it next: first when it becomes overdue (its watch starts), then at
    its deadline (its future fails with :class:`_Expired`)."""

    __slots__ = ("deadline", "due", "future", "on_overdue", "watch")

    def __init__(self, future: asyncio.Future[Answer], deadline: float, overdue_at: float | None,
                 on_overdue: OverdueWatch | None) -> None:
        self.future = future
        self.deadline = deadline
        watched = on_overdue is not None and overdue_at is not None and overdue_at < deadline
        self.on_overdue = on_overdue if watched else None
        self.due = overdue_at if watched and overdue_at is not None else deadline
        self.watch: asyncio.Task[None] | None = None

    def fire(self) -> None:
        if self.on_overdue is None:
            self.future.set_exception(_Expired())
            return
        watch, self.on_overdue = self.on_overdue, None
        self.due = self.deadline
        self.watch = self.future.get_loop().create_task(watch(self._abandon))
        self.watch.add_done_callback(_consume)

    def _abandon(self, error: BaseException) -> bool:
        if self.future.done():
            return False
        self.future.set_exception(error)
        return True


def _start(coroutine: Coroutine[Any, Any, None]) -> asyncio.Future[None] | None:
    """Run ``coroutine`` up to its first wait, as an eagerly started task would: None if it ended
    there (what it raised is raised), else a task that runs the rest."""
    try:
        waiting = coroutine.send(None)
    except StopIteration:
        return None
    rest = asyncio.ensure_future(_resume(coroutine, waiting))
    rest.add_done_callback(_consume)
    return rest


async def _resume(coroutine: Coroutine[Any, Any, None], waiting: Any) -> None:
    """The rest of a coroutine :func:`_start` began: what it waits for is awaited here, and its
    outcome sent (or thrown) into it, as a task does."""
    while True:
        try:
            if waiting is None:  # a bare yield: one turn of the loop
                await asyncio.sleep(0)
            else:
                await waiting
        except BaseException as exc:  # the coroutine's to handle, as under a task
            try:
                waiting = coroutine.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waiting = coroutine.send(None)
            except StopIteration:
                return


def _leader_url(body: Any) -> str | None:
    """A 307 answer frame's ``error.leader_url``, where HTTP has its ``Location`` header."""
    error = body.get("error") if isinstance(body, dict) else None
    leader_url = error.get("leader_url") if isinstance(error, dict) else None
    return leader_url if isinstance(leader_url, str) else None


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a background future's exception: the caller that would have has given up."""
    if not future.cancelled():
        future.exception()
