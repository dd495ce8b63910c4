"""The one bounded wait (rcq.local.waits), in its two twins: the same answers, the same error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from rcq.local import waits
from rcq.testing import WaitTimeout, async_wait_until, wait_until
from tests.helpers import EXPIRING_WAIT_S, LOCAL_WAIT_S


def run_sync(predicate: Callable[[], Any], timeout_s: float, **options: Any) -> Any:
    return wait_until(predicate, timeout_s, **options)


def run_async(predicate: Callable[[], Any], timeout_s: float, **options: Any) -> Any:
    return asyncio.run(async_wait_until(predicate, timeout_s, **options))


TWINS = pytest.mark.parametrize("wait", [run_sync, run_async], ids=["sync", "async"])


def test_rcq_testing_re_exports_the_one_helper() -> None:
    assert (wait_until, async_wait_until, WaitTimeout) == (waits.wait_until, waits.async_wait_until, waits.WaitTimeout)
    assert issubclass(WaitTimeout, TimeoutError)


@TWINS
def test_a_predicate_that_holds_ends_the_wait_with_its_answer(wait: Callable[..., Any]) -> None:
    answers = iter([0, None, "", [], "node-2"])
    assert wait(lambda: next(answers), LOCAL_WAIT_S, what="an answer", interval_s=0) == "node-2"


@TWINS
def test_a_predicate_that_never_holds_raises_wait_timeout_naming_what_and_the_bound(wait: Callable[..., Any]) -> None:
    calls: list[int] = []
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as caught:
        wait(lambda: calls.append(1), EXPIRING_WAIT_S, what="nothing to come", interval_s=0.01)
    assert EXPIRING_WAIT_S <= time.monotonic() - started < LOCAL_WAIT_S
    assert len(calls) >= 2, "asked again until the deadline, not once"
    assert str(caught.value) == f"timed out after {EXPIRING_WAIT_S} s waiting for nothing to come"
    assert (caught.value.what, caught.value.timeout_s) == ("nothing to come", EXPIRING_WAIT_S)


@TWINS
def test_the_timeout_shows_the_last_answer_seen_unless_it_was_false_or_none(wait: Callable[..., Any]) -> None:
    with pytest.raises(WaitTimeout, match=r"waiting for two nodes; last answer: \[\]$"):
        wait(lambda: [], EXPIRING_WAIT_S, what="two nodes", interval_s=0.01)
    with pytest.raises(WaitTimeout, match=r"waiting for two nodes; last answer: 0$"):
        wait(lambda: 0, EXPIRING_WAIT_S, what="two nodes", interval_s=0.01)
    for answer in (False, None):
        with pytest.raises(WaitTimeout, match=r"waiting for two nodes$"):
            wait(lambda answer=answer: answer, EXPIRING_WAIT_S, what="two nodes", interval_s=0.01)


@TWINS
def test_a_predicate_that_raises_is_asked_again_and_its_last_error_is_the_cause(wait: Callable[..., Any]) -> None:
    attempts = iter(range(1000))

    def refused_twice() -> str:
        if next(attempts) < 2:
            raise ConnectionRefusedError("the node restarts")
        return "serving"

    assert wait(refused_twice, LOCAL_WAIT_S, what="the node", interval_s=0) == "serving"

    def refused() -> bool:
        raise ConnectionRefusedError("the node is down")

    with pytest.raises(WaitTimeout, match=r"; last error: ConnectionRefusedError\('the node is down'\)$") as caught:
        wait(refused, EXPIRING_WAIT_S, what="the node", interval_s=0.01)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    assert caught.value.last_error is caught.value.__cause__


@TWINS
def test_an_assertion_in_the_predicate_ends_the_wait_at_once(wait: Callable[..., Any]) -> None:
    def gave_up() -> bool:
        raise AssertionError("the job ended before any task held")

    started = time.monotonic()
    with pytest.raises(AssertionError, match="the job ended"):
        wait(gave_up, LOCAL_WAIT_S, what="a held task")
    assert time.monotonic() - started < LOCAL_WAIT_S / 2


async def test_the_async_twin_awaits_a_predicate_that_returns_an_awaitable() -> None:
    event = asyncio.Event()

    async def is_set() -> bool:
        return event.is_set()

    asyncio.get_running_loop().call_soon(event.set)
    assert await async_wait_until(is_set, LOCAL_WAIT_S, what="the event") is True
    assert await async_wait_until(lambda: asyncio.to_thread(lambda: [0]), LOCAL_WAIT_S, what="node 0") == [0]
    with pytest.raises(WaitTimeout, match="waiting for a coroutine's answer"):
        await async_wait_until(lambda: asyncio.sleep(0, result=False), EXPIRING_WAIT_S,
                               what="a coroutine's answer", interval_s=0.01)


async def test_the_async_twin_lets_the_loop_run_between_attempts() -> None:
    ticks: list[int] = []

    async def ticker() -> None:
        while True:
            ticks.append(1)
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        assert await async_wait_until(lambda: len(ticks) >= 3, LOCAL_WAIT_S, what="three ticks", interval_s=0.01)
    finally:
        task.cancel()
