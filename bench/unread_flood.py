"""A client that writes and never reads: what the leader holds for it.

``python -m bench.unread_flood [--frames 1000000] [--mode channel|http]`` starts a fresh local
3-node cluster (or floods ``--url`` with ``--pid`` and ``--token``: a node of another checkout,
for a before/after), connects to the leader over a raw socket with a 4 KiB receive buffer, and
writes up to ``--frames`` requests without reading an answer: ``status`` frames over a session
channel (``channel``: any valid token may send them) or pipelined ``GET /healthz`` (``http``).
It stops writing when the node has taken nothing for ``--stall-s``, or after ``--duration-s``.
It samples the leader's VmRSS every 50 ms and prints: frames attempted and taken by the kernel,
frames the node read (``rcq_session_frames_in_total``), the leader's RSS before, at its peak and
after, and, still not reading for up to ``--hold-s``, when and with which code the node ended
the channel. Before the unsent-answer bound (issue: the session channel tried as an attacker),
the node read every frame and kept every answer.

Must not import: rcq.server (the nodes are separate processes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import struct
import time
from pathlib import Path

import aiohttp

from rcq.local.cluster import LocalCluster

RECEIVE_BUFFER_BYTES = 4096
BATCH = 1000
SAMPLE_INTERVAL_S = 0.05


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def masked_text(payload: bytes) -> bytes:
    mask, length = os.urandom(4), len(payload)
    head = bytes([0x81, 0x80 | length]) if length < 126 else bytes([0x81, 0x80 | 126]) + struct.pack(">H", length)
    key = (mask * (length // 4 + 1))[:length]
    return head + mask + (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(length, "big")


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return await asyncio.open_connection(sock=sock)


async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write((f"GET /v1/session HTTP/1.1\r\nHost: rcq\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: rcq.session.v1\r\n"
                  f"{auth}\r\n").encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    if not head.startswith(b"HTTP/1.1 101"):
        raise SystemExit(f"the upgrade was refused: {head[:200]!r}")


async def sample_rss(pid: int, peak: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_mib(pid))
        await asyncio.sleep(SAMPLE_INTERVAL_S)


async def frames_in(url: str, token: str | None) -> float:
    """Frames the node read of session channels, or (http) its answered GET /healthz."""
    channel = (await metric(url, token, "rcq_session_frames_in_total")).get("", 0.0)
    http = sum(value for labels, value in (await metric(url, token, "rcq_http_requests_total")).items()
               if 'route="/healthz"' in labels)
    return channel + http


async def flood(args: argparse.Namespace, url: str, pid: int, token: str | None) -> None:
    reader, writer = await connect(url)
    if args.mode == "channel":
        await upgrade(reader, writer, token)
    before_frames = await frames_in(url, token)
    before, peak, stop = rss_mib(pid), [0.0], asyncio.Event()
    sampler = asyncio.create_task(sample_rss(pid, peak, stop))
    started, attempted, taken = time.monotonic(), 0, 0
    unit = (masked_text(json.dumps({"id": 1, "op": "status", "transaction_id": "f" * 26}).encode())
            if args.mode == "channel" else b"GET /healthz HTTP/1.1\r\nHost: rcq\r\n\r\n")
    ended = "the flood's end"
    try:
        while attempted < args.frames and time.monotonic() - started < args.duration_s:
            if args.mode == "channel":  # ids count up: an id still in flight may not be reused
                data = b"".join(masked_text(json.dumps({"id": attempted + i + 1, "op": "status",
                                                        "transaction_id": "f" * 26}).encode()) for i in range(BATCH))
            else:
                data = unit * BATCH
            writer.write(data)
            attempted += BATCH
            try:
                await asyncio.wait_for(writer.drain(), args.stall_s)
                taken += BATCH
            except TimeoutError:
                ended = f"the node took nothing for {args.stall_s:g} s"
                break
    except ConnectionError as exc:
        ended = f"the connection ended while writing ({type(exc).__name__})"
    stalled_at = time.monotonic() - started
    during = await frames_in(url, token)
    print(f"mode {args.mode}: {attempted:,} frames attempted, {taken:,} taken by the kernel in {stalled_at:.1f} s "
          f"({ended}); the node read {during - before_frames:,.0f}")
    # still not reading: how does the node end it (its channels gauge back to 0)? bounded by --hold-s
    ended_after = None
    if args.mode == "channel":
        deadline = time.monotonic() + args.hold_s
        while time.monotonic() < deadline:
            if (await metric(url, token, "rcq_session_channels")).get("") == 0:
                ended_after = time.monotonic() - started
                break
            await asyncio.sleep(0.5)
    closes = {labels: value for labels, value in (await metric(url, token, "rcq_session_channels_closed_total")).items()}
    try:
        async with asyncio.timeout(1.0):
            data = await reader.read(1 << 16)
        outcome = f"then read {len(data)} bytes" if data else "then EOF"
    except (ConnectionError, TimeoutError) as exc:
        outcome = f"then {type(exc).__name__}"
    writer.transport.abort()
    stop.set()
    await sampler
    print(f"leader VmRSS: {before:.1f} MiB before, peak {peak[0]:.1f} MiB (+{peak[0] - before:.1f}), "
          f"{rss_mib(pid):.1f} MiB after the flood")
    if args.mode == "channel":
        print("the channel " + (f"ended {ended_after:.1f} s after the flood began" if ended_after is not None
                                else f"was still open {args.hold_s:g} s after the flood stalled")
              + f"; closes by code {closes}; the client {outcome}")


async def metric(url: str, token: str | None, name: str) -> dict[str, float]:
    """The samples of metric ``name`` by their labels' text ("" for none)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics", headers=headers) as response:
        for line in (await response.text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                key, value = line.rsplit(" ", 1)
                out[key[len(name):].strip("{}")] = float(value)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.unread_flood",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--mode", choices=["channel", "http"], default="channel")
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--hold-s", type=float, default=90.0, help="after the flood, wait this long at most "
                        "(still not reading) for the node to end the channel")
    parser.add_argument("--url", help="flood this node (the leader) instead of a fresh cluster's")
    parser.add_argument("--pid", type=int, help="with --url: the node's pid")
    parser.add_argument("--token", default=os.environ.get("RCQ_TOKEN"), help="with --url (default $RCQ_TOKEN)")
    args = parser.parse_args(argv)
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid")
        asyncio.run(flood(args, args.url.rstrip("/"), args.pid, args.token))
        return
    with LocalCluster(3, log_level="WARNING") as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(60)
        asyncio.run(flood(args, cluster.url(leader), cluster.pids()[leader], cluster.token))


if __name__ == "__main__":
    main()
