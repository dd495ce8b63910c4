"""What the transport alone costs: a bare aiohttp server and client exchanging frames, no queue.

``python -m bench.transport_floor [--concurrency C] [--duration-s D] [--http]`` starts a bare
aiohttp server in a child process whose only work per request is what any rcq verb needs at the
least: parse the JSON request (orjson), build a small answer and write it. This process runs C
clients, each with its own connection, sending one request and waiting for its answer in a loop,
as independent single-item callers do. Over the measured window it prints exchanges per second
and the CPU (utime + stime from ``/proc``) each side spent per exchange: over a persistent
WebSocket (one text frame each way, rcq's session channel), or with ``--http`` one ``POST`` per
exchange on keep-alive connections. It is the floor under a node's and a client's CPU per
transaction: rcq's figures (``python -m bench --cpu``) are this plus the queue, Raft and the apply.

Must not import: pysyncobj, lmdb, rcq.server (a bare server is measured, not a node).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp
import orjson
from aiohttp import web

from bench.cpu import cpu_seconds
from rcq.local.nodes import free_ports
from rcq.local.waits import wait_until

REQUEST = {"op": "execute", "operations": [{"op": "enqueue", "queue": "bench", "items": ["x" * 100]}],
           "idempotency_key": "rcq-retry:" + "0" * 32}


def _answer(request: dict) -> dict:
    return {"status": 200, "body": {"transaction_id": "1.0123456789abcdef01234567", "committed": True,
                                    "duplicate": False, "index": 1, "enqueued": len(request["operations"]),
                                    "dequeued": 0}}


async def _serve_ws(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(compress=False)
    await ws.prepare(request)
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            break
        frame = orjson.loads(message.data)
        await ws.send_frame(orjson.dumps({"id": frame["id"], **_answer(frame)}), aiohttp.WSMsgType.TEXT)
    return ws


async def _serve_http(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(_answer(orjson.loads(await request.read()))),
                        content_type="application/json")


def serve(port: int) -> None:
    app = web.Application()
    app.router.add_get("/ws", _serve_ws)
    app.router.add_post("/http", _serve_http)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


async def _ws_caller(session: aiohttp.ClientSession, url: str, until: list[float], counts: list[int]) -> None:
    async with session.ws_connect(f"{url}/ws", compress=0, autoping=True) as ws:
        frame_id = 0
        while time.monotonic() < until[0]:
            frame_id += 1
            await ws.send_frame(orjson.dumps({"id": frame_id, **REQUEST}), aiohttp.WSMsgType.TEXT)
            answer = await ws.receive()
            orjson.loads(answer.data)
            counts[0] += 1


async def _http_caller(session: aiohttp.ClientSession, url: str, until: list[float], counts: list[int]) -> None:
    body = orjson.dumps(REQUEST)
    while time.monotonic() < until[0]:
        async with session.post(f"{url}/http", data=body, headers={"Content-Type": "application/json"}) as answer:
            orjson.loads(await answer.read())
        counts[0] += 1


async def measure(url: str, server_pid: int, concurrency: int, duration_s: float, http: bool) -> dict[str, float]:
    counts = [0]
    warm_up_s = 1.0
    until = [time.monotonic() + warm_up_s + duration_s]
    caller = _http_caller if http else _ws_caller
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        callers = [asyncio.ensure_future(caller(session, url, until, counts)) for _ in range(concurrency)]
        await asyncio.sleep(warm_up_s)
        done_before, server_before, client_before = counts[0], cpu_seconds(server_pid), cpu_seconds(os.getpid())
        started = time.monotonic()
        await asyncio.sleep(duration_s)
        exchanges = counts[0] - done_before
        elapsed = time.monotonic() - started
        server_s, client_s = cpu_seconds(server_pid) - server_before, cpu_seconds(os.getpid()) - client_before
        await asyncio.gather(*callers)
    return {"exchanges_per_s": exchanges / elapsed, "server_us": server_s / exchanges * 1e6,
            "client_us": client_s / exchanges * 1e6}


def _accepts(port: int) -> bool | None:
    """True once the child accepts connections (None until then: the wait asks again)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return None
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--http", action="store_true", help="one HTTP POST per exchange (default: a WebSocket)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child: serve on this port
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    port = free_ports(1)[0]
    server = subprocess.Popen([sys.executable, "-m", "bench.transport_floor", "--serve", str(port)])
    try:
        wait_until(lambda: _accepts(port), 10.0, what="the bare server listening")
        figures = asyncio.run(measure(f"http://127.0.0.1:{port}", server.pid, args.concurrency, args.duration_s,
                                      args.http))
    finally:
        server.terminate()
        server.wait(timeout=10)
    transport = "HTTP POST" if args.http else "WebSocket"
    print(f"{transport}, {args.concurrency} callers: {figures['exchanges_per_s']:,.0f} exchanges/s; CPU per exchange: "
          f"server {figures['server_us']:.0f} µs, client {figures['client_us']:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
