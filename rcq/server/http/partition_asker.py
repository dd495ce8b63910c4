"""How a node's process asks the processes of partitions (docs/partitions.md): one HTTP session,
made at the first ask and closed with the app, and one way to send a request and read its answer.

Every ask is bounded in time and never raises for a process that cannot be reached or answers
something unreadable: the caller gets None and says which partition did not answer.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any, Literal

import aiohttp
from aiohttp import web

from rcq.server.security import cluster_calls

LEADER_ASK_TIMEOUT_S = 2.0  # one member asked who leads, or one process's metrics
FORWARD_TIMEOUT_S = 30.0  # a partition's leader found and its answer back, for a PUT placed there
READY_ASK_TIMEOUT_S = 0.8  # one partition process's /readyz: within a probe's usual 1 s timeout

_UNREACHABLE = (aiohttp.ClientError, TimeoutError, ValueError, ssl.SSLError)


class LeaderAsker:
    """Asks partitions' processes: who leads, their listings, metrics and readiness, and sends
    them the PUT and DELETE that p0's leader forwards."""

    def __init__(self, peer_tls: ssl.SSLContext | None) -> None:
        self._peer_tls = peer_tls
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._peer_tls if self._peer_tls is not None else True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def call(self, method: str, url: str, headers: dict[str, str], body: dict[str, Any] | None = None,
                   timeout_s: float = FORWARD_TIMEOUT_S) -> tuple[int, dict[str, Any]] | None:
        """Send a request: (status, its JSON object, {} for another JSON value), None when it could
        not be asked or did not answer JSON in time."""
        answered = await self._request(method, url, headers, body, timeout_s, "json")
        if answered is None:
            return None
        status, answer = answered
        return status, answer if isinstance(answer, dict) else {}

    async def cluster_call(self, method: str, base_url: str, path: str, body: dict[str, Any] | None,
                           secret: str | None, timeout_s: float) -> tuple[int, dict[str, Any]] | None:
        """A call of p0's leader to a partition process, signed with the cluster secret
        (rcq.server.security.cluster_calls) instead of a caller's token; as :meth:`call`."""
        data = b"" if body is None else json.dumps(body).encode()
        headers = {cluster_calls.HEADER: cluster_calls.sign(secret, method, path, data, time.time()),
                   **({"Content-Type": "application/json"} if body is not None else {})}
        answered = await self._request(method, f"{base_url}{path}", headers, None, timeout_s, "json", data=data)
        if answered is None:
            return None
        status, answer = answered
        return status, answer if isinstance(answer, dict) else {}

    async def _request(self, method: str, url: str, headers: dict[str, str], body: dict[str, Any] | None,
                       timeout_s: float, read: Literal["json", "text"], data: bytes | None = None
                       ) -> tuple[int, Any] | None:
        try:
            async with self._http().request(method, url, json=body, data=data, headers=headers,
                                            allow_redirects=False,
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                return response.status, await (response.json() if read == "json" else response.text())
        except _UNREACHABLE:
            return None

    async def get(self, url: str, headers: dict[str, str], timeout_s: float = FORWARD_TIMEOUT_S
                  ) -> dict[str, Any] | None:
        """GET ``url``: its answer when it is a 200 with a JSON object, else None."""
        answered = await self._request("GET", url, headers, None, timeout_s, "json")
        if answered is None or answered[0] != 200 or not isinstance(answered[1], dict):
            return None
        return answered[1]

    async def text(self, url: str, headers: dict[str, str]) -> str | None:
        """GET ``url``: its body when it answers 200, else None."""
        answered = await self._request("GET", url, headers, None, LEADER_ASK_TIMEOUT_S, "text")
        return answered[1] if answered is not None and answered[0] == 200 else None

    async def leader(self, urls: list[str]) -> tuple[str | None, str | None]:
        """(leader_id, leader_url) that the first of ``urls`` to name a leader names; (None, None).
        Asked at ``/readyz``, which needs no token (200 or 503, both naming the leader they know):
        a token the caller just added may not have reached every process yet (each re-reads the
        tokens file on its own), and who leads is not the caller's to be refused."""
        answers = await asyncio.gather(*(self.call("GET", f"{url}/readyz", {}, None, LEADER_ASK_TIMEOUT_S)
                                         for url in urls))
        for answered in answers:
            if answered is not None and answered[1].get("leader_id"):
                return answered[1]["leader_id"], answered[1].get("leader_url")
        return None, None

    async def close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()


LEADER_ASKER = web.AppKey("partition_leader_asker", LeaderAsker)
