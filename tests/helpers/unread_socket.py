"""A client that writes and does not read, over a raw socket with a small receive buffer: a session
channel (the upgrade and masked text frames written by hand) or pipelined HTTP requests. The
node's answers pile up on its side, which is what the back-pressure tests need to see.

``split_frames`` reads the node's side of a channel back (unmasked frames) once the test reads;
``flood_until_paused`` shrinks the kernel buffers of an in-process node's channel (the node's
send and receive buffers, the client's send buffer), then writes ``status`` frames to it until
the node stops reading it.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rcq.testing import async_wait_until
from tests.helpers import FLOOD_PAUSE_WAIT_S, LOCAL_WAIT_S

# The client's receive buffer: small, so that loopback holds little of what the node sends, but not
# below two of loopback's segments (MSS ~64 KiB): a receiver whose window can open by less than a
# segment sends no window update when it reads at last, and the node learns of the room only from
# its zero-window probes, which back off to seconds apart: a client that reads late could then
# miss the grace the node gives its close (seen beside the suite's parallel workers).
RECEIVE_BUFFER_BYTES = 128 << 10  # the kernel doubles it
# The node's side of a flooded channel sends into a small kernel buffer (flood_until_paused sets it):
# left to autotune, loopback lets it grow to 4 MiB, and the client must then write tens of thousands
# of frames before the node's own buffer fills. While they go, both receive queues sit full, and
# under CPU load loopback drops segments; the sender then retransmits on a timer that doubles (seen:
# 26 s apart after seven drops), and the flood stalls past its bound. A few frames' worth of
# kernel buffer makes the node's back-pressure what the test sees, after a few hundred frames.
NODE_SEND_BUFFER_BYTES = 16 << 10  # the kernel doubles it
# And the requests' way, once the node stops reading: left to autotune, the node's receive buffer
# may grow to tcp_rmem's maximum (32 MiB on some machines) and the client's send buffer to 4 MiB,
# so the flood's writes go on being taken for tens of thousands of frames after the node paused.
# Written slowly beside the suite's parallel workers, that outlasted the node's grace, and the
# flood met the node's reset (seen in CI) before it saw a write stall. Small buffers on both
# sides of that way make the first stall come a few hundred frames after the pause.
REQUEST_BUFFER_BYTES = 16 << 10  # the kernel doubles it
FRAMES_MAX = 200_000  # a flood's bound: far more than a node may read of a client that does not read
STALLED_S = 0.2  # a write the node has not taken for this long: look whether it stopped reading
OPCODE_TEXT, OPCODE_CLOSE = 0x1, 0x8


def masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        head = bytes([0x80 | OPCODE_TEXT, 0x80 | length])
    elif length < 1 << 16:
        head = bytes([0x80 | OPCODE_TEXT, 0x80 | 126]) + struct.pack(">H", length)
    else:
        head = bytes([0x80 | OPCODE_TEXT, 0x80 | 127]) + struct.pack(">Q", length)
    key = (mask * (length // 4 + 1))[:length]
    return head + mask + (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(length, "big")


def split_frames(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """The whole unmasked frames at the start of ``data``, and how many bytes they take."""
    out, position = [], 0
    while position + 2 <= len(data):
        opcode, length = data[position] & 0x0F, data[position + 1] & 0x7F
        extended = {126: 2, 127: 8}.get(length, 0)
        if position + 2 + extended > len(data):
            break
        if extended:
            length = int.from_bytes(data[position + 2:position + 2 + extended], "big")
        start = position + 2 + extended
        if start + length > len(data):
            break
        out.append((opcode, data[start:start + length]))
        position = start + length
    return out, position


@dataclass
class UnreadSocket:
    """A connection that writes until the node stops taking what it writes."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    head: bytes = b""  # what the node answered to the upgrade
    written: int = field(default=0)  # units (frames or requests) the kernel took

    @classmethod
    async def connect(cls, port: int) -> UnreadSocket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        return cls(reader, writer)

    @classmethod
    async def session_channel(cls, port: int, token: str | None, timeout_s: float) -> UnreadSocket:
        """A channel upgraded by hand; its 101 read, nothing else."""
        connection = await cls.connect(port)
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        connection.writer.write((f"GET /v1/session HTTP/1.1\r\nHost: rcq\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                                 f"Sec-WebSocket-Protocol: rcq.session.v1\r\n{auth}\r\n").encode())
        async with asyncio.timeout(timeout_s):
            connection.head = await connection.reader.readuntil(b"\r\n\r\n")
        assert connection.head.startswith(b"HTTP/1.1 101"), connection.head
        return connection

    async def write_until_refused(self, unit: bytes, units_max: int, stalled_s: float, batch: int = 100) -> int:
        """Write ``unit`` up to ``units_max`` times, ``batch`` at a time, until a write stays
        unwritten for ``stalled_s`` (the node stopped reading); how many the kernel took."""
        while self.written < units_max:
            self.writer.write(unit * batch)
            try:
                await asyncio.wait_for(self.writer.drain(), stalled_s)
            except TimeoutError:
                return self.written
            self.written += batch
        return self.written

    async def read_until_close(self, timeout_s: float) -> list[tuple[int, bytes]]:
        """The frames the node sends, up to and including its close frame (or the connection's end)."""
        # Parsed as they come (only the bytes not yet parsed): a node may have megabytes queued for a
        # client that read nothing, and the node's close waits for them only so long.
        received: list[tuple[int, bytes]] = []
        pending = b""
        async with asyncio.timeout(timeout_s):
            while chunk := await self.reader.read(1 << 18):
                parsed, used = split_frames(pending + chunk)
                pending = (pending + chunk)[used:]
                received += parsed
                if received and received[-1][0] == OPCODE_CLOSE:
                    return received
        return received

    def abort(self) -> None:
        self.writer.transport.abort()


def status_frame(frame_id: int) -> bytes:
    """A request any token may send (ids count up: one still in flight may not be reused)."""
    return masked_text_frame(json.dumps({"id": frame_id, "op": "status", "transaction_id": "f" * 26}))


async def flood_until_paused(channels: Collection[Any], flood: UnreadSocket) -> tuple[Any, int]:
    """Frames written to the one channel of ``channels`` (an in-process node's open channels) and
    no answer read, until the node stops reading it; the channel and how many frames were written."""
    await async_wait_until(lambda: channels, LOCAL_WAIT_S, what="the node opening the channel", interval_s=0.01)
    (channel,) = channels
    node_socket = channel.connection_info("socket")
    assert node_socket is not None, "the channel's connection is gone"
    node_socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, NODE_SEND_BUFFER_BYTES)
    node_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, REQUEST_BUFFER_BYTES)
    flood_socket = flood.writer.get_extra_info("socket")
    assert flood_socket is not None, "the flood's connection is gone"
    flood_socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, REQUEST_BUFFER_BYTES)
    async with asyncio.timeout(FLOOD_PAUSE_WAIT_S):
        for frame_id in range(1, FRAMES_MAX + 1):
            flood.writer.write(status_frame(frame_id))
            if frame_id % 100:
                continue
            while True:
                try:
                    await asyncio.wait_for(flood.writer.drain(), STALLED_S)
                    break
                except TimeoutError:
                    if channel.reading_paused:
                        return channel, frame_id
    raise AssertionError(f"the node read all {FRAMES_MAX} frames of a client that reads nothing")
