"""The intruder: one more chaos process with a token of its own, trying what it must not.

The intruder (:class:`Intruder`, :func:`run_intruder`) is one more process, with a token of its
own that may produce and consume ``guest*`` only (a queue nobody else uses). It keeps trying what
it must not do — enqueue into, dequeue from, purge / configure / delete a workload queue, and
hijack a worker's transaction (commit, abort, extend, dequeue or enqueue in it), flood a
session channel with requests and never read the answers (``intrude-unread``: the leader must
stop reading the channel, not keep every answer) — and does some legitimate work on ``guest``,
so the run shows its token works at all. Workers register the ids of
their open transactions in a :class:`chaos.executor.OpenTransactions` while each op runs; a hijack targets one
of those. Its values are ``"intruder-<seq>"``, which no worker produces: one that got into a
workload queue is *unexpected* to the total-queue checker. Its ops are ``ok`` when the intrusion
itself was answered with success (it was allowed), ``fail`` when the cluster answered with an
error (chaos.checkers.security judges the code), ``info`` when no answer came.

Must not import: any rcq module but rcq.client and rcq.errors (black box).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import random
import socket
import struct
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from chaos.executor import OP_TIMEOUT_S, TRANSACTION_TIMEOUT_S, OpenTransactions, error_name, make_client, text_of
from chaos.generator import Spec
from rcq.client import RcqClient, Transaction
from rcq.errors import CommitOutcomeUnknown, NotLeader, RcqError, RequestTimeout, Unavailable

# The intruder: a principal that may produce and consume the guest queue only.
INTRUDER_PRINCIPAL = "intruder"
GUEST_QUEUE = "guest"
INTRUDER_GRANTS: tuple[dict[str, Any], ...] = ({"queues": "guest*", "actions": ["produce", "consume"]},)
INTRUDER_PAUSE_S = 0.25  # between attempts: refusals are quick, and the workload is what is under test
# f -> weight; hijacks need an open transaction of a worker, so they get the most draws
DEFAULT_INTRUDER_MIX: dict[str, int] = {
    "intrude-enqueue": 15, "intrude-dequeue": 15, "intrude-manage": 10, "intrude-hijack": 45,
    "guest-enqueue": 8, "guest-dequeue": 7, "intrude-unread": 1,
}
HIJACK_VERBS = ("commit", "abort", "extend", "dequeue", "enqueue")
MANAGE_VERBS = ("purge", "configure", "delete")
# One request (REST, a one-request transaction) or inside a transaction of the intruder's own.
INTRUSION_VIAS = ("request", "transaction")
# No answer to the intrusion: no node answered, none could serve it now, or it may still be running.
NO_ANSWER = (Unavailable, NotLeader, CommitOutcomeUnknown, RequestTimeout)
# intrude-unread: status frames (any token may send them) written for up to UNREAD_FLOOD_S over a
# socket with a small receive buffer and no answer read. Refused when the leader stops taking them
# for UNREAD_STALL_S (it stopped reading: session_unsent_bytes_max); allowed when it keeps taking
# them for the whole flood (a node without the bound read ~40,000 frames a second for ever).
UNREAD_FLOOD_S = 10.0
# Taking this many frames without stalling proves the node kept reading (allowed): more than every
# socket buffer on the way holds (the node's receive buffer and this side's send buffer, a few MB
# each at most with Linux's autotuning: ~125,000 frames of ~80 bytes), and reached in a few
# seconds by a node without the bound. A flood that runs out of time below it and never stalled
# (a loaded machine writing slowly) proves nothing either way: no answer (``info``), not allowed.
UNREAD_CONCLUSIVE_FRAMES = 250_000
UNREAD_STALL_S = 1.0
UNREAD_FRAMES_MAX = 1_000_000
UNREAD_RECEIVE_BUFFER_BYTES = 4096
UNREAD_BATCH = 500
UPGRADE_TIMEOUT_S = 5.0
SESSION_PATH = "/v1/session"
SESSION_SUBPROTOCOL = "rcq.session.v1"


class NotRead(RcqError):
    """The node stopped reading a session channel whose client left its answers unread."""

    code = "not_read"


class IntruderGenerator:
    """The intruder's attempts, a pure function of (seed, process) like :class:`Generator`'s ops;
    which open transaction a hijack targets depends on the run (:meth:`target` draws it from those
    open at that moment, with the same seeded generator)."""

    def __init__(self, seed: int, process: int | str, queues: list[str], mix: dict[str, int] | None = None,
                 values_max: int = 2) -> None:
        self._random = random.Random(f"{seed}/intruder")
        self.process = process
        self.queues = queues
        mix = mix or DEFAULT_INTRUDER_MIX
        self._fs, self._weights = list(mix), list(mix.values())
        self._values_max = values_max
        self._seq = 0

    def _values(self) -> list[str]:
        values = []
        for _ in range(self._random.randint(1, self._values_max)):
            self._seq += 1
            values.append(f"intruder-{self._seq}")
        return values

    def next(self) -> Spec:
        rng = self._random
        f = rng.choices(self._fs, self._weights)[0]
        queue = rng.choice(self.queues)
        if f == "intrude-enqueue":
            return Spec(f, {"queue": queue, "via": rng.choice(INTRUSION_VIAS), "values": self._values()})
        if f == "intrude-dequeue":
            return Spec(f, {"queue": queue, "via": rng.choice(INTRUSION_VIAS), "max": rng.randint(1, 3)})
        if f == "intrude-manage":
            return Spec(f, {"queue": queue, "verb": rng.choice(MANAGE_VERBS)})
        if f == "intrude-hijack":
            # In the guest queue, which the intruder may use: only ownership can refuse it.
            verb = rng.choice(HIJACK_VERBS)
            value: dict[str, Any] = {"verb": verb}
            if verb == "enqueue":
                value.update(queue=GUEST_QUEUE, values=self._values())
            elif verb == "dequeue":
                value.update(queue=GUEST_QUEUE, max=rng.randint(1, 3))
            return Spec(f, value)
        if f == "guest-enqueue":
            return Spec(f, {"queue": GUEST_QUEUE, "values": self._values()})
        if f == "guest-dequeue":
            return Spec(f, {"queue": GUEST_QUEUE, "max": rng.randint(1, 3)})
        if f == "intrude-unread":
            return Spec(f, {"frames_max": UNREAD_FRAMES_MAX, "flood_s": UNREAD_FLOOD_S})
        raise ValueError(f"unknown intruder op {f!r}")

    def target(self, open_now: list[tuple[str, int | str, str]]) -> tuple[str, int | str, str] | None:
        """One of the (transaction id, process, f) open now; None when there is none."""
        return self._random.choice(open_now) if open_now else None


async def abort_as_answered(tx: Transaction) -> int:
    """Abort ``tx`` and raise whatever the server answers. ``Transaction.abort`` takes "already
    aborted" for success, which is right for an owner tidying up but would hide, here, whether
    the server let someone else abort the transaction or only told them it was closed."""
    answer = await tx._transport.request(tx._request("abort", None))
    return int(answer.get("returned", 0))


class Intruder:
    """Runs one intruder Spec with the intruder's client and decides ok / fail / info:

    * ``ok``: the intrusion (or the guest op) was answered with success — for an intrusion, it
      was allowed;
    * ``fail``: the cluster answered it with an error, recorded as its code;
    * ``info``: no answer: a transport error, no leader, a timeout, an outcome unknown.

    ``step`` in the completion's value names the request that raised: ``begin`` means the
    intruder's own transaction could not begin, so the intrusion was never sent. When an
    intrusion inside the intruder's own transaction is allowed, the transaction is committed, so
    whatever it did shows in the queues too (and to the queue checkers)."""

    def __init__(self, client: RcqClient, urls: list[str] | None = None, token: str | None = None) -> None:
        self.client = client
        self.urls = urls or []
        self.token = token

    async def run(self, spec: Spec) -> tuple[str, Any, str | None]:
        state: dict[str, Any] = {"step": None, "allowed": False}
        try:
            result = await asyncio.wait_for(self._dispatch(spec, state), OP_TIMEOUT_S)
        except Exception as exc:  # an exception is data here
            value = {**spec.value, "step": state["step"], **state.get("result", {})}
            if state["allowed"]:  # the intrusion got through; what came after failed
                return "ok", value, error_name(exc)
            answered = isinstance(exc, RcqError) and not isinstance(exc, NO_ANSWER)
            return ("fail" if answered else "info"), value, error_name(exc)
        return "ok", {**spec.value, "step": state["step"], **result}, None

    async def _dispatch(self, spec: Spec, state: dict[str, Any]) -> dict[str, Any]:
        handler: Callable[..., Any] = getattr(self, "_" + spec.f.replace("-", "_"))
        return await handler(spec.value, state)

    async def _own_transaction(self, state: dict[str, Any], step: str,
                               intrusion: Callable[[Transaction], Any]) -> dict[str, Any]:
        """Begin a transaction of the intruder's own, try ``intrusion`` in it; refused, abort it;
        allowed, commit it (a commit error is recorded, the op stays ok)."""
        state["step"] = "begin"
        tx = await self.client.begin(TRANSACTION_TIMEOUT_S, "intruder")
        state["step"] = step
        try:
            result: dict[str, Any] = await intrusion(tx)
        except BaseException:
            with contextlib.suppress(BaseException):
                await asyncio.shield(tx.abort_quietly())
            raise
        state["allowed"], state["result"] = True, result
        state["step"] = "commit"
        await tx.commit()
        return result

    async def _intrude_enqueue(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        queue, values = value["queue"], value["values"]
        if value["via"] == "request":
            state["step"] = "enqueue"
            await self.client.enqueue(queue, *values)
            return {}

        async def intrusion(tx: Transaction) -> dict[str, Any]:
            await tx.enqueue_batch(queue, values)
            return {}

        return await self._own_transaction(state, "enqueue", intrusion)

    async def _intrude_dequeue(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        queue = value["queue"]
        if value["via"] == "request":
            state["step"] = "dequeue"
            return {"values": [text_of(v) for v in await self.client.dequeue(queue, value["max"])]}

        async def intrusion(tx: Transaction) -> dict[str, Any]:
            return {"values": [text_of(i) for i in await tx.dequeue_items(queue, value["max"])]}

        return await self._own_transaction(state, "dequeue", intrusion)

    async def _intrude_manage(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        queue, verb = value["queue"], value["verb"]
        state["step"] = verb
        if verb == "purge":
            return {"removed": await self.client.purge_queue(queue)}
        if verb == "delete":
            return {"removed": await self.client.delete_queue(queue)}
        # Allowed, a limit of one item would show in every count and enqueue after it.
        await self.client.configure_queue(queue, max_items=1)
        return {}

    async def _intrude_hijack(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        tx = self.client.attach(value["transaction_id"], "intruder")
        verb = state["step"] = value["verb"]
        if verb == "commit":
            info = await tx.commit()
            return {"duplicate": info.duplicate}
        if verb == "abort":
            return {"returned": await abort_as_answered(tx)}
        if verb == "extend":
            await tx.extend(TRANSACTION_TIMEOUT_S)
            return {}
        if verb == "dequeue":
            return {"values": [text_of(i) for i in await tx.dequeue_items(value["queue"], value["max"])]}
        await tx.enqueue_batch(value["queue"], value["values"])
        return {}

    async def _intrude_unread(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        state["step"] = "upgrade"
        _reader, writer = await unread_channel(self.urls, self.token)
        try:
            state["step"] = "flood"
            taken, stalled = await write_unread(writer, value["frames_max"], value["flood_s"])
        finally:
            writer.transport.abort()
        if stalled:
            raise NotRead(f"the node stopped taking frames after {taken}", details={"taken": taken})
        if taken < min(value["frames_max"], UNREAD_CONCLUSIVE_FRAMES):
            raise RequestTimeout(f"the flood ran out of time after {taken} frames, the node still taking them: "
                                 "too few to tell whether it reads them")
        state["allowed"], state["result"] = True, {"taken": taken}
        return {"taken": taken}

    async def _guest_enqueue(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        state["step"] = "enqueue"
        await self.client.enqueue(value["queue"], *value["values"])
        return {}

    async def _guest_dequeue(self, value: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        state["step"] = "begin"
        tx = await self.client.begin(TRANSACTION_TIMEOUT_S, "intruder")
        try:
            state["step"] = "dequeue"
            items = await tx.dequeue_items(value["queue"], value["max"])
            state["step"] = "commit"
            await tx.commit()
        except BaseException:
            if state["step"] != "commit":
                with contextlib.suppress(BaseException):
                    await asyncio.shield(tx.abort_quietly())
            raise
        return {"values": [text_of(i) for i in items]}


async def run_intruder(history: Any, urls: list[str], generator: IntruderGenerator, registry: OpenTransactions,
                       stop: asyncio.Event, *, token: str | None, pause_s: float = INTRUDER_PAUSE_S,
                       node_urls: list[str] | None = None) -> int:
    """Make the intruder's attempts, ``pause_s`` apart, until ``stop`` is set; returns how many.
    A hijack drawn while no worker has a transaction open is skipped (nothing to target).
    ``node_urls``: each node's own URL, for the unread flood (default ``urls``)."""
    done = 0
    async with make_client(urls, token) as client:
        intruder = Intruder(client, node_urls or urls, token)
        while not stop.is_set():
            spec: Spec | None = generator.next()
            if spec is not None and spec.f == "intrude-hijack":
                target = generator.target(registry.snapshot())
                spec = None if target is None else dataclasses.replace(spec, value={
                    **spec.value, "transaction_id": target[0], "victim": target[1], "victim_f": target[2]})
            if spec is not None:
                op = history.invoke(generator.process, spec.f, spec.value)
                history.complete(op, *await intruder.run(spec))
                done += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause_s)
    return done


