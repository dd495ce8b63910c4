"""The transport's batching helper: requests submitted in the same event-loop iteration leave together.

With ``coalesce=True``, :class:`rcq.client.transport.Transport` submits each request that has a
``POST /v1/batch`` form here. The coalescer only groups and delivers: at the end of the loop
iteration it cuts what was submitted into batches (bounded in parts and in item bytes), hands
each batch to the transport's ``send_batch`` (one exchange, no retry) and gives each part's
outcome back to its caller. It never retries: deciding whether a part is sent again is the
transport's one retry loop, and a part sent again is simply submitted again.

Must not import: rcq.client.transport (it is handed its send function, so the transport owns
the HTTP, the errors and the policy), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rcq.errors import RcqError, Unavailable

COALESCE_PARTS_MAX = 1000
COALESCE_BYTES_MAX = 4 << 20  # estimated item bytes per /v1/batch body; the server allows 32 MiB

Outcome = TypeVar("Outcome")


@dataclass(slots=True, eq=False)
class _Part(Generic[Outcome]):
    body: dict[str, Any]
    size_bytes: int
    future: asyncio.Future[Outcome]


class Coalescer(Generic[Outcome]):
    """Sends the requests submitted in one loop iteration (any verb, any transaction) as one batch.

    ``send_batch(bodies)`` sends one batch once and returns one outcome per body, in order.
    ``spawn(coroutine)`` runs a batch in the background (the transport cancels those on close)."""

    def __init__(self, send_batch: Callable[[list[dict[str, Any]]], Awaitable[list[Outcome]]],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._send_batch = send_batch
        self._spawn = spawn
        self._pending: list[_Part[Outcome]] = []
        self._flush_scheduled = False
        self._closed = False

    def submit(self, body: dict[str, Any], size_bytes: int) -> asyncio.Future[Outcome]:
        """The outcome of ``body``'s ride in the next batch (an exception only if the client closes)."""
        part = _Part(body, size_bytes, asyncio.get_running_loop().create_future())
        if self._closed:
            self._fail(part, Unavailable("the client was closed"))
            return part.future
        self._pending.append(part)
        if not self._flush_scheduled:
            # call_soon: every task that runs in this iteration still gets to add its request
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return part.future

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        batch: list[_Part[Outcome]] = []
        size_bytes = 0
        for part in pending:
            if part.future.done():  # its caller was cancelled
                continue
            if batch and (len(batch) >= COALESCE_PARTS_MAX or size_bytes + part.size_bytes > COALESCE_BYTES_MAX):
                self._spawn(self._send(batch))
                batch, size_bytes = [], 0
            batch.append(part)
            size_bytes += part.size_bytes
        if batch:
            self._spawn(self._send(batch))

    async def _send(self, batch: list[_Part[Outcome]]) -> None:
        try:
            outcomes = await self._send_batch([part.body for part in batch])
        except RcqError as exc:  # e.g. the client closed before the batch left
            for part in batch:
                self._fail(part, exc)
            return
        except BaseException:  # cancelled by close() (or a bug): no caller may be left waiting
            for part in batch:
                self._fail(part, Unavailable("the client was closed"))
            raise
        for part, outcome in zip(batch, outcomes, strict=True):
            if not part.future.done():
                part.future.set_result(outcome)

    @staticmethod
    def _fail(part: _Part[Outcome], error: RcqError) -> None:
        if not part.future.done():
            part.future.set_exception(error)

    def close(self) -> None:
        self._closed = True
        pending, self._pending = self._pending, []
        for part in pending:
            self._fail(part, Unavailable("the client was closed"))
