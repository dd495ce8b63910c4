"""The fault-injecting proxy: partitions really drop, one-way drops one way, heal restores, delay delays."""

from __future__ import annotations

import asyncio
import time

import pytest

from chaos.netproxy import HOST, LinkFault, NetProxy, ProxyThread
from tests.helpers import PROXY_ANSWER_TIMEOUT_S

SILENCE_S = 0.5  # how long "nothing arrives" is watched for


class EchoServer:
    """Echoes every byte back; remembers what it received and its open writers."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, HOST, 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        while data := await reader.read(65536):
            self.received += data
            writer.write(data)
            await writer.drain()
        writer.close()

    async def close(self) -> None:
        assert self.server is not None
        for writer in self.writers:
            writer.close()
        self.server.close()


@pytest.fixture
async def echo():
    server = EchoServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def proxy():
    net = NetProxy(seed=1)
    yield net
    await net.close()


async def roundtrip(reader, writer, payload: bytes) -> bytes:
    writer.write(payload)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(payload)), PROXY_ANSWER_TIMEOUT_S)


async def test_a_healthy_link_forwards_both_ways(echo, proxy):
    port = await proxy.add_link("a->b", echo.server.sockets[0].getsockname()[1])
    reader, writer = await asyncio.open_connection(HOST, port)
    assert await roundtrip(reader, writer, b"hello") == b"hello"
    writer.close()


async def test_a_partition_drops_everything_and_heal_restores(echo, proxy):
    port = await proxy.add_link("a->b", echo.server.sockets[0].getsockname()[1])
    reader, writer = await asyncio.open_connection(HOST, port)
    assert await roundtrip(reader, writer, b"before") == b"before"
    proxy.set_fault("a->b", LinkFault(drop_forward=True, drop_backward=True))
    writer.write(b"during")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), SILENCE_S)
    assert bytes(echo.received) == b"before"  # the server never saw it

    # a new connection across the partition is held, silent, and never reaches the server
    held_reader, held_writer = await asyncio.open_connection(HOST, port)
    held_writer.write(b"knock")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(held_reader.read(1), SILENCE_S)
    assert echo.accepted == 1

    proxy.heal()
    # the connections that lost bytes are closed (their streams are broken) ...
    assert await asyncio.wait_for(reader.read(), PROXY_ANSWER_TIMEOUT_S) == b""
    assert await asyncio.wait_for(held_reader.read(), PROXY_ANSWER_TIMEOUT_S) == b""
    writer.close()
    held_writer.close()
    # ... and new ones work again
    reader, writer = await asyncio.open_connection(HOST, port)
    assert await roundtrip(reader, writer, b"after") == b"after"
    writer.close()


async def test_a_one_way_drop_loses_one_direction_only(echo, proxy):
    port = await proxy.add_link("a->b", echo.server.sockets[0].getsockname()[1])
    reader, writer = await asyncio.open_connection(HOST, port)
    assert await roundtrip(reader, writer, b"x") == b"x"
    proxy.set_fault("a->b", LinkFault(drop_forward=True))
    writer.write(b"lost")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), SILENCE_S)
    assert bytes(echo.received) == b"x"
    echo.writers[0].write(b"still flows")  # the other way still works
    assert await asyncio.wait_for(reader.readexactly(11), PROXY_ANSWER_TIMEOUT_S) == b"still flows"
    writer.close()


async def test_delay_delays_each_direction(echo, proxy):
    port = await proxy.add_link("a->b", echo.server.sockets[0].getsockname()[1])
    reader, writer = await asyncio.open_connection(HOST, port)
    await roundtrip(reader, writer, b"warm")
    proxy.set_fault("a->b", LinkFault(delay_s=0.25))
    started = time.monotonic()
    assert await roundtrip(reader, writer, b"slow") == b"slow"
    assert time.monotonic() - started >= 0.5  # 0.25 s there and 0.25 s back
    proxy.heal()
    started = time.monotonic()
    await roundtrip(reader, writer, b"fast")
    assert time.monotonic() - started < 0.5
    writer.close()


async def test_loss_stalls_but_never_corrupts_the_stream(echo, proxy):
    port = await proxy.add_link("a->b", echo.server.sockets[0].getsockname()[1])
    proxy.set_fault("a->b", LinkFault(loss=0.3))
    reader, writer = await asyncio.open_connection(HOST, port)
    payloads = [f"message {i};".encode() for i in range(20)]
    for payload in payloads:
        assert await roundtrip(reader, writer, payload) == payload
    writer.close()


def test_the_proxy_thread_is_driven_synchronously():
    import socket

    with socket.socket() as server:
        server.bind((HOST, 0))
        server.listen()
        target = server.getsockname()[1]
        with ProxyThread(seed=3) as proxy:
            port = proxy.add_link("x", target)
            proxy.set_fault("x", LinkFault(delay_s=0.1))
            assert proxy.faults() == {"x": {"delay_s": 0.1}}
            with socket.create_connection((HOST, port), timeout=PROXY_ANSWER_TIMEOUT_S):
                accepted, _ = server.accept()
                accepted.close()
            proxy.heal()
            assert proxy.faults() == {}
            assert proxy.stats()["x"]["accepted"] == 1