# ------------------------------------------------------------------ intrude-unread: a raw channel
def _masked_text(payload: bytes) -> bytes:
    mask, length = os.urandom(4), len(payload)
    head = bytes([0x81, 0x80 | length]) if length < 126 else bytes([0x81, 0x80 | 126]) + struct.pack(">H", length)
    key = (mask * (length // 4 + 1))[:length]
    return head + mask + (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(length, "big")


async def _upgrade(url: str, token: str | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A session channel to the node at ``url`` (a raw socket with a small receive buffer), or None
    when it does not upgrade (a follower, a node down)."""
    split = urlsplit(url)
    if split.scheme != "http" or split.hostname is None:
        return None  # TLS: not tried (the channel is the same; the harness's clusters are plain HTTP)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNREAD_RECEIVE_BUFFER_BYTES)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (split.hostname, split.port or 80)),
                               UPGRADE_TIMEOUT_S)
        reader, writer = await asyncio.open_connection(sock=sock)
    except (OSError, TimeoutError):
        sock.close()
        return None
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET {SESSION_PATH} HTTP/1.1\r\nHost: {split.netloc}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Sec-WebSocket-Protocol: {SESSION_SUBPROTOCOL}\r\n{auth}\r\n").encode())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), UPGRADE_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        head = b""
    if head.startswith(b"HTTP/1.1 101"):
        return reader, writer
    writer.transport.abort()
    return None


async def unread_channel(urls: list[str], token: str | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A session channel to the leader: the first of ``urls`` (each node's own) that upgrades.
    A follower's answer names the leader by its advertised URL, which may lead through a proxy:
    not followed, the leader is among ``urls``."""
    for url in urls:
        opened = await _upgrade(url, token)
        if isinstance(opened, tuple):
            return opened
    raise Unavailable("no node opened a session channel")


async def write_unread(writer: asyncio.StreamWriter, frames_max: int, flood_s: float) -> tuple[int, bool]:
    """Status frames written for up to ``flood_s``, no answer read; (frames the kernel took,
    whether the node stopped taking them for UNREAD_STALL_S)."""
    deadline, taken = time.monotonic() + flood_s, 0
    while taken < frames_max and time.monotonic() < deadline:
        writer.write(b"".join(_masked_text(json.dumps({"id": taken + i + 1, "op": "status",
                                                       "transaction_id": "f" * 26}).encode())
                              for i in range(UNREAD_BATCH)))
        try:
            await asyncio.wait_for(writer.drain(), UNREAD_STALL_S)
        except TimeoutError:
            return taken, True
        except ConnectionError:  # the node ended the channel: it did not keep reading
            return taken, True
        taken += UNREAD_BATCH
    return taken, False
