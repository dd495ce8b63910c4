"""No input from the network, authenticated or not, makes a node log an ERROR line or a traceback.

Operators alert on ERROR: a stranger must not be able to page them. Raw bytes are written to the
HTTP ports of a live 3-node cluster (its leader and a follower): garbage at a connection's start,
garbage after a complete request (keep-alive), broken heads, bodies and chunked encodings, and
WebSocket frames of every kind (bad opcodes, reserved bits, unmasked, lengths that lie, invalid
UTF-8) after an upgrade the node accepted (with a token) or refused (401 without one, 307 on a
follower). Each connection gets whatever the node answers, or is dropped after a moment. Then the
node logs must hold no error entry (this test reads them itself, beside the suite's check), and
every node still answers.

The cases are drawn from a seeded generator, not hypothesis: the log is read once at the end (a
failure prints every case), and cases run many at a time.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import struct

import aiohttp
import pytest

from rcq.local.cluster import LocalCluster
from tests.helpers import QUIET_CLUSTER_WAIT_S, RAW_CASE_LISTEN_S
from tests.helpers.node_logs import error_entries

pytestmark = pytest.mark.cluster

SEED = 20261128
CASES = 400
CONCURRENCY = 25
READ_BYTES_MAX = 1 << 16


def upgrade_head(token: str | None) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"GET /v1/session HTTP/1.1\r\nHost: rcq\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: rcq.session.v1\r\n"
            f"{auth}\r\n").encode()


def ws_frame(rng: random.Random) -> bytes:
    """One WebSocket frame as a client might send it, or break it."""
    fin_rsv = rng.choice([0x80, 0x00, 0xC0, 0xF0])
    opcode = rng.choice([0x1, 0x2, 0x0, 0x8, 0x9, 0xA, 0x3, 0xF])
    payload = rng.choice([b'{"id": 1, "op": "begin"}', b"\xff\xfe\xc3(", b"\xed\xa0\x80", b"",
                          rng.randbytes(rng.randint(0, 200)), b'{"id": 7, "op": "status", "transaction_id": "x"}'])
    if opcode == 0x8 and payload:
        payload = struct.pack(">H", rng.choice([1000, 1005, 999, 5000, 1002])) + payload[:100]
    masked = rng.random() < 0.85
    length = len(payload)
    declared = rng.choice([length, length, length, length + 5, max(0, length - 3), 126, 127])
    if declared < 126:
        head = bytes([fin_rsv | opcode, (0x80 if masked else 0) | declared])
    elif declared == 126:
        head = bytes([fin_rsv | opcode, (0x80 if masked else 0) | 126]) + struct.pack(">H", length)
    else:
        head = bytes([fin_rsv | opcode, (0x80 if masked else 0) | 127]) + struct.pack(">Q", rng.choice([length, 1 << 62]))
    if not masked:
        return head + payload
    mask = rng.randbytes(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def http_garbage(rng: random.Random, token: str | None) -> bytes:
    """A request broken somewhere, or bytes that are no request at all."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    body = b'{"requests": [{"op": "begin"}]}'
    choices = [
        rng.randbytes(rng.randint(1, 300)),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(40),  # a TLS ClientHello on a plain port
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: \x01\r\n\r\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
        b"POST /v1/batch HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b"Content-Length: 5\r\nContent-Length: 7\r\n\r\nabcde",
        b"POST /v1/batch HTTP/1.1\r\nHost: x\r\n" + auth.encode()
        + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n",
        b"POST /v1/batch HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b"Content-Length: -1\r\n\r\n",
        b"GET /v1/cluster HTTP/9.9\r\n\r\n",
        b"GET \x00\xff HTTP/1.1\r\n\r\n",
        b"GET /v1/transactions/%ED%A0%80 HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b"\r\n",
        b"GET /v1/transactions?label_prefix=%ED%A0%80 HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b"\r\n",
        b"POST /v1/batch HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b"Content-Type: application/json\r\n"
        + b"Content-Encoding: gzip\r\nContent-Length: 10\r\n\r\n" + rng.randbytes(10),
        b"POST /v1/batch HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b"Content-Length: 12\r\n\r\n" + b"\xff" * 12,
        b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",
    ]
    return rng.choice(choices)


def case(rng: random.Random, token: str) -> bytes:
    kind = rng.choice(["start", "keep-alive", "accepted upgrade", "refused upgrade", "headers only"])
    use_token = token if rng.random() < 0.5 else None
    if kind == "start":
        return http_garbage(rng, use_token)
    if kind == "keep-alive":
        return b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + http_garbage(rng, use_token)
    if kind == "headers only":
        return upgrade_head(use_token)[: rng.randint(1, 120)]
    frames = b"".join(ws_frame(rng) for _ in range(rng.randint(1, 4)))
    return upgrade_head(token if kind == "accepted upgrade" else None) + frames


async def send_case(port: int, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(RAW_CASE_LISTEN_S):
            while await reader.read(READ_BYTES_MAX):
                pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.transport.abort()


async def fuzz(ports: list[int], token: str) -> list[bytes]:
    rng = random.Random(SEED)
    cases = [case(rng, token) for _ in range(CASES)]
    limiter = asyncio.Semaphore(CONCURRENCY)

    async def one(number: int, data: bytes) -> None:
        async with limiter:
            await send_case(ports[number % len(ports)], data)

    await asyncio.gather(*(one(n, data) for n, data in enumerate(cases)))
    return cases


async def test_no_bytes_from_the_network_make_a_node_log_an_error_or_a_traceback(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S)
    follower = next(i for i in range(3) if i != leader)
    ports = [int(cluster.url(i).rsplit(":", 1)[1]) for i in (leader, follower)]
    assert cluster.token is not None
    cases = await fuzz(ports, cluster.token)
    async with aiohttp.ClientSession() as http:
        for i in range(3):
            async with http.get(cluster.url(i) + "/healthz") as response:
                assert response.status == 200, i
    assert cluster.unexpected_exits() == {}
    errors = [entry for path in cluster.log_paths() for entry in error_entries(path.read_text())]
    assert not errors, "\n\n".join(errors[:5]) + f"\n\n{len(cases)} cases, e.g. {cases[:3]!r}"
