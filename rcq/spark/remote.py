"""Synchronous calls to rcq for Spark's driver and executor processes.

Spark calls the data source from plain synchronous Python. Each call here runs
one coroutine on a fresh event loop (``asyncio.run``) with its own
:class:`~rcq.client.RcqClient`: no loop, thread or connection outlives the
call, so nothing breaks when Spark forks, pickles or reuses a worker. The cost
is one TCP connection and, at worst, one redirect to the leader per call:
about a millisecond, paid once per task or per micro-batch planning step.

rcq errors leave as :class:`RcqSparkError` whose message starts with the rcq
error code, so a failed Spark task says which rcq error it hit; Spark then
retries the task as usual.

Must not import: pyspark, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rcq.client import RcqClient
from rcq.errors import RcqError
from rcq.spark.options import RcqOptions

T = TypeVar("T")


class RcqSparkError(RuntimeError):
    """An rcq request made by the Spark data source failed; the message starts with ``rcq <code>:``."""


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def client_for(options: RcqOptions, *, coalesce: bool = False) -> RcqClient:
    """A client with the options' token and CAs. No token in the options is sent as none (``""``):
    the driver already looked at its $RCQ_TOKEN, and an executor's own must not apply instead."""
    return RcqClient(list(options.urls), request_timeout_s=options.request_timeout_s,
                     retry_timeout_s=options.retry_timeout_s, coalesce=coalesce, token=options.token or "",
                     ssl_context=options.tls_context())


def call(options: RcqOptions, work: Callable[[RcqClient], Awaitable[T]], what: str, *, coalesce: bool = False) -> T:
    """Run ``work(client)`` to completion; ``what`` says what for error messages ("committing job x")."""

    async def main() -> T:
        async with client_for(options, coalesce=coalesce) as client:
            return await work(client)

    try:
        if _in_running_loop():  # e.g. a notebook's driver: asyncio.run would refuse
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                return pool.submit(asyncio.run, main()).result()
        return asyncio.run(main())
    except RcqError as exc:
        raise RcqSparkError(f"rcq {exc.code}: {what} (queue {options.queue!r}, "
                            f"urls {','.join(options.urls)}): {exc.message}") from exc
