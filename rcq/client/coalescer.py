"""Coalescing: requests made in the same event-loop iteration share one ``POST /v1/batch``.

Used by :class:`rcq.client.RcqClient` with ``coalesce=True``. Every part is a
sub-request of ``/v1/batch`` (any verb, any transaction) that is safe to
re-send (keys and idempotency keys), so a whole batch may be re-sent after an
ambiguous failure; each part's answer or error goes back to its own caller,
and parts that failed with a retryable error are queued again.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rcq.errors import CommitOutcomeUnknown, InvalidRequest, PayloadTooLarge, RcqError, Unavailable, error_from_body

COALESCE_PARTS_MAX = 1000
COALESCE_BYTES_MAX = 4 << 20  # estimated item bytes per /v1/batch body; the server allows 32 MiB
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0


@dataclass(slots=True)
class Attempts:
    ambiguous: bool = False  # an attempt may have executed


# send(bodies, deadline, attempts) -> the /v1/batch answer, retried as a write until the deadline
SendBatch = Callable[[list[dict[str, Any]], float, Attempts], Awaitable[Any]]


@dataclass(slots=True, eq=False)
class _Part:
    body: dict[str, Any]
    size_bytes: int
    deadline: float
    future: asyncio.Future[dict[str, Any]]
    delay_s: float = BACKOFF_FIRST_S
    ambiguous: bool = False


class Coalescer:
    """Sends the requests made in one loop iteration (any verb, any transaction) as one POST /v1/batch."""

    def __init__(self, send: SendBatch, spawn: Callable[[Any], None], retry_timeout_s: float) -> None:
        self._send_batch = send
        self._spawn = spawn
        self._retry_timeout_s = retry_timeout_s
        self._pending: list[_Part] = []
        self._flush_scheduled = False
        self._closed = False
        self.batches_sent = 0

    def submit(self, body: dict[str, Any], size_bytes: int) -> asyncio.Future[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        part = _Part(body, size_bytes, loop.time() + self._retry_timeout_s, loop.create_future())
        self._add(part)
        return part.future

    def _add(self, part: _Part) -> None:
        if self._closed:
            self._give_up(part, Unavailable("the client was closed"))
            return
        self._pending.append(part)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        batch: list[_Part] = []
        size = 0
        for part in pending:
            if part.future.done():  # its caller was cancelled
                continue
            if batch and (len(batch) >= COALESCE_PARTS_MAX or size + part.size_bytes > COALESCE_BYTES_MAX):
                self._spawn(self._send(batch))
                batch, size = [], 0
            batch.append(part)
            size += part.size_bytes
        if batch:
            self._spawn(self._send(batch))

    async def _send(self, batch: list[_Part]) -> None:
        self.batches_sent += 1
        attempts = Attempts()
        try:
            # Every sub-request is retry-safe (keys and idempotency keys), so the whole batch
            # may be re-sent after an ambiguous failure.
            answer = await self._send_batch([p.body for p in batch], min(p.deadline for p in batch), attempts)
        except (InvalidRequest, PayloadTooLarge) as exc:
            if len(batch) == 1:
                self._give_up(batch[0], exc)
                return
            # one part spoils the whole body: let each caller get its own answer
            await asyncio.gather(*(self._send([p]) for p in batch))
            return
        except RcqError as exc:
            for part in batch:
                self._give_up(part, exc)
            return
        except BaseException:
            for part in batch:
                self._give_up(part, Unavailable("the client was closed"))
            raise
        responses = answer.get("responses") if isinstance(answer, dict) else None
        if not isinstance(responses, list) or len(responses) != len(batch):
            for part in batch:
                self._give_up(part, CommitOutcomeUnknown("/v1/batch answered with a malformed body"))
            return
        for part, response in zip(batch, responses, strict=True):
            self._settle(part, response, attempts.ambiguous)

    def _settle(self, part: _Part, response: Any, ambiguous: bool) -> None:
        if part.future.done():
            return
        status = int(response.get("status") or 500) if isinstance(response, dict) else 500
        body = response.get("body") if isinstance(response, dict) else None
        if status < 300:
            part.future.set_result(body if isinstance(body, dict) else {})
            return
        error = error_from_body(status, body)
        part.ambiguous = part.ambiguous or ambiguous or isinstance(error, CommitOutcomeUnknown)
        loop = asyncio.get_running_loop()
        if (error.retryable or isinstance(error, CommitOutcomeUnknown)) and loop.time() + part.delay_s < part.deadline:
            # not executed (503, 429, 307) or unknown (504): the part is safe to send again (see module)
            loop.call_later(part.delay_s * random.uniform(0.5, 1.0), self._add, part)
            part.delay_s = min(part.delay_s * 2, BACKOFF_MAX_S)
            return
        self._give_up(part, error)

    @staticmethod
    def _give_up(part: _Part, error: RcqError) -> None:
        """Answer the caller with ``error``; after an attempt whose outcome is unknown, a failure
        that says "not executed" only speaks for the last attempt: the outcome stays unknown."""
        if part.future.done():
            return
        if part.ambiguous and error.retryable and not isinstance(error, CommitOutcomeUnknown):
            error = CommitOutcomeUnknown(f"gave up after an attempt with an unknown outcome: {error.message}")
        part.future.set_exception(error)

    def close(self) -> None:
        self._closed = True
        pending, self._pending = self._pending, []
        for part in pending:
            self._give_up(part, Unavailable("the client was closed"))
