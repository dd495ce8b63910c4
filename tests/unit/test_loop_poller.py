"""LoopPoller (rcq.server.raft.loop_ticker): pysyncobj's sockets watched by the asyncio loop, from
the loop's thread or the guard's, including a descriptor number reused by a new socket before
the loop learnt that the old one closed (what left two nodes unconnected, as candidates for
ever, after the guard had reconnected them)."""

from __future__ import annotations

import asyncio
import socket

from pysyncobj.poller import POLL_EVENT_TYPE

from rcq.server.raft.loop_ticker import LoopPoller
from tests.helpers import LOCAL_WAIT_S

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR


async def test_a_readable_socket_calls_its_callback_and_asks_for_a_tick() -> None:
    poller = LoopPoller(asyncio.get_running_loop())
    ticks: list[int] = []
    poller.on_event = lambda: ticks.append(1)
    ours, theirs = socket.socketpair()
    seen = asyncio.Event()
    try:
        poller.subscribe(ours.fileno(), lambda descr, event: seen.set() if event & READ else None, READ | ERROR)
        theirs.send(b"x")
        await asyncio.wait_for(seen.wait(), LOCAL_WAIT_S)
        assert ticks
        poller.unsubscribe(ours.fileno())
    finally:
        ours.close()
        theirs.close()


async def test_a_number_reused_off_the_loop_is_watched_for_the_new_socket() -> None:
    loop = asyncio.get_running_loop()
    poller = LoopPoller(loop)
    old, old_peer = socket.socketpair()
    poller.subscribe(old.fileno(), lambda descr, event: None, READ | ERROR)
    reused = asyncio.Event()
    sockets: list[socket.socket] = []

    def guard() -> None:  # as pysyncobj does on the guard's thread: close, unsubscribe, connect anew
        number = old.fileno()
        old.close()
        old_peer.close()
        poller.unsubscribe(number)
        new, new_peer = socket.socketpair()
        sockets.extend((new, new_peer))
        assert number in (new.fileno(), new_peer.fileno())  # the lowest free numbers come back
        mine = new if new.fileno() == number else new_peer
        # A connecting socket waits to be writable: the loop must now watch a number it watched
        # for reading only, and whose old socket is gone.
        poller.subscribe(number, lambda descr, event: loop.call_soon(reused.set) if event & WRITE else None,
                         WRITE | ERROR)
        assert mine.fileno() == number

    try:
        await asyncio.to_thread(guard)
        await asyncio.wait_for(reused.wait(), LOCAL_WAIT_S)
    finally:
        for s in sockets:
            poller.unsubscribe(s.fileno())
            s.close()


async def test_poll_now_dispatches_what_is_ready_without_the_loop() -> None:
    poller = LoopPoller(asyncio.get_running_loop())
    ours, theirs = socket.socketpair()
    events: list[int] = []
    try:
        poller.subscribe(ours.fileno(), lambda descr, event: events.append(event), READ | ERROR)
        theirs.send(b"x")
        with poller.lock:
            await asyncio.to_thread(poller.poll_now)  # the guard's poll, on another thread
        assert events and events[0] & READ
        poller.unsubscribe(ours.fileno())
    finally:
        ours.close()
        theirs.close()
