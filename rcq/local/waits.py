"""Bounded waits: ask a predicate until it holds or a deadline passes, never a bare sleep.

One wait in two twins with one signature and one error: :func:`wait_until` blocks (scripts, the
launcher, worker threads, plain tests) and :func:`async_wait_until` is a coroutine (it sleeps with
asyncio between attempts, and awaits a predicate that returns an awaitable). Both:

* ask ``predicate`` at once, then every ``interval_s``, until it returns something truthy, which
  the wait returns (so a wait can hand back what it found: an answer, a line, a pid). A value
  that may be falsy when found (a node index 0) is returned in a list or tuple of one;
* take a predicate that raises as not holding yet (a node restarting refuses connections), and
  ask again; but for an ``AssertionError``, which ends the wait at once: a predicate fails a test,
  or gives up early (the job it waits on ended), as code outside a wait would;
* raise :class:`WaitTimeout` (a ``TimeoutError``) once ``timeout_s`` has passed, naming ``what``
  was waited for, the bound, and the last answer or error seen (the error is also its cause).

It lives in the product, beside the local clusters, so that the product may wait with it (the
product never imports :mod:`rcq.testing`); the harnesses (chaos, bench) import it from here, the
tests from :mod:`rcq.testing`, which re-exports it.

Must not import: anything but the standard library (a client-only install has it too).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

INTERVAL_S = 0.05  # between two attempts: short next to any bound, long next to a poll's own cost


class WaitTimeout(TimeoutError):
    """A bounded wait ran out: ``what`` did not hold within ``timeout_s``.

    ``last`` is the predicate's last answer (None if it raised); ``last_error`` the exception of
    its last attempt, if it raised (also the ``__cause__``)."""

    def __init__(self, what: str, timeout_s: float, last: Any = None, last_error: BaseException | None = None) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self.last = last
        self.last_error = last_error
        if last_error is not None:
            seen = f"; last error: {last_error!r}"
        elif last is not None and last is not False:
            seen = f"; last answer: {last!r}"
        else:
            seen = ""
        super().__init__(f"timed out after {timeout_s} s waiting for {what}{seen}")


class _Attempts:
    """The deadline and what the last attempt saw, shared by the two twins."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.last: Any = None
        self.last_error: Exception | None = None

    def saw(self, value: Any = None, error: Exception | None = None) -> None:
        self.last, self.last_error = value, error

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def timeout(self) -> WaitTimeout:
        return WaitTimeout(self.what, self.timeout_s, self.last, self.last_error)


def wait_until(predicate: Callable[[], T | None], timeout_s: float, *, what: str,
               interval_s: float = INTERVAL_S) -> T:
    """The first truthy answer of ``predicate``, asked every ``interval_s``; :class:`WaitTimeout`
    naming ``what`` once ``timeout_s`` has passed without one (see the module docstring)."""
    attempts = _Attempts(what, timeout_s)
    while True:
        try:
            value = predicate()
        except AssertionError:
            raise
        except Exception as exc:  # not holding yet: asked again
            attempts.saw(error=exc)
        else:
            if value:
                return value
            attempts.saw(value)
        if attempts.expired():
            raise attempts.timeout() from attempts.last_error
        time.sleep(interval_s)


@overload
async def async_wait_until(predicate: Callable[[], Awaitable[T | None]], timeout_s: float, *, what: str,
                           interval_s: float = INTERVAL_S) -> T: ...


@overload
async def async_wait_until(predicate: Callable[[], T | None], timeout_s: float, *, what: str,
                           interval_s: float = INTERVAL_S) -> T: ...


async def async_wait_until(predicate: Callable[[], Any], timeout_s: float, *, what: str,
                           interval_s: float = INTERVAL_S) -> Any:
    """:func:`wait_until` for a coroutine: the same arguments, answer and error; the predicate may
    return an awaitable (a coroutine function, ``asyncio.to_thread(...)``), which is awaited."""
    attempts = _Attempts(what, timeout_s)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except AssertionError:
            raise
        except Exception as exc:  # not holding yet: asked again
            attempts.saw(error=exc)
        else:
            if value:
                return value
            attempts.saw(value)
        if attempts.expired():
            raise attempts.timeout() from attempts.last_error
        await asyncio.sleep(interval_s)
