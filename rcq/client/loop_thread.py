"""One private event loop on a daemon thread, and coroutines run on it from any other thread.

:class:`LoopThread` is what lets synchronous code use the async client
(:mod:`rcq.client.sync`): the thread starts on the first call, every call is a task on its loop
(``asyncio.run_coroutine_threadsafe``), and the calling thread waits for the result, which
comes back as it left the coroutine (exceptions included). Many threads may call at once: their
tasks run concurrently on the loop, which is the only thing serialised.

Limits: starting waits at most ``START_TIMEOUT_S`` for the loop; closing gives the final
coroutine ``CLOSE_TIMEOUT_S``, then cancels what still runs and joins the thread for at most
``JOIN_TIMEOUT_S``. A call from the loop's own thread, after closing, or in a process forked
after the thread started raises RuntimeError at once instead of waiting for ever.

Must not import: the other client modules (this knows nothing of rcq), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import itertools
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0  # a new thread runs its loop within milliseconds; this only bounds a broken start
CLOSE_TIMEOUT_S = 10.0  # the final coroutine (the client's close) runs this long at most
JOIN_TIMEOUT_S = 10.0  # the thread ends this long after its loop is told to stop, at most

T = TypeVar("T")
_numbers = itertools.count(1)


class LoopThread:
    """A private event loop on a daemon thread, started by the first :meth:`run`. ``on_close``:
    the coroutine function :meth:`close` runs on the loop last (run only if the loop started);
    ``name``: the thread's name. Closed at interpreter exit if the program did not close it."""

    def __init__(self, on_close: Callable[[], Coroutine[Any, Any, None]], name: str = "rcq-loop") -> None:
        self._on_close = on_close
        self._name = f"{name}-{next(_numbers)}"
        self._lock = threading.Lock()  # the state below, and the order of submissions and closing
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._pid = 0  # the process that started the thread
        self._closed = False

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread (None before the first call)."""
        return self._thread

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (or its exception, re-raised here).
        An exception that interrupts the wait (KeyboardInterrupt) cancels the task."""
        try:
            future = self._submit(coroutine)
        except BaseException:
            coroutine.close()  # never scheduled: no "never awaited" warning
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:
                raise RuntimeError("the client was closed while this call ran; its outcome is unknown") from None
            raise
        except BaseException:
            future.cancel()  # a no-op when the coroutine itself raised: the future is done
            raise

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("a synchronous rcq client was called from its own event loop's thread, where it "
                               "would wait for itself for ever: in async code, use RcqClient")
        with self._lock:
            if self._closed:
                raise RuntimeError("this client is closed")
            if self._thread is None:
                self._start()
            elif os.getpid() != self._pid:
                raise RuntimeError(f"this client's thread was started in process {self._pid}, not in this one "
                                   "(forked after): make a client in each process, after the fork")
            assert self._loop is not None
            # under the lock: a close that comes after this call was submitted stops the loop after it
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _start(self) -> None:
        started = threading.Event()
        thread = threading.Thread(target=asyncio.run, args=(self._serve(started),), name=self._name, daemon=True)
        thread.start()
        if not started.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the event loop thread {self._name} did not start within {START_TIMEOUT_S} s")
        self._thread, self._pid = thread, os.getpid()
        atexit.register(self.close)

    async def _serve(self, started: threading.Event) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        started.set()
        await self._stopping.wait()
        # Returning ends asyncio.run, which cancels the tasks still running (their callers get
        # RuntimeError from run), then closes the loop.

    def close(self) -> None:
        """Run ``on_close`` on the loop (its exception is raised here), stop the loop (cancelling
        the calls still running) and join the thread. Idempotent; bounded (see the module)."""
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("a synchronous rcq client cannot be closed from its own event loop's thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None or loop is None or stopping is None:
            return  # never started: nothing was opened
        atexit.unregister(self.close)
        if os.getpid() != self._pid:
            return  # a forked copy: the thread and its loop are the parent's
        try:
            self._run_on_close(loop)
        finally:
            loop.call_soon_threadsafe(stopping.set)
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("the event loop thread %s did not end within %s s", self._name, JOIN_TIMEOUT_S)

    def _run_on_close(self, loop: asyncio.AbstractEventLoop) -> None:
        future = asyncio.run_coroutine_threadsafe(self._on_close(), loop)
        try:
            future.result(CLOSE_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            log.warning("closing the client took more than %s s; its loop is stopped anyway", CLOSE_TIMEOUT_S)
