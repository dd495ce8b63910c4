"""The client's one transport: where a request goes, when it is sent again, and coalescing.

Why over 400 lines: the one retry loop, and the three ways a request leaves (HTTP, a channel's frame, a batch).

Every request of :mod:`rcq.client` goes through :meth:`Transport.request`. It alone decides
whether a request leaves on its own (REST, or one frame of the session channel) or shares a
batch, and its loop alone retries, by the rules of :mod:`rcq.client.retry` (each kind of
request's policy, what is safe to re-send, the backoff); :mod:`rcq.client.leader_tracker` knows
which node leads and watches for a new leader while an attempt is overdue.

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
backoff (:mod:`rcq.client.retry`) until ``retry_timeout_s`` has passed. What is re-sent after
a failure that may have executed is stated in :mod:`rcq.client.retry`, and a leader that stops
answering in :mod:`rcq.client.leader_tracker`.

**Partitions** (docs/partitions.md). A request names the partition that runs it (None: p0); each
partition has its own nodes, leader, channels and coalescer, learnt from the listing
(:mod:`rcq.client.routes`). A ``421 wrong_partition`` answer (nothing was run) sends the request
on to the partition it names, at once, and teaches the routes where its queue lives.

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
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp

from rcq.client.channel import UPGRADE_TIMEOUT_S, Channel, ChannelUnusable
from rcq.client.coalescer import Coalescer
from rcq.client.exchange import Answer, ExchangeFailed, exchange, new_session, normalize_url
from rcq.client.leader_tracker import Abandoned, LeaderTracker
from rcq.client.retry import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    COMMIT,
    MEMBERSHIP,
    ONCE,
    SAFE,
    WRITE,
    Attempts,
    Failure,
    Outcome,
    Request,
    RetryPolicy,
    failed_exchange,
    judge,
    origin,
    sleep_until,
)
from rcq.client.routes import Routes
from rcq.client.wire import dumps, estimated_item_bytes
from rcq.errors import (
    CommitOutcomeUnknown,
    InvalidRequest,
    LeaderChanged,
    NotLeader,
    PayloadTooLarge,
    Unavailable,
    WrongPartition,
    error_from_body,
)
from rcq.names import P0

# The policies and the request, where the client's modules have always found them.
__all__ = ["COMMIT", "MEMBERSHIP", "ONCE", "SAFE", "WRITE", "Attempts", "Request", "RetryPolicy", "Transport"]

log = logging.getLogger(__name__)

# Requests in flight on one session channel before more go over HTTP: the node's default
# session_in_flight_max, past which it stops reading the channel.
CHANNEL_IN_FLIGHT_MAX = 128


class Transport:
    """The nodes of one cluster as one leader: the retry loop, the session channels, coalescing, the HTTP
    session; which node leads is its :class:`~rcq.client.leader_tracker.LeaderTracker`'s to know."""

    def __init__(self, urls: str | Sequence[str], *, request_timeout_s: float, retry_timeout_s: float,
                 coalesce: bool, session: aiohttp.ClientSession | None, token: str | None = None,
                 tls: ssl.SSLContext | None = None, channel: bool = False) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        given = list(dict.fromkeys(normalize_url(url) for part in listed for url in part.split(",") if url.strip()))
        if not given:
            raise InvalidRequest("no URL given: pass at least one http://host:port")
        if request_timeout_s <= 0 or retry_timeout_s < 0:
            raise InvalidRequest("request_timeout_s must be positive and retry_timeout_s not negative")
        self.request_timeout_s = request_timeout_s
        self._retry_timeout_s = retry_timeout_s
        self._session = session
        self._owns_session = session is None
        self._authorization = f"Bearer {token}" if token else None  # never logged, never in a message
        self._tls = tls
        self._leaders = LeaderTracker(given, self._http, authorization=self._authorization,
                                      request_timeout_s=request_timeout_s)
        self._trackers: dict[str, LeaderTracker] = {P0: self._leaders}  # partition -> its nodes and leader
        self._coalesce = coalesce
        self._coalescers: dict[str, Coalescer[Outcome]] = {}  # partition -> its coalescer
        self.routes = Routes(lambda path: self.request(Request("GET", path)))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._channels: dict[str, Channel] | None = {} if channel else None  # node URL -> its channel
        self._retired: set[Channel] = set()  # channels to former leaders, closed once idle
        self._http_until: dict[str, float] = {}  # node URL -> loop time before which its channel is not tried

    # ----------------------------------------------------------- lifecycle
    @property
    def urls(self) -> list[str]:
        return self._leaders.urls

    @property
    def leader_url(self) -> str | None:
        return self._leaders.leader

    @property
    def leader_switches(self) -> int:
        """Overdue attempts abandoned for a newer leader (tests, benchmarks)."""
        return sum(tracker.leader_switches for tracker in self._trackers.values())

    async def close(self) -> None:
        self._closed = True
        for coalescer in self._coalescers.values():
            coalescer.close()
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

    # ------------------------------------------------------- the retry loop
    async def request(self, request: Request, *, attempts: Attempts | None = None) -> dict[str, Any]:
        """The answer of ``request`` from the leader, retried as its policy allows until the deadline.
        ``attempts`` tells the caller whether an attempt may have executed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._retry_timeout_s if request.budget_s is None else request.budget_s)
        attempts = attempts if attempts is not None else Attempts()
        # The one place that decides: a request with a batch form that does not wait is coalesced
        # (a waiting one would hold the whole batch up).
        batch_operation = request.batch_operation if request.wait_ms == 0 else None
        size_bytes = estimated_item_bytes(batch_operation) if self._coalesce and batch_operation is not None else 0
        partition = request.partition or P0
        leaders = self._trackers.get(partition) or await self._tracker(partition)  # no await on the hot path
        coalescer = self._coalescer(partition, leaders) if batch_operation is not None else None
        delay_s, failures, redirects, sent, hops = BACKOFF_FIRST_S, 0, 0, 0, 0
        while True:
            sent += 1
            if coalescer is not None and batch_operation is not None:
                outcome = await coalescer.submit(batch_operation, size_bytes)
            else:
                outcome = await self._attempt(request, leaders)
            if not isinstance(outcome, Failure):
                return outcome
            error = outcome.error
            if isinstance(error, NotLeader):
                leader = leaders.learn(error.leader_url or origin(outcome.location))
                redirects += 1
                if leader is not None and leader != outcome.node_url and redirects <= leaders.count + 1:
                    leaders.leader = leader  # not executed: re-send there at once
                    continue
                leaders.leader = None
            if isinstance(error, WrongPartition) and hops < 3:
                # not run: the request belongs to the partition the answer names; re-send there at once
                named = str(error.details.get("partition") or "")
                if error.details.get("queue") and named:
                    self.routes.learn_placement(str(error.details["queue"]),
                                                [str(p) for p in error.details.get("queue_partitions") or [named]])
                if named and named != partition:
                    hops += 1
                    partition = named
                    leaders = await self._tracker(partition)
                    if error.leader_url:
                        leaders.leader = leaders.learn(error.leader_url)
                    coalescer = self._coalescer(partition, leaders) if batch_operation is not None else None
                    continue
                raise error
            ambiguous = outcome.maybe_executed or (
                attempts.ambiguous and isinstance(error, request.policy.unknown_after_ambiguous))
            retryable = outcome.retryable or (
                request.policy.retry_leader_changed and isinstance(error, LeaderChanged))
            if request.policy.retry_only is not None and not isinstance(error, request.policy.retry_only):
                retryable = False
            if isinstance(error, request.policy.not_retried):
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
                leaders.demote(outcome.node_url)
            # Another node is worth a try at once; the same one (or every one) only after a pause.
            pause_s = 0.0 if outcome.rotate and failures < leaders.count else delay_s * outcome.jitter
            resume_at = outcome.finished_at + pause_s
            if resume_at >= deadline:
                if attempts.ambiguous and request.policy.maybe_committed:
                    raise CommitOutcomeUnknown(
                        f"gave up after {sent} attempts, one with an unknown outcome: {error.message}") from error
                raise error
            if pause_s:
                await sleep_until(resume_at)
                ceiling_s = outcome.retry_after_s if outcome.retry_after_s is not None else BACKOFF_MAX_S
                delay_s = min(delay_s * 2, ceiling_s)
                failures, redirects = 0 if outcome.rotate else failures, 0

    # ------------------------------------------------------------ partitions
    async def _tracker(self, partition: str) -> LeaderTracker:
        """The nodes and leader of ``partition`` (p0: the URLs given); made from the listing."""
        tracker = self._trackers.get(partition)
        if tracker is None:
            row = await self.routes.row(partition)
            tracker = self._trackers.get(partition)  # made while the listing was fetched
            if tracker is None:
                urls = [normalize_url(url) for url in [*(row.get("urls") or []), row.get("leader_url")] if url]
                if not urls:
                    raise Unavailable(f"partition {partition} has no member this client can reach yet; retry")
                tracker = self._trackers[partition] = LeaderTracker(
                    list(dict.fromkeys(urls)), self._http, authorization=self._authorization,
                    request_timeout_s=self.request_timeout_s)
                if row.get("leader_url"):
                    tracker.leader = normalize_url(row["leader_url"])
        return tracker

    def _coalescer(self, partition: str, leaders: LeaderTracker) -> Coalescer[Outcome] | None:
        """``partition``'s coalescer (None: coalescing is off): a batch goes to one partition's leader."""
        if not self._coalesce:
            return None
        coalescer = self._coalescers.get(partition)
        if coalescer is None:
            coalescer = self._coalescers[partition] = Coalescer(
                lambda operations: self._send_batch(operations, leaders), self.spawn)
        return coalescer

    # --------------------------------------------------------------- attempts
    async def _attempt(self, request: Request, leaders: LeaderTracker) -> Outcome:
        """One exchange with the current target: a frame of its channel, else REST."""
        node_url = leaders.target()
        wait_s = request.wait_ms / 1000
        timeout_s = (self.request_timeout_s if request.budget_s is None
                     else min(self.request_timeout_s, request.budget_s)) + wait_s  # the server may hold it that long
        answer = None
        if request.batch_operation is not None:
            answer = await self._over_channel(node_url, request.batch_operation, timeout_s, leaders, wait_s)
        if answer is None:
            data = dumps(request.body) if request.body is not None else None
            answer = await leaders.watched(
                node_url, exchange(self._http(), node_url, request.method, request.path, data, request.params,
                                   timeout_s, self._authorization), wait_s)
        if isinstance(answer, Failure):
            return answer
        if 200 <= answer.status < 300 and isinstance(answer.payload, dict):
            if request.method != "GET":  # only the serving leader executes a POST; any node answers a GET
                leaders.leader = node_url
            return answer.payload
        return self._judged(node_url, answer.status, answer.payload, answer.retry_after_s, answer.location)

    # ------------------------------------------------------- the session channel
    async def _over_channel(self, node_url: str, operation: dict[str, Any], timeout_s: float,
                            leaders: LeaderTracker, wait_s: float = 0.0) -> Answer | Failure | None:
        """``operation`` as one frame of ``node_url``'s channel; None: it was not sent, use HTTP."""
        channel = self._channel(node_url)
        if channel is None:
            return None
        # overdue, the same watch as an HTTP exchange's, started by the channel's own timer (no task per request)
        try:
            return await channel.exchange(operation, timeout_s, leaders.overdue_after_s(wait_s),
                                          lambda abandon: leaders.watch_overdue(node_url, abandon))
        except ExchangeFailed as exc:
            return failed_exchange(node_url, exc)
        except Abandoned as exc:
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
                self._http, node_url, authorization=self._authorization,
                connect_timeout_s=min(self.request_timeout_s, UPGRADE_TIMEOUT_S))
        return channel if channel.in_flight < CHANNEL_IN_FLIGHT_MAX else None

    def _judged(self, node_url: str, status: int, payload: Any, retry_after_s: float | None, location: str | None,
                finished_at: float | None = None, jitter: float | None = None) -> Failure:
        """:func:`~rcq.client.retry.judge`; a node that is not the leader has its channel closed (once nothing
        is in flight)."""
        failure = judge(node_url, status, payload, retry_after_s, location, finished_at, jitter)
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

    async def _send_batch(self, operations: list[dict[str, Any]], leaders: LeaderTracker) -> list[Outcome]:
        """One batch (the coalescer's send): a ``{"op": "batch"}`` frame of the target's channel, else
        ``POST /v1/batch``; one outcome per operation."""
        node_url = leaders.target()
        answer = await self._over_channel(node_url, {"op": "batch", "requests": operations}, self.request_timeout_s,
                                          leaders)
        if answer is None:
            answer = await leaders.watched(
                node_url, exchange(self._http(), node_url, "POST", "/v1/batch", dumps({"requests": operations}),
                                   None, self.request_timeout_s, self._authorization))
        if isinstance(answer, Failure):
            return [answer] * len(operations)
        if not (200 <= answer.status < 300 and isinstance(answer.payload, dict)):
            outcome = self._judged(node_url, answer.status, answer.payload, answer.retry_after_s, answer.location)
            if isinstance(outcome.error, InvalidRequest | PayloadTooLarge) and len(operations) > 1:
                # One part spoils the whole body: each part goes alone, so each caller gets its own answer.
                alone = await asyncio.gather(*(self._send_batch([operation], leaders) for operation in operations))
                return [outcome for outcomes in alone for outcome in outcomes]
            return [outcome] * len(operations)
        leaders.leader = node_url
        responses = answer.payload.get("responses")
        loop_time, jitter = asyncio.get_running_loop().time(), random.uniform(0.5, 1.0)
        if not isinstance(responses, list) or len(responses) != len(operations):
            # the server broke the protocol after executing who knows what: give up, outcome unknown
            error = CommitOutcomeUnknown("/v1/batch answered with a malformed body")
            return [Failure(node_url, error, loop_time, jitter)] * len(operations)
        outcomes: list[Outcome] = []
        for response in responses:
            status = int(response.get("status") or 500) if isinstance(response, dict) else 500
            body = response.get("body") if isinstance(response, dict) else None
            if status < 300:
                outcomes.append(body if isinstance(body, dict) else {})
            else:  # one jitter and one clock reading for all: the parts that fail retry together
                outcomes.append(self._judged(node_url, status, body, None, None, loop_time, jitter))
        return outcomes

    # ------------------------------------------------------- asking nodes
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
        return await self._leaders.wait_for_leader(timeout_s)
