"""A fault-injecting TCP proxy: partitions, one-way drops, delay and loss without root.

Every *link* is one listening port on 127.0.0.1 that forwards each accepted
connection to one target port. The harness routes Raft traffic between every
pair of nodes and client traffic to every node through links, then changes a
link's :class:`LinkFault` while connections are open:

* **drop** in a direction (``forward`` = from the side that dialled to the
  target, ``backward`` = the answers): the bytes are read and discarded, as a
  network that loses every packet would. The sender sees silence, not a reset;
  a node notices only by its own timeouts. A connection that lost bytes has a
  broken stream, so healing the link closes it (TCP would have timed out) and
  the peers dial again. A connection accepted while either direction drops is
  held open and silent (a handshake needs both ways), never forwarded.
* **delay** (plus uniform jitter): every chunk is delivered ``delay_s`` late,
  in order.
* **loss**: TCP never loses bytes; lost packets show up as retransmission
  stalls. Each chunk is, with probability ``loss``, held back for a
  retransmission timeout (``LOSS_STALL_S``, doubled for each further loss in a
  row), which is what an application over a lossy link sees.

The proxy runs on its own event loop in a background thread
(:class:`ProxyThread`), so a busy workload cannot delay Raft heartbeats, and
is controlled from any thread through its synchronous methods. Everything is
bounded: connections per link, buffered chunks per direction, and the
connect timeout to the target.

Must not import rcq: it knows nothing of what it carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

HOST = "127.0.0.1"
CHUNK_BYTES = 64 * 1024
QUEUED_CHUNKS_MAX = 256  # per direction of a connection: a slow link pushes back on its sender
CONNECTIONS_PER_LINK_MAX = 64  # beyond this the oldest held connection is closed
CONNECT_TIMEOUT_S = 2.0
LOSS_STALL_S = 0.2  # Linux's minimum retransmission timeout
LOSS_STALLS_MAX = 3  # a chunk is held for at most LOSS_STALL_S * (2**LOSS_STALLS_MAX - 1)
CONTROL_TIMEOUT_S = 10.0
HALF_CLOSED_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True)
class LinkFault:
    """What a link does to its traffic. The default is a healthy link."""

    drop_forward: bool = False
    drop_backward: bool = False
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0 or not 0.0 <= self.loss <= 1.0:
            raise ValueError("delay_s and jitter_s must be >= 0 and loss within [0, 1]")

    @property
    def healthy(self) -> bool:
        return self == HEALTHY

    @property
    def partitioned(self) -> bool:
        return self.drop_forward or self.drop_backward

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}


HEALTHY = LinkFault()


@dataclasses.dataclass(eq=False)
class _Connection:
    client_writer: asyncio.StreamWriter
    upstream_writer: asyncio.StreamWriter | None = None
    tainted: bool = False  # bytes were dropped: its stream is broken
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    def close(self) -> None:
        for writer in (self.client_writer, self.upstream_writer):
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.transport.abort()  # at once, unflushed bytes included
        for task in self.tasks:
            task.cancel()


@dataclasses.dataclass(eq=False)
class Link:
    name: str
    target_port: int
    listen_port: int = 0
    fault: LinkFault = HEALTHY
    server: asyncio.base_events.Server | None = None
    connections: list[_Connection] = dataclasses.field(default_factory=list)
    accepted: int = 0
    bytes_forwarded: int = 0
    bytes_dropped: int = 0


class NetProxy:
    """The links and their faults; every method runs on the proxy's event loop."""

    def __init__(self, seed: int = 0) -> None:
        self.links: dict[str, Link] = {}
        self._random = random.Random(seed)

    async def add_link(self, name: str, target_port: int, listen_port: int = 0) -> int:
        """Listen on ``listen_port`` (0: any free one) and forward to ``target_port``; returns the port."""
        if name in self.links:
            raise ValueError(f"link {name!r} exists")
        link = Link(name, target_port)
        link.server = await asyncio.start_server(
            lambda r, w: self._accept(link, r, w), HOST, listen_port, reuse_address=True)
        link.listen_port = link.server.sockets[0].getsockname()[1]
        self.links[name] = link
        return link.listen_port

    async def remove_link(self, name: str) -> None:
        link = self.links.pop(name)
        self.reset_link(link)
        if link.server is not None:
            link.server.close()
            await link.server.wait_closed()

    def reset_link(self, link: Link) -> None:
        for connection in list(link.connections):
            self._drop(link, connection)

    def set_fault(self, name: str, fault: LinkFault) -> None:
        link = self.links[name]
        was_partitioned = link.fault.partitioned
        link.fault = fault
        if was_partitioned and not fault.partitioned:
            # Held and byte-losing connections cannot carry on: close them, the peers redial.
            for connection in list(link.connections):
                if connection.tainted or connection.upstream_writer is None:
                    self._drop(link, connection)

    def heal(self, names: list[str] | None = None) -> None:
        for name in names if names is not None else list(self.links):
            self.set_fault(name, HEALTHY)

    def reset(self, name: str) -> None:
        """Close every connection of a link (as a restarted router would)."""
        self.reset_link(self.links[name])

    def faults(self) -> dict[str, dict[str, Any]]:
        return {name: link.fault.describe() for name, link in self.links.items() if not link.fault.healthy}

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: {"accepted": link.accepted, "open": len(link.connections),
                       "bytes_forwarded": link.bytes_forwarded, "bytes_dropped": link.bytes_dropped}
                for name, link in self.links.items()}

    async def close(self) -> None:
        for link in self.links.values():
            if link.server is not None:
                link.server.close()
            for connection in list(link.connections):
                self._drop(link, connection)
        for link in self.links.values():
            if link.server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(link.server.wait_closed(), CONTROL_TIMEOUT_S)

    # ------------------------------------------------------------ connections
    def _drop(self, link: Link, connection: _Connection) -> None:
        connection.close()
        if connection in link.connections:
            link.connections.remove(connection)

    async def _accept(self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link.accepted += 1
        connection = _Connection(writer)
        link.connections.append(connection)
        if len(link.connections) > CONNECTIONS_PER_LINK_MAX:
            self._drop(link, link.connections[0])
        try:
            if link.fault.partitioned:  # no handshake across a partition: hold it, silent
                connection.tainted = True
                await self._discard(link, reader)
                return
            try:
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(HOST, link.target_port), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                return  # refused upstream: refuse here too (by closing)
            connection.upstream_writer = upstream_writer
            if connection not in link.connections:  # closed while connecting
                return
            forward = asyncio.create_task(self._pump(link, connection, reader, upstream_writer, True))
            backward = asyncio.create_task(self._pump(link, connection, upstream_reader, writer, False))
            connection.tasks += [forward, backward]
            _, pending = await asyncio.wait([forward, backward], return_when=asyncio.FIRST_COMPLETED)
            # One side closed: the other may still be answering (a half-close); not for long.
            if pending:
                await asyncio.wait(pending, timeout=HALF_CLOSED_GRACE_S)
        except asyncio.CancelledError:
            pass
        finally:
            self._drop(link, connection)

    async def _discard(self, link: Link, reader: asyncio.StreamReader) -> None:
        while True:
            data = await reader.read(CHUNK_BYTES)
            if not data:
                return
            link.bytes_dropped += len(data)

    async def _pump(self, link: Link, connection: _Connection, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, forward: bool) -> None:
        """Copy one direction, applying the link's fault to every chunk as it arrives."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUED_CHUNKS_MAX)
        sender = asyncio.create_task(self._send(link, connection, queue, writer))
        connection.tasks.append(sender)
        loop = asyncio.get_running_loop()
        last_due = 0.0
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                fault = link.fault
                if fault.drop_forward if forward else fault.drop_backward:
                    connection.tainted = True
                    link.bytes_dropped += len(data)
                    continue
                due = loop.time() + fault.delay_s + (self._random.uniform(0, fault.jitter_s) if fault.jitter_s else 0)
                stall_s = LOSS_STALL_S
                for _ in range(LOSS_STALLS_MAX):
                    if fault.loss <= 0 or self._random.random() >= fault.loss:
                        break
                    due += stall_s
                    stall_s *= 2
                last_due = max(last_due, due)  # in order, as TCP delivers
                await queue.put((last_due, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        await sender

    async def _send(self, link: Link, connection: _Connection, queue: asyncio.Queue[tuple[float, bytes] | None],
                    writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                due, data = item
                wait_s = due - loop.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                writer.write(data)
                await writer.drain()
                link.bytes_forwarded += len(data)
        except OSError:  # the receiver is gone: nothing more can flow either way
            connection.close()
            return
        with contextlib.suppress(Exception):
            writer.write_eof()  # half-close: the other direction may still be talking


class ProxyThread:
    """A :class:`NetProxy` on its own event loop in a daemon thread, driven synchronously."""

    def __init__(self, seed: int = 0) -> None:
        self.proxy = NetProxy(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="chaos-netproxy", daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait(CONTROL_TIMEOUT_S)
        self._closed = False

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        self._loop.run_forever()
        self._loop.close()

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def wrapper() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(wrapper(), self._loop)
        return future.result(CONTROL_TIMEOUT_S)

    def _call_sync(self, function: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return function()

        return self._call(wrapper)

    def add_link(self, name: str, target_port: int, listen_port: int = 0) -> int:
        return self._call(lambda: self.proxy.add_link(name, target_port, listen_port))

    def remove_link(self, name: str) -> None:
        self._call(lambda: self.proxy.remove_link(name))

    def set_fault(self, name: str, fault: LinkFault) -> None:
        self._call_sync(lambda: self.proxy.set_fault(name, fault))

    def set_faults(self, faults: dict[str, LinkFault]) -> None:
        def apply() -> None:
            for name, fault in faults.items():
                self.proxy.set_fault(name, fault)

        self._call_sync(apply)

    def heal(self, names: list[str] | None = None) -> None:
        self._call_sync(lambda: self.proxy.heal(names))

    def reset(self, name: str) -> None:
        self._call_sync(lambda: self.proxy.reset(name))

    def faults(self) -> dict[str, dict[str, Any]]:
        return self._call_sync(self.proxy.faults)

    def stats(self) -> dict[str, dict[str, int]]:
        return self._call_sync(self.proxy.stats)

    def link_names(self) -> list[str]:
        return self._call_sync(lambda: list(self.proxy.links))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._call(self.proxy.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)

    def __enter__(self) -> ProxyThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
