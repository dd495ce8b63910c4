"""The client's one transport: where a request goes, when it is sent again, and coalescing.

Long because: routing, re-sending and batching are one decision in one retry loop, and its re-send rules are stated below.

Every request of :mod:`rcq.client` goes through :meth:`Transport.request`. It alone decides
whether a request leaves on its own (REST, or one frame of the session channel) or shares a
batch, and it alone retries.

**The session channel** (``channel=True``). A request with a batch form (``batch_operation``)
goes as one frame of the target node's :class:`~rcq.client.channel.Channel` (``GET /v1/session``,
one WebSocket per node, requests pipelined by id), waiting ones too: a frame holds nothing else
up. Its answer is judged exactly as the REST answer, and its failure exactly as a broken HTTP
exchange (a dropped channel: "may have executed"). It goes over HTTP instead when the node has no
channel (404/405 at the upgrade: not tried again for a while), when the upgrade is refused (a
follower's 307, a 401, a 503: the same request over HTTP gets the node's answer with its body,
which aiohttp drops for a refused upgrade; HTTP is used for that node for a moment), when the
frame is large, and when :data:`CHANNEL_IN_FLIGHT_MAX` requests are in flight on the channel
already (past the node's own bound it stops reading the channel, and long polls could hold the
rest up). A node that answers ``not_leader`` has its channel closed once nothing is in flight on it.

**Where requests go.** The transport remembers the leader's URL. A ``307 not_leader``
means the request was not executed: it is re-sent to ``leader_url`` at once.
Connection errors, timeouts and 503 (``no_leader``, ``not_ready``,
``unavailable``) rotate through the known URLs with jittered exponential
backoff (50 ms doubling up to 1 s; a ``Retry-After`` becomes the ceiling, so
repeated 503s settle at the server's pace while the first retries stay quick
enough for a failover) until ``retry_timeout_s`` has passed.

**What is re-sent after a failure that may have executed** (the connection
broke after the request was sent, a timeout, a 504): everything but a transaction's
``reject``, because every other request is safe to re-send:

* reads, ``begin`` (a lost one leaves an empty transaction that expires),
  ``abort``, ``extend``, and transactional dequeues and enqueues: each carries
  a key (one is generated per call); the server answers a repeated dequeue key
  with the same items and buffers nothing more for a repeated enqueue key;
* commits: a retried commit with the same transaction id is never applied
  twice (the server answers ``duplicate``); until the answer is definite the
  client keeps asking, then raises :class:`CommitOutcomeUnknown`;
* one-request ``enqueue``/``execute``: they carry an idempotency key (one is
  generated per call), so a retry answers ``duplicate`` instead of applying
  twice; the dequeues of a duplicate answer are dropped (they were returned to
  their queues, and what the first attempt took is unknown);
* one-request ``dequeue`` is **at most once**: if the answer of an attempt that
  committed is lost, the items it took are gone and the retry takes others;
* a queue's ``purge`` and ``redrive`` act on what the queue holds when they apply: a repeat
  purges what was enqueued in between, or redrives up to ``max_items`` more;
* a transaction's ``reject`` (policy :data:`ONCE`) carries no key, and the server answers a
  repeat with an error (the items are no longer the transaction's) although the first attempt
  applied: an attempt that may have executed is never re-sent, the caller gets
  :class:`CommitOutcomeUnknown` at once. Attempts that certainly did not execute (a redirect,
  a refused connection, a 503 with an rcq body) are re-sent as any other.
* cluster membership changes (policy :data:`MEMBERSHIP`: add or remove a node, hand leadership
  over) carry no key either, and a repeat of one that applied fails (``member_exists``,
  ``member_not_found``): never re-sent after an attempt that may have executed
  (:class:`CommitOutcomeUnknown` at once), and re-sent only after answers that say it was not
  applied and may be later: a redirect, a 503 (``no_leader`` and the like, or a refused
  connection) and ``membership_conflict``. Other retryable answers (``node_unreachable``) go
  to the caller, who knows whether waiting can help.

**A leader that stops answering** (frozen by SIGSTOP, a VM stall, a long pause) holds a request
until its timeout, although the cluster elects a new leader within a couple of seconds. So while
a request is overdue (no answer ``LEADER_PROBE_AFTER_S`` after it left, plus what it may wait by
design), the transport asks the other nodes who leads, every ``LEADER_PROBE_INTERVAL_S``, one
probe at a time for all overdue requests. When another node answers that it is the serving
leader, the overdue attempt is abandoned as one that *may have executed* and the request is sent
there, with the same keys: a one-request transaction carries its idempotency key, a commit its
transaction id (the new leader answers ``duplicate`` if it applied, ``leader_changed`` if it never
can), a transactional verb meets ``leader_changed`` (its transaction died with the old leader).

**Coalescing** (``coalesce=True``). A request with a batch form that does not wait (a waiting
dequeue would hold the whole batch up) is submitted to the :class:`Coalescer`, which sends the
requests of one loop iteration as one batch, once (one ``{"op": "batch"}`` frame of the channel,
or ``POST /v1/batch``). The batch's failure, or else each part's own
answer, comes back to each part's retry loop here and is judged exactly as a REST answer; a
part sent again is submitted again and shares a batch with whatever else is pending. Parts that
failed together pause until the same instant, so a failed batch goes out again as one batch.

Must not import: rcq.client.client, rcq.client.transaction (the transport knows no API verb),
rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rcq.client.channel import Abandon, Channel, ChannelUnusable
from rcq.client.coalescer import Coalescer
from rcq.client.exchange import Answer, ExchangeFailed, exchange, new_session, normalize_url
from rcq.client.wire import dumps, estimated_item_bytes
from rcq.errors import (
    CommitOutcomeUnknown,
    InvalidRequest,
    LeaderChanged,
    MembershipConflict,
    NoLeader,
    NotLeader,
    PayloadTooLarge,
    RcqError,
    TransactionNotFound,
    Unavailable,
    error_from_body,
)
from rcq.immutable import immutable

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
LEADER_PROBE_AFTER_S = 1.0  # an attempt with no answer after this (beyond its own wait) is overdue
LEADER_PROBE_INTERVAL_S = 0.25  # how often the other nodes are asked while attempts are overdue
LEADER_PROBE_TIMEOUT_S = 0.5
# Requests in flight on one session channel before more go over HTTP: the node's default
# session_in_flight_max, past which it stops reading the channel.
CHANNEL_IN_FLIGHT_MAX = 128


# ---------------------------------------------------------------------- the policy
@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What an attempt that may have executed means for a kind of request."""

    maybe_committed: bool  # giving up after such an attempt raises CommitOutcomeUnknown
    # After such an attempt these answers mean "still unknown", not a definite failure: a
    # leader answers a commit whose Raft outcome is pending with 404.
    unknown_after_ambiguous: tuple[type[RcqError], ...] = ()
    # False: such an attempt is not re-sent (CommitOutcomeUnknown at once), for a request the
    # server cannot tell from its repeat and answers, repeated, with an error.
    resend_ambiguous: bool = True
    # True: a ``leader_changed`` answer is re-sent (to the new leader) until the retry budget is
    # spent. For one-request transactions: the answer means "aborted, not applied", and the
    # repeat is a new transaction under the same idempotency key, so it cannot apply twice.
    retry_leader_changed: bool = False
    # None: every retryable answer is re-sent; else only these (each means "not applied"). A redirect
    # with a leader to go to is always followed.
    retry_only: tuple[type[RcqError], ...] | None = None


