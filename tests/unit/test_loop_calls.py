"""LoopCalls: calls from another thread run on the loop in the order they were made, a burst with
one wake-up of the loop, a failing call logged without stopping the others."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from rcq.server.raft.loop_calls import LoopCalls
from tests.helpers import LOCAL_WAIT_S


def counting_wakes(monkeypatch: pytest.MonkeyPatch) -> tuple[LoopCalls, list[object]]:
    """LoopCalls bound to the running loop, and the list of every wake-up it asks of the loop."""
    loop = asyncio.get_running_loop()
    calls = LoopCalls()
    calls.bind(loop)
    wakes: list[object] = []
    schedule = loop.call_soon_threadsafe

    def counting(callback: object, *args: object) -> asyncio.Handle:
        wakes.append(callback)
        return schedule(callback, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    return calls, wakes


async def test_calls_from_another_thread_run_in_order_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    calls = LoopCalls()
    calls.bind(loop)
    seen: list[tuple[int, bool]] = []
    done = asyncio.Event()
    loop_thread = threading.get_ident()

    def record(number: int) -> None:
        seen.append((number, threading.get_ident() == loop_thread))
        if number == 999:
            done.set()

    def produce() -> None:
        for number in range(1000):
            calls.call(record, number)

    await asyncio.to_thread(produce)
    await asyncio.wait_for(done.wait(), LOCAL_WAIT_S)
    assert seen == [(number, True) for number in range(1000)]


async def test_a_burst_wakes_the_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, wakes = counting_wakes(monkeypatch)
    seen: list[int] = []
    for number in range(50):
        calls.call(seen.append, number)
    assert len(wakes) == 1
    await asyncio.sleep(0)  # the loop runs its ready callbacks: the drain
    assert seen == list(range(50))
    calls.call(seen.append, 50)  # after a drain, the next call schedules the next one
    assert len(wakes) == 2


async def test_a_failing_call_is_logged_and_the_next_ones_still_run(caplog: pytest.LogCaptureFixture) -> None:
    calls = LoopCalls()
    calls.bind(asyncio.get_running_loop())
    seen: list[str] = []

    def fail() -> None:
        raise ValueError("boom")

    calls.call(seen.append, "before")
    calls.call(fail)
    calls.call(seen.append, "after")
    with caplog.at_level(logging.ERROR, logger="rcq.server.raft.loop_calls"):
        await asyncio.sleep(0)
    assert seen == ["before", "after"]
    assert "a call from the Raft thread failed" in caplog.text


def test_a_closed_loop_raises_as_call_soon_threadsafe_does() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    calls = LoopCalls()
    calls.bind(loop)
    with pytest.raises(RuntimeError):
        calls.call(print, "never")
    with pytest.raises(RuntimeError):  # and the next call tries again rather than waiting for a drain
        calls.call(print, "never")


async def test_unhurried_calls_wake_nothing_and_run_in_order_at_the_next_drain_or_run_queued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls, wakes = counting_wakes(monkeypatch)
    seen: list[str] = []
    calls.call_unhurried(seen.append, "applied 1")
    calls.call_unhurried(seen.append, "applied 2")
    await asyncio.sleep(0)
    assert wakes == [] and seen == []  # queued, the loop not woken
    calls.call(seen.append, "urgent")  # an ordinary call: one wake-up runs everything, in order
    assert len(wakes) == 1
    await asyncio.sleep(0)
    assert seen == ["applied 1", "applied 2", "urgent"]
    calls.call_unhurried(seen.append, "applied 3")
    calls.run_queued()  # the loop's periodic pass
    assert seen[-1] == "applied 3" and len(wakes) == 1


async def test_run_queued_leaves_a_scheduled_drain_its_calls() -> None:
    loop = asyncio.get_running_loop()
    calls = LoopCalls()
    calls.bind(loop)
    seen: list[int] = []
    calls.call(seen.append, 1)  # a drain is scheduled
    calls.run_queued()  # runs it now
    calls.call(seen.append, 2)  # the scheduled drain is still pending: no second one
    await asyncio.sleep(0)
    assert seen == [1, 2]
