"""Where the client believes the leader is: the known nodes, the one that leads, and a new one when it stops answering.

:class:`LeaderTracker` keeps the nodes' URLs (those given, and leaders learnt from redirects and
views), the URL of the node believed to lead, and a rotation past the nodes that failed; the
transport (:mod:`rcq.client.transport`) asks it where the next attempt goes and tells it what each
attempt showed.

**A leader that stops answering** (frozen by SIGSTOP, a VM stall, a long pause) holds a request
until its timeout, although the cluster elects a new leader within a couple of seconds. So while
a request is overdue (no answer ``LEADER_PROBE_AFTER_S`` after it left, plus what it may wait by
design), the tracker asks the other nodes who leads, every ``LEADER_PROBE_INTERVAL_S``, one
probe at a time for all overdue requests. When another node answers that it is the serving
leader, the overdue attempt is abandoned as one that *may have executed* and the request is sent
there, with the same keys: a one-request transaction carries its idempotency key, a commit its
transaction id (the new leader answers ``duplicate`` if it applied, ``leader_changed`` if it never
can), a transactional verb meets ``leader_changed`` (its transaction died with the old leader).

Must not import: rcq.client.transport, rcq.client.client (the transport builds on this, not the
reverse), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from rcq.client.channel import Abandon
from rcq.client.exchange import Answer, ExchangeFailed, exchange, normalize_url
from rcq.client.retry import Failure, failed_exchange
from rcq.errors import InvalidRequest, NoLeader, Unavailable

LEADER_PROBE_AFTER_S = 1.0  # an attempt with no answer after this (beyond its own wait) is overdue
LEADER_PROBE_INTERVAL_S = 0.25  # how often the other nodes are asked while attempts are overdue
LEADER_PROBE_TIMEOUT_S = 0.5


class Abandoned(Exception):
    """An overdue request given up for another leader: its failure, as :meth:`LeaderTracker.watched` makes it."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.error.message)
        self.failure = failure


class LeaderTracker:
    """The nodes of one cluster and which of them leads; see the module docstring.

    ``http`` gives the session to ask nodes with (it raises once the client is closed);
    ``authorization`` is the ``Authorization`` header sent with every probe."""

    def __init__(self, urls: list[str], http: Callable[[], aiohttp.ClientSession], *,
                 authorization: str | None, request_timeout_s: float) -> None:
        self._urls = list(urls)
        self._http = http
        self._authorization = authorization
        self._request_timeout_s = request_timeout_s
        self.leader: str | None = None  # the node believed to lead (None: not known)
        self._next_url = 0
        self._leader_probe: asyncio.Task[str | None] | None = None  # shared by every overdue attempt
        self.leader_switches = 0  # overdue attempts abandoned for a newer leader (tests, benchmarks)

    # ------------------------------------------------------- where attempts go
    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    @property
    def count(self) -> int:
        return len(self._urls)

    def target(self) -> str:
        """Where the next attempt goes: the leader, else the next node of the rotation."""
        return self.leader or self._urls[self._next_url % len(self._urls)]

    def learn(self, url: str) -> str | None:
        """``url`` (normalized) as a known node; None if it is no URL."""
        try:
            url = normalize_url(url)
        except InvalidRequest:
            return None
        if url not in self._urls:
            self._urls.append(url)
        return url

    def demote(self, url: str) -> None:
        """``url`` failed: forget it as the leader and move the rotation past it."""
        if self.leader == url:
            self.leader = None
        if url in self._urls:
            self._next_url = self._urls.index(url) + 1

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
                    self.leader = url
                    return url
                if view.get("leader_url"):
                    self.learn(view["leader_url"])
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise NoLeader(f"no serving leader among {', '.join(self._urls)} within {timeout_s} s")
            await asyncio.sleep(min(pause_s, remaining_s))
            pause_s = min(pause_s * 2, 0.5)

    # ------------------------------------------------- a leader that stops answering
    def overdue_after_s(self, wait_s: float = 0.0) -> float | None:
        """How long an attempt that may wait ``wait_s`` goes unanswered before it is overdue (None: never,
        with one node there is no other leader to look for)."""
        return LEADER_PROBE_AFTER_S + wait_s if len(self._urls) > 1 else None

    async def watched(self, node_url: str, exchanging: Coroutine[Any, Any, Answer], wait_s: float = 0.0
                      ) -> Answer | Failure:
        """Run one exchange with ``node_url``; while it is overdue, look for another serving leader and,
        if there is one, abandon the exchange (it may have executed) for it. See the module docstring."""
        attempt = asyncio.ensure_future(exchanging)
        abandoned: list[Failure] = []

        def abandon(error: BaseException) -> bool:
            if attempt.done() or not isinstance(error, Abandoned):
                return False
            abandoned.append(error.failure)
            attempt.cancel()
            return True

        watch = None
        try:
            done, _ = await asyncio.wait({attempt}, timeout=LEADER_PROBE_AFTER_S + wait_s)
            if not done and len(self._urls) > 1:
                watch = asyncio.ensure_future(self.watch_overdue(node_url, abandon))
            try:
                return await attempt
            except asyncio.CancelledError:
                if abandoned and attempt.cancelled():
                    return abandoned[0]
                raise
        except ExchangeFailed as exc:
            return failed_exchange(node_url, exc)
        finally:
            if watch is not None:
                watch.cancel()
            if not attempt.done():
                attempt.cancel()

    async def watch_overdue(self, node_url: str, abandon: Abandon) -> None:
        """While a request to ``node_url`` is overdue: every LEADER_PROBE_INTERVAL_S, ask the other nodes
        who leads; once another does, abandon the request for it (over HTTP or on a channel alike)."""
        while True:
            newer = await self._probe_for_leader(node_url)
            if newer is not None:
                error = Unavailable(f"{node_url} stopped answering; {newer} is the serving leader now")
                failure = Failure(node_url, error, asyncio.get_running_loop().time(), random.uniform(0.5, 1.0),
                                  maybe_executed=True, retryable=True, rotate=True)
                if abandon(Abandoned(failure)):
                    self.leader = newer
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

    async def _probe(self, url: str, deadline: float) -> dict[str, Any] | None:
        # short: a dead node must not hold up the nodes that answer
        timeout_s = max(0.05, min(self._request_timeout_s, 2.0, deadline - asyncio.get_running_loop().time()))
        try:
            answer = await exchange(self._http(), url, "GET", "/v1/cluster", None, None, timeout_s, self._authorization)
        except ExchangeFailed:
            return None
        return answer.payload if answer.status == 200 and isinstance(answer.payload, dict) else None
