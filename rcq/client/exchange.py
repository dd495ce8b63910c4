"""One HTTP exchange with one node, and nothing more: no retry, no leader, no policy.

The transport (:mod:`rcq.client.transport`) decides where a request goes and whether it is sent
again; this module sends it once and is the one place that translates what aiohttp raises into
rcq errors, telling a failure before the request left (it cannot have executed) from one after
(it may have).

Must not import: the other client modules (the transport builds on this, not the reverse),
rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import io
import json
import os
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp
import yarl

from rcq.errors import CertificateError, InvalidRequest, RcqError, Unavailable
from rcq.immutable import immutable

CONNECTIONS_MAX = 256
RETRY_AFTER_MIN_S = 0.1  # a server's Retry-After is bounded: 0 would spin, a large one would stall a failover
RETRY_AFTER_MAX_S = 5.0
STREAMED_BODY_MIN_BYTES = 1 << 20
# What a newcomer needs most after a failed verification (a cluster of its own CA, as rcq.local makes).
CA_FILE_HINT = ("pass the CA that signed it: --ca-file FILE or RCQ_CA_FILE with the rcq command, "
                "ca_file=FILE with RcqClient or SyncClient")


@immutable  # built for every answer: no frozen __init__ (see rcq.immutable)
class Answer:
    status: int
    payload: Any  # the JSON body; None when there is none or it is not JSON
    retry_after_s: float | None
    location: str | None


class ExchangeFailed(Exception):
    """No answer. ``maybe_sent``: the request may have reached the node (and executed)."""

    def __init__(self, error: RcqError, maybe_sent: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.maybe_sent = maybe_sent


def new_session(tls: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """``tls``: how to verify HTTPS nodes (None: the system's CAs; http:// URLs ignore it)."""
    connector = aiohttp.TCPConnector(limit=CONNECTIONS_MAX, limit_per_host=0, keepalive_timeout=30,
                                     ssl=tls if tls is not None else True)
    return aiohttp.ClientSession(connector=connector)


def certificate_error(node_url: str, exc: aiohttp.ClientConnectorCertificateError) -> CertificateError:
    """The node's certificate failed verification (retrying cannot help): why, and how to give the CA."""
    return CertificateError(f"cannot verify the TLS certificate of {node_url}: {exc.certificate_error}; {CA_FILE_HINT}")


def tls_context(ca_file: str | os.PathLike[str] | None = None,
                client_cert: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None
                ) -> ssl.SSLContext | None:
    """A context that verifies servers (against ``ca_file``, else the system's CAs) and presents
    ``client_cert`` = (certificate file, key file) to servers that ask for one; None if neither is given."""
    if ca_file is None and client_cert is None:
        return None
    context = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file is not None else None)
    if client_cert is not None:
        context.load_cert_chain(os.fspath(client_cert[0]), os.fspath(client_cert[1]))
    return context


async def exchange(session: aiohttp.ClientSession, node_url: str, method: str, path: str, data: bytes | None,
                   params: Mapping[str, str] | None, timeout_s: float,
                   authorization: str | None = None) -> Answer:
    """``method path`` on the node at ``node_url``, once; no answer raises :class:`ExchangeFailed`.
    ``authorization``: the ``Authorization`` header (the token), sent with every request."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    # A follower would forward the request to the leader; the transport follows the 307 itself
    # instead, so that it knows which node ran an attempt and judges a retry by that.
    headers = {"Rcq-Redirect": "1"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if authorization is not None:
        headers["Authorization"] = authorization
    # aiohttp warns (ResourceWarning) about raw bodies over 1 MiB; a stream of one buffer is the same
    body: bytes | io.BytesIO | None = (
        io.BytesIO(data) if data is not None and len(data) >= STREAMED_BODY_MIN_BYTES else data)
    try:
        url = yarl.URL(node_url + path, encoded=True)  # paths are built pre-encoded (see rcq.client.wire)
        async with session.request(method, url, data=body, params=params, headers=headers,
                                   allow_redirects=False, timeout=timeout) as response:
            raw = await response.read()
            status, headers_in = response.status, response.headers
    except aiohttp.ClientConnectorCertificateError as exc:
        raise certificate_error(node_url, exc) from exc
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise ExchangeFailed(Unavailable(f"cannot connect to {node_url}: {exc}"), maybe_sent=False) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ExchangeFailed(Unavailable(f"no answer from {node_url} to {method} {path}: {exc!r}"),
                             maybe_sent=True) from exc
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:  # e.g. a proxy's HTML error page: judged by its status alone
        payload = None
    return Answer(status, payload, _retry_after_s(headers_in.get("Retry-After")), headers_in.get("Location"))


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InvalidRequest(f"bad URL {url!r}: expected http://host:port")
    return url


def _retry_after_s(value: str | None) -> float | None:
    try:
        return min(max(float(value), RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S) if value is not None else None
    except ValueError:  # an HTTP date: not worth parsing, the backoff ceiling stays
        return None