SAFE = RetryPolicy(maybe_committed=False)  # reads and keyed transaction verbs
WRITE = RetryPolicy(maybe_committed=True, retry_leader_changed=True)  # one-request transactions
COMMIT = RetryPolicy(maybe_committed=True, unknown_after_ambiguous=(TransactionNotFound,))
ONCE = RetryPolicy(maybe_committed=True, resend_ambiguous=False)  # unkeyed transaction writes: reject
# unkeyed cluster changes (membership, leadership)
MEMBERSHIP = RetryPolicy(maybe_committed=True, resend_ambiguous=False,
                         retry_only=(NotLeader, Unavailable, MembershipConflict))


@immutable  # built for every request: no frozen __init__ (see rcq.immutable)
class Request:
    """One request. ``batch_operation``: the same request as a sub-request of ``POST /v1/batch``
    (None: it is never coalesced). ``wait_ms``: how long the server may hold it before answering."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    policy: RetryPolicy = SAFE
    params: Mapping[str, str] | None = None
    batch_operation: dict[str, Any] | None = None
    wait_ms: int = 0


@dataclass(slots=True)
class Attempts:
    ambiguous: bool = False  # an attempt may have executed


@dataclass(frozen=True, slots=True)
class _Failure:
    """One failed attempt of one request, as the retry engine judges it."""

    node_url: str
    error: RcqError
    finished_at: float  # loop time; with jitter, shared by the parts of one batch so they retry together
    jitter: float
    maybe_executed: bool = False
    retryable: bool = False  # the server (or the connection) says a retry can help
    rotate: bool = False  # try the next node
    retry_after_s: float | None = None
    location: str | None = None


_Outcome = dict[str, Any] | _Failure  # an attempt's answer, or why it failed


class Transport:
    """The nodes of one cluster as one leader: leader tracking, the retry engine, coalescing, the HTTP session."""

    def __init__(self, urls: str | Sequence[str], *, request_timeout_s: float, retry_timeout_s: float,
                 coalesce: bool, session: aiohttp.ClientSession | None, token: str | None = None,
                 tls: ssl.SSLContext | None = None, channel: bool = False) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        self._urls = list(dict.fromkeys(
            normalize_url(url) for part in listed for url in part.split(",") if url.strip()))
        if not self._urls:
            raise InvalidRequest("no URL given: pass at least one http://host:port")
        if request_timeout_s <= 0 or retry_timeout_s < 0:
            raise InvalidRequest("request_timeout_s must be positive and retry_timeout_s not negative")
        self.request_timeout_s = request_timeout_s
        self._retry_timeout_s = retry_timeout_s
        self._session = session
        self._owns_session = session is None
        self._authorization = f"Bearer {token}" if token else None  # never logged, never in a message
        self._tls = tls
        self._leader: str | None = None
        self._next_url = 0
        self._coalescer = Coalescer(self._send_batch, self.spawn) if coalesce else None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._leader_probe: asyncio.Task[str | None] | None = None  # shared by every overdue attempt
        self.leader_switches = 0  # overdue attempts abandoned for a newer leader (tests, benchmarks)
        self._channels: dict[str, Channel] | None = {} if channel else None  # node URL -> its channel
        self._retired: set[Channel] = set()  # channels to former leaders, closed once idle
        self._http_until: dict[str, float] = {}  # node URL -> loop time before which its channel is not tried

    # ----------------------------------------------------------- lifecycle
    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    @property
    def leader_url(self) -> str | None:
        return self._leader

    async def close(self) -> None:
        self._closed = True
        if self._coalescer is not None:
            self._coalescer.close()
        channels = [*(self._channels or {}).values(), *self._retired]
        self._retired.clear()
        if self._channels is not None:
            self._channels.clear()
        await asyncio.gather(*(channel.close() for channel in channels))  # before the session they use
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` in the background until it ends or the transport closes."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("rcq client background task failed", exc_info=task.exception())

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise Unavailable("the client is closed")
        if self._session is None:
            self._session = new_session(self._tls)
        return self._session

    # ------------------------------------------------------- the retry engine
    async def request(self, request: Request, *, attempts: Attempts | None = None) -> dict[str, Any]:
        """The answer of ``request`` from the leader, retried as its policy allows until the deadline.
        ``attempts`` tells the caller whether an attempt may have executed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_timeout_s
        attempts = attempts if attempts is not None else Attempts()
        # The one place that decides: a request with a batch form that does not wait is coalesced
        # (a waiting one would hold the whole batch up).
        batch_operation = request.batch_operation if request.wait_ms == 0 else None
        coalescer = self._coalescer if batch_operation is not None else None
        size_bytes = estimated_item_bytes(batch_operation) if coalescer is not None and batch_operation is not None else 0
        delay_s, failures, redirects, sent = BACKOFF_FIRST_S, 0, 0, 0
        while True:
            sent += 1
            if coalescer is not None and batch_operation is not None:
                outcome = await coalescer.submit(batch_operation, size_bytes)
            else:
                outcome = await self._attempt(request)
            if not isinstance(outcome, _Failure):
                return outcome
            error = outcome.error
            if isinstance(error, NotLeader):
                leader = self._learn(error.leader_url or _origin(outcome.location))
                redirects += 1
                if leader is not None and leader != outcome.node_url and redirects <= len(self._urls) + 1:
                    self._leader = leader  # not executed: re-send there at once
                    continue
                self._leader = None
            ambiguous = outcome.maybe_executed or (
                attempts.ambiguous and isinstance(error, request.policy.unknown_after_ambiguous))
            retryable = outcome.retryable or (
                request.policy.retry_leader_changed and isinstance(error, LeaderChanged))
            if request.policy.retry_only is not None and not isinstance(error, request.policy.retry_only):
                retryable = False
            if not ambiguous and not retryable:
                raise error
            if ambiguous:
                attempts.ambiguous = True
                if not request.policy.resend_ambiguous:
                    raise CommitOutcomeUnknown(
                        f"an attempt may have executed and cannot safely be re-sent: {error.message}") from error
            failures += 1
            if outcome.rotate:
                self._demote(outcome.node_url)
            # Another node is worth a try at once; the same one (or every one) only after a pause.
            pause_s = 0.0 if outcome.rotate and failures < len(self._urls) else delay_s * outcome.jitter
            resume_at = outcome.finished_at + pause_s
            if resume_at >= deadline:
                if attempts.ambiguous and request.policy.maybe_committed:
                    raise CommitOutcomeUnknown(
                        f"gave up after {sent} attempts, one with an unknown outcome: {error.message}") from error
                raise error
            if pause_s:
                await _sleep_until(resume_at)
                ceiling_s = outcome.retry_after_s if outcome.retry_after_s is not None else BACKOFF_MAX_S
                delay_s = min(delay_s * 2, ceiling_s)
                failures, redirects = 0 if outcome.rotate else failures, 0

    # --------------------------------------------------------------- attempts
    async def _attempt(self, request: Request) -> _Outcome:
        """One exchange with the current target: a frame of its channel, else REST."""
        node_url = self._target()
        wait_s = request.wait_ms / 1000
        timeout_s = self.request_timeout_s + wait_s  # the server may hold it that long
        answer = None
        if request.batch_operation is not None:
            answer = await self._over_channel(node_url, request.batch_operation, timeout_s, wait_s)
        if answer is None:
            data = dumps(request.body) if request.body is not None else None
            answer = await self._watched(node_url, exchange(self._http(), node_url, request.method, request.path,
                                                            data, request.params, timeout_s, self._authorization),
                                         wait_s)
        if isinstance(answer, _Failure):
            return answer
        if 200 <= answer.status < 300 and isinstance(answer.payload, dict):
            if request.method != "GET":  # only the serving leader executes a POST; any node answers a GET
                self._leader = node_url
            return answer.payload
        return self._judged(node_url, answer.status, answer.payload, answer.retry_after_s, answer.location)

    # ------------------------------------------------------- the session channel
    async def _over_channel(self, node_url: str, operation: dict[str, Any], timeout_s: float,
                            wait_s: float = 0.0) -> Answer | _Failure | None:
        """``operation`` as one frame of ``node_url``'s channel; None: it was not sent, use HTTP."""
        channel = self._channel(node_url)
        if channel is None:
            return None
        # overdue, the same watch as _watched's, started by the channel's own timer (no task per request)
        overdue_s = LEADER_PROBE_AFTER_S + wait_s if len(self._urls) > 1 else None
        try:
            return await channel.exchange(operation, timeout_s, overdue_s,
                                          lambda abandon: self._watch_overdue(node_url, abandon))
        except ExchangeFailed as exc:
            return _failed_exchange(node_url, exc)
        except _Abandoned as exc:
            return exc.failure
        except ChannelUnusable as exc:
            if exc.pause_s is not None:
                log.debug("rcq client: HTTP for %s for %g s: %s", node_url, exc.pause_s, exc)
                self._http_until[node_url] = asyncio.get_running_loop().time() + exc.pause_s
            return None

    def _channel(self, node_url: str) -> Channel | None:
        """The channel to ``node_url`` a request may take now, or None (over HTTP then)."""
        if self._channels is None or self._closed:
            return None
        if node_url in self._http_until:
            if self._http_until[node_url] > asyncio.get_running_loop().time():
                return None
            del self._http_until[node_url]
        channel = self._channels.get(node_url)
        if channel is None:
            channel = self._channels[node_url] = Channel(
                self._http, node_url, authorization=self._authorization, connect_timeout_s=self.request_timeout_s)
        return channel if channel.in_flight < CHANNEL_IN_FLIGHT_MAX else None

    def _judged(self, node_url: str, status: int, payload: Any, retry_after_s: float | None, location: str | None,
                finished_at: float | None = None, jitter: float | None = None) -> _Failure:
        """:func:`_judge`; a node that is not the leader has its channel closed (once nothing is in flight)."""
        failure = _judge(node_url, status, payload, retry_after_s, location, finished_at, jitter)
        if isinstance(failure.error, NotLeader) and self._channels is not None:
            channel = self._channels.pop(node_url, None)
            if channel is not None:
                self._retired.add(channel)
                self.spawn(self._retire(channel))
        return failure

    async def _retire(self, channel: Channel) -> None:
        # its requests in flight get their answers first (a follower answers 307 at once)
        await channel.close_when_idle()
        self._retired.discard(channel)

    async def _send_batch(self, operations: list[dict[str, Any]]) -> list[_Outcome]:
        """One batch (the coalescer's send): a ``{"op": "batch"}`` frame of the target's channel, else
        ``POST /v1/batch``; one outcome per operation."""
        node_url = self._target()
        answer = await self._over_channel(node_url, {"op": "batch", "requests": operations}, self.request_timeout_s)
        if answer is None:
            answer = await self._watched(node_url, exchange(self._http(), node_url, "POST", "/v1/batch",
                                                            dumps({"requests": operations}), None,
                                                            self.request_timeout_s, self._authorization))
        if isinstance(answer, _Failure):
            return [answer] * len(operations)
        if not (200 <= answer.status < 300 and isinstance(answer.payload, dict)):
            outcome = self._judged(node_url, answer.status, answer.payload, answer.retry_after_s, answer.location)
            if isinstance(outcome.error, InvalidRequest | PayloadTooLarge) and len(operations) > 1:
                # One part spoils the whole body: each part goes alone, so each caller gets its own answer.
                alone = await asyncio.gather(*(self._send_batch([operation]) for operation in operations))
                return [outcome for outcomes in alone for outcome in outcomes]
            return [outcome] * len(operations)
        self._leader = node_url
        responses = answer.payload.get("responses")
        loop_time, jitter = asyncio.get_running_loop().time(), random.uniform(0.5, 1.0)
        if not isinstance(responses, list) or len(responses) != len(operations):
            # the server broke the protocol after executing who knows what: give up, outcome unknown
            error = CommitOutcomeUnknown("/v1/batch answered with a malformed body")
            return [_Failure(node_url, error, loop_time, jitter)] * len(operations)
        outcomes: list[_Outcome] = []
        for response in responses:
            status = int(response.get("status") or 500) if isinstance(response, dict) else 500
            body = response.get("body") if isinstance(response, dict) else None
            if status < 300:
                outcomes.append(body if isinstance(body, dict) else {})
            else:  # one jitter and one clock reading for all: the parts that fail retry together
                outcomes.append(self._judged(node_url, status, body, None, None, loop_time, jitter))
        return outcomes

    # ------------------------------------------------- a leader that stops answering
    async def _watched(self, node_url: str, exchanging: Coroutine[Any, Any, Answer], wait_s: float = 0.0
                       ) -> Answer | _Failure:
        """Run one exchange with ``node_url``; while it is overdue, look for another serving leader and,
        if there is one, abandon the exchange (it may have executed) for it. See the module docstring."""
        attempt = asyncio.ensure_future(exchanging)
        abandoned: list[_Failure] = []

        def abandon(error: BaseException) -> bool:
            if attempt.done() or not isinstance(error, _Abandoned):
                return False
            abandoned.append(error.failure)
            attempt.cancel()
            return True

        watch = None
        try:
            done, _ = await asyncio.wait({attempt}, timeout=LEADER_PROBE_AFTER_S + wait_s)
            if not done and len(self._urls) > 1:
                watch = asyncio.ensure_future(self._watch_overdue(node_url, abandon))
            try:
                return await attempt
            except asyncio.CancelledError:
                if abandoned and attempt.cancelled():
                    return abandoned[0]
                raise
        except ExchangeFailed as exc:
            return _failed_exchange(node_url, exc)
        finally:
            if watch is not None:
                watch.cancel()
            if not attempt.done():
                attempt.cancel()

    async def _watch_overdue(self, node_url: str, abandon: Abandon) -> None:
        """While a request to ``node_url`` is overdue: every LEADER_PROBE_INTERVAL_S, ask the other nodes
        who leads; once another does, abandon the request for it (over HTTP or on a channel alike)."""
        while True:
            newer = await self._probe_for_leader(node_url)
            if newer is not None:
                error = Unavailable(f"{node_url} stopped answering; {newer} is the serving leader now")
                failure = _Failure(node_url, error, asyncio.get_running_loop().time(), random.uniform(0.5, 1.0),
                                   maybe_executed=True, retryable=True, rotate=True)
                if abandon(_Abandoned(failure)):
                    self._leader = newer
                    self.leader_switches += 1
                return
            await asyncio.sleep(LEADER_PROBE_INTERVAL_S)

    async def _probe_for_leader(self, overdue_url: str) -> str | None:
        """Another node that says it is the serving leader, or None; one probe at a time is shared."""
        probe = self._leader_probe
        if probe is None or probe.done():
            probe = self._leader_probe = asyncio.ensure_future(self._find_other_leader(overdue_url))
        try:
            found = await asyncio.shield(probe)
        except Exception:  # a probe that fails finds nothing; the attempt keeps waiting
            return None
        return found if found != overdue_url else None

    async def _find_other_leader(self, overdue_url: str) -> str | None:
        others = [url for url in self._urls if url != overdue_url]
        deadline = asyncio.get_running_loop().time() + LEADER_PROBE_TIMEOUT_S
        views = await asyncio.gather(*(self._probe(url, deadline) for url in others))
        return next((url for url, view in zip(others, views, strict=True)
                     if view is not None and view.get("role") == "leader" and view.get("serving")), None)

    # ------------------------------------------------------- leader tracking
    def _target(self) -> str:
        return self._leader or self._urls[self._next_url % len(self._urls)]

    def _learn(self, url: str) -> str | None:
        try:
            url = normalize_url(url)
        except InvalidRequest:
            return None
        if url not in self._urls:
            self._urls.append(url)
        return url

    def _demote(self, url: str) -> None:
        """``url`` failed: forget it as the leader and move the rotation past it."""
        if self._leader == url:
            self._leader = None
        if url in self._urls:
            self._next_url = self._urls.index(url) + 1

    async def ask_node(self, url: str, path: str) -> dict[str, Any]:
        """``GET path`` from exactly the node at ``url``, once (Unavailable if it does not answer)."""
        try:
            answer = await exchange(self._http(), normalize_url(url), "GET", path, None, None, self.request_timeout_s,
                                    self._authorization)
        except ExchangeFailed as exc:
            raise exc.error from exc
        if answer.status != 200 or not isinstance(answer.payload, dict):
            raise error_from_body(answer.status, answer.payload)
        return answer.payload

    async def wait_for_leader(self, timeout_s: float) -> str:
        """Poll every known node until one is a serving leader; remember and return its URL."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pause_s = 0.02
        while True:
            urls = list(self._urls)
            views = await asyncio.gather(*(self._probe(url, deadline) for url in urls))
            for url, view in zip(urls, views, strict=True):
                if view is None:
                    continue
                if view.get("role") == "leader" and view.get("serving"):
                    self._leader = url
                    return url
                if view.get("leader_url"):
                    self._learn(view["leader_url"])
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise NoLeader(f"no serving leader among {', '.join(self._urls)} within {timeout_s} s")
            await asyncio.sleep(min(pause_s, remaining_s))
            pause_s = min(pause_s * 2, 0.5)

    async def _probe(self, url: str, deadline: float) -> dict[str, Any] | None:
        # short: a dead node must not hold up the nodes that answer
        timeout_s = max(0.05, min(self.request_timeout_s, 2.0, deadline - asyncio.get_running_loop().time()))
        try:
            answer = await exchange(self._http(), url, "GET", "/v1/cluster", None, None, timeout_s, self._authorization)
        except ExchangeFailed:
            return None
        return answer.payload if answer.status == 200 and isinstance(answer.payload, dict) else None


class _Abandoned(Exception):
    """An overdue request on a channel given up for another leader: its failure, as _watched makes it."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.error.message)
        self.failure = failure


