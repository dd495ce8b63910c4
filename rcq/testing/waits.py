"""Bounded waits for tests and harnesses: poll a condition until it holds or a deadline passes.

Must not import: anything of rcq's server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float,
                     interval_s: float = 0.02, message: str = "condition") -> None:
    """Poll ``predicate`` until it is true; raise TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
                value = await value
            if value:
                return
            last_error = None
        except Exception as exc:  # the predicate may fail while a cluster settles
            last_error = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} not reached within {timeout_s} s"
                               + (f"; last error: {last_error!r}" if last_error else ""))
        await asyncio.sleep(interval_s)
