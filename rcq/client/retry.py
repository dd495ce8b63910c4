"""The client's re-send rules: each kind of request's policy, and how a failed attempt is judged.

The transport's retry loop (:meth:`rcq.client.transport.Transport.request`) asks the request's
:class:`RetryPolicy` and the :class:`Failure` that :func:`judge` makes of an answer whether to send
it again; this module holds those rules and no I/O.

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

**The pause between attempts**: jittered exponential backoff, :data:`BACKOFF_FIRST_S` doubling up
to :data:`BACKOFF_MAX_S`; a ``Retry-After`` becomes the ceiling, so repeated 503s settle at the
server's pace while the first retries stay quick enough for a failover. Parts of one batch that
failed together share one jitter and one clock reading, and wake together (:func:`sleep_until`).

Must not import: the other client modules but rcq.client.exchange (the transport builds on this,
not the reverse), aiohttp, rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rcq.client.exchange import ExchangeFailed
from rcq.errors import (
    CommitOutcomeUnknown,
    MembershipConflict,
    NotLeader,
    QueueFull,
    RcqError,
    TransactionNotFound,
    Unavailable,
    error_from_body,
)
from rcq.immutable import immutable

BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0


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
    # Answers given to the caller at once though retryable: the caller has somewhere else to go
    # (a spread queue's full fragment: the next fragment may have room).
    not_retried: tuple[type[RcqError], ...] = ()


SAFE = RetryPolicy(maybe_committed=False)  # reads and keyed transaction verbs
WRITE = RetryPolicy(maybe_committed=True, retry_leader_changed=True)  # one-request transactions
# a one-request enqueue into a spread queue's fragment, with other fragments to try when it is full
WRITE_ELSEWHERE_IF_FULL = RetryPolicy(maybe_committed=True, retry_leader_changed=True, not_retried=(QueueFull,))
COMMIT = RetryPolicy(maybe_committed=True, unknown_after_ambiguous=(TransactionNotFound,))
ONCE = RetryPolicy(maybe_committed=True, resend_ambiguous=False)  # unkeyed transaction writes: reject
# unkeyed cluster changes (membership, leadership)
MEMBERSHIP = RetryPolicy(maybe_committed=True, resend_ambiguous=False,
                         retry_only=(NotLeader, Unavailable, MembershipConflict))


@immutable  # built for every request: no frozen __init__ (see rcq.immutable)
class Request:
    """One request. ``batch_operation``: the same request as a sub-request of ``POST /v1/batch``
    (None: it is never coalesced). ``wait_ms``: how long the server may hold it before answering.
    ``partition``: where it is sent (rcq.client.routes); an answer ``421 wrong_partition`` sends it
    on to the partition it names. ``budget_s``: how long this request may take in all, its retries
    and each attempt's wait for an answer (None: the client's ``retry_timeout_s`` and
    ``request_timeout_s``; a part of a coalesced batch waits for an answer as long as the batch); a
    spread queue's fragment that is passed over when dark gets a short one (rcq.client.spread)."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    policy: RetryPolicy = SAFE
    params: Mapping[str, str] | None = None
    batch_operation: dict[str, Any] | None = None
    wait_ms: int = 0
    partition: str | None = None  # the partition whose leader runs it (None: p0)
    budget_s: float | None = None


@dataclass(slots=True)
class Attempts:
    ambiguous: bool = False  # an attempt may have executed


# ------------------------------------------------------------------ judging answers
@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt of one request, as the retry loop judges it."""

    node_url: str
    error: RcqError
    finished_at: float  # loop time; with jitter, shared by the parts of one batch so they retry together
    jitter: float
    maybe_executed: bool = False
    retryable: bool = False  # the server (or the connection) says a retry can help
    rotate: bool = False  # try the next node
    retry_after_s: float | None = None
    location: str | None = None


Outcome = dict[str, Any] | Failure  # an attempt's answer, or why it failed


def failed_exchange(node_url: str, exc: ExchangeFailed) -> Failure:
    """No answer from ``node_url``: retryable at the next node; it may have executed if it was sent."""
    return Failure(node_url, exc.error, asyncio.get_running_loop().time(), random.uniform(0.5, 1.0),
                   maybe_executed=exc.maybe_sent, retryable=True, rotate=True)


def judge(node_url: str, status: int, payload: Any, retry_after_s: float | None, location: str | None,
          finished_at: float | None = None, jitter: float | None = None) -> Failure:
    """An error answer (of a request or of one part of a batch) as the retry loop sees it."""
    error = error_from_body(status, payload)
    has_body = isinstance(payload, dict) and isinstance(payload.get("error"), dict)
    return Failure(
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


def origin(location: str | None) -> str:
    """``scheme://host:port`` of a redirect's ``Location`` ("" if it has none)."""
    if not location:
        return ""
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


async def sleep_until(when: float) -> None:
    """Sleep until loop time ``when``."""
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