# ------------------------------------------------------------------ judging answers
def _failed_exchange(node_url: str, exc: ExchangeFailed) -> _Failure:
    return _Failure(node_url, exc.error, asyncio.get_running_loop().time(), random.uniform(0.5, 1.0),
                    maybe_executed=exc.maybe_sent, retryable=True, rotate=True)


def _judge(node_url: str, status: int, payload: Any, retry_after_s: float | None, location: str | None,
           finished_at: float | None = None, jitter: float | None = None) -> _Failure:
    """An error answer (of a request or of one part of a batch) as the retry engine sees it."""
    error = error_from_body(status, payload)
    has_body = isinstance(payload, dict) and isinstance(payload.get("error"), dict)
    return _Failure(
        node_url,
        error,
        finished_at if finished_at is not None else asyncio.get_running_loop().time(),
        jitter if jitter is not None else random.uniform(0.5, 1.0),
        # a proxy's 502-504 (no rcq body) or a 504 commit_outcome_unknown: it may have executed
        maybe_executed=(status in (502, 503, 504) and not has_body) or isinstance(error, CommitOutcomeUnknown),
        retryable=error.retryable and has_body,
        rotate=isinstance(error, Unavailable | NotLeader) or not has_body,
        retry_after_s=retry_after_s,
        location=location,
    )


async def _sleep_until(when: float) -> None:
    # call_at, not asyncio.sleep: parts that compute the same instant wake in the same loop
    # iteration, so they are submitted together and share one batch again.
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    handle = loop.call_at(when, _wake, woken)
    try:
        await woken
    finally:
        handle.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _origin(location: str | None) -> str:
    if not location:
        return ""
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
