"""A follower relays leader-only requests to the leader, so that any node answers any request.

Until a request needs the leader, a follower serves it itself (reads of its replicated state,
the status page, probes). A request that needs the leader raises ``NotLeader`` in its handler;
:meth:`Forwarder.answer` then sends it, once, to the leader's HTTP URL (HTTPS with the node's peer
TLS context when the cluster uses TLS) with the caller's ``Authorization`` as is: the leader
authenticates the caller and applies its own limits. The follower answers with the leader's
status, the headers that matter and its body (read whole first: an answer cut halfway is then
still answered as a lost answer, below, not as half a 200).

Where the leader is reached. The leader's URL in a ``NotLeader`` is the one it advertises to
clients, and stays what clients see (``error.leader_url``, ``Rcq-Forwarded-To``, a 307's
``Location``). Where that URL does not work between nodes (containers whose published ports are the
host's, NAT, a load balancer), the node's ``peer_urls`` (node-local configuration, never replicated)
names the URL it sends to instead: the leader is looked up by its advertised URL in the directory
of known nodes, and its ``peer_urls`` entry, if any, is dialled.

What is not forwarded, answered 307 with ``Location`` as before forwarding existed:

* a request that asks for the redirect (``Rcq-Redirect: 1``; the Python client does, since it
  follows redirects itself and judges retries by where a request went);
* a request that was already forwarded (it carries ``Rcq-Forwarded-By``): a node that is not the
  leader any more does not pass it further on, so a request never loops;
* the session channel's upgrade (``GET /v1/session``), answered by its own route.

How a forward can fail, answered as the same situation is without forwarding:

* never sent (no connection to the leader): ``503 no_leader``, what a follower answers when it
  knows no leader; nothing was run;
* sent, no answer (the leader died, the connection was cut, the timeout passed): a read (GET,
  HEAD) is ``503 unavailable``; any other request is ``504 commit_outcome_unknown`` with
  ``maybe_committed``, as the leader answers a commit whose outcome it cannot know: a forwarded
  request may be a commit, and whether it ran is not known;
* the leader answered ``not_leader`` (it lost leadership meanwhile, without running it):
  ``503 no_leader`` naming the new leader, Retry-After 1;
* more than :data:`IN_FLIGHT_MAX` forwards in flight on this node: ``503 unavailable``, Retry-After 1.

The true client. The leader counts per-client limits against the token's principal, or, on a
node without tokens, against the peer address; for a forwarded request that would be the
follower's. The follower therefore sends the caller's address (``Rcq-Forwarded-For``) with a
proof that a member sent it: an HMAC-SHA256 over the method, raw path, time, address and the
follower's id, keyed with a key derived (HMAC, a fixed label) from the cluster secret. The leader
takes the address (:meth:`Forwarder.trusted`) only if the proof verifies under its cluster secret
or one of ``cluster_secrets_previous`` (a rotation in progress) and the time is within
:data:`PROOF_WINDOW_S`; otherwise the header is ignored. A cluster without a secret (``insecure``)
sends no proof and trusts none.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterable, Mapping

import aiohttp
import yarl
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from rcq.errors import CommitOutcomeUnknown, NoLeader, NotLeader, PayloadTooLarge, RcqError, Unavailable
from rcq.server.config import NodeConfig, PeerConfig
from rcq.server.http.connections import read_body
from rcq.server.http.handlers import error_response

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ settings (fixed for now)
IN_FLIGHT_MAX = 256  # forwards one follower has open at once; past it, 503 with Retry-After
CONNECT_TIMEOUT_S = 3.0  # a leader that does not accept within this is treated as unreachable
SLACK_S = 5.0  # over the longest the leader may take by its own limits
ADMIN_WAIT_S = 600.0  # the longest catch_up_timeout_s an added member may be given (AddMemberRequest)
PROOF_WINDOW_S = 30.0  # a proof older or newer than this (clock skew included) is not trusted
KEY_LABEL = b"rcq http forwarding v1"

# ------------------------------------------------------------------ headers
REDIRECT = "Rcq-Redirect"  # "1": answer 307 instead of forwarding
FORWARDED_BY = "Rcq-Forwarded-By"  # the follower's node id; its presence stops a second forward
FORWARDED_FOR = "Rcq-Forwarded-For"  # the caller's address, as the follower saw it
FORWARDED_AT = "Rcq-Forwarded-At"  # unix time in ms, covered by the proof
FORWARD_PROOF = "Rcq-Forward-Proof"  # hex HMAC-SHA256, see the module docstring
FORWARDED_TO = "Rcq-Forwarded-To"  # on the answer: the leader URL that answered it
OWN_HEADERS = frozenset(h.lower() for h in (REDIRECT, FORWARDED_BY, FORWARDED_FOR, FORWARDED_AT, FORWARD_PROOF,
                                            FORWARDED_TO))
SENT_ON = frozenset({"authorization", "content-type", "accept"})  # and the caller's other Rcq-* headers
RELAYED_BACK = frozenset({"content-type", "retry-after", "www-authenticate", "location"})  # and Rcq-*
NOT_FORWARDED_PATHS = frozenset({"/v1/session"})
SAFE_METHODS = frozenset({"GET", "HEAD"})

OUTCOMES = ("answered", "redirected", "not_sent", "answer_lost", "leader_moved", "busy")


# ------------------------------------------------------------------ the proof
def derive_key(secret: str) -> bytes:
    """The forwarding key of a cluster secret: not the secret itself, which seals Raft frames."""
    return hmac.new(secret.encode("utf-8"), KEY_LABEL, hashlib.sha256).digest()


def proof(key: bytes, method: str, raw_path: str, at_ms: int, client: str, by: str) -> str:
    message = "\n".join((method, raw_path, str(at_ms), client, by)).encode("utf-8", "surrogateescape")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class ProofKeys:
    """Signs with the cluster secret's key; verifies with it or a previous secret's (a rotation)."""

    def __init__(self, secret: str | None, previous: Iterable[str] = ()) -> None:
        self.signing = derive_key(secret) if secret else None
        self.verifying = [derive_key(s) for s in ([secret] if secret else []) + list(previous)]

    def verify(self, method: str, raw_path: str, at: str, client: str, by: str, presented: str,
               now_s: float) -> bool:
        try:
            at_ms = int(at)
        except ValueError:
            return False
        if abs(now_s - at_ms / 1000) > PROOF_WINDOW_S:
            return False
        # every key is tried, whichever matches: the time taken does not say which one did
        results = [hmac.compare_digest(proof(key, method, raw_path, at_ms, client, by), presented)
                   for key in self.verifying]
        return any(results)


# ------------------------------------------------------------------ the forwarder
class Forwarder:
    """One node's forwarding: :meth:`answer` on the follower side, :meth:`trusted` on the leader
    side. Its HTTP session is made on first use and closed with the app (:meth:`close`).
    ``directory()``: Raft address -> node, for every node known (where ``peer_urls`` is looked up)."""

    def __init__(self, config: NodeConfig, peer_tls: ssl.SSLContext | None,
                 registry: CollectorRegistry | None = None,
                 directory: Callable[[], Mapping[str, PeerConfig]] | None = None) -> None:
        self._config = config
        self._directory = directory
        self._peer_tls = peer_tls
        self._keys = ProofKeys(config.cluster_secret, config.cluster_secrets_previous)
        self._session: aiohttp.ClientSession | None = None
        self.in_flight = 0
        self._counted: dict[str, Counter] = {}
        if registry is not None:
            family = Counter("rcq_http_forwarded", "Leader-only requests a follower received, by what became of "
                             "them: answered (the leader's answer relayed), redirected (307: asked for, already "
                             "forwarded), not_sent (leader unreachable, 503), answer_lost (sent, no answer: 504 or "
                             "503), leader_moved (the leader was not leading any more, 503), busy (too many "
                             "forwards in flight, 503)", ["outcome"], registry=registry)
            self._counted = {outcome: family.labels(outcome) for outcome in OUTCOMES}

    # ---------------------------------------------------------- the leader's side
    def trusted(self, request: web.Request) -> web.Request:
        """``request``, or a copy whose ``remote`` is the caller a member forwarded it for, when it
        carries a valid proof; a forwarded-for header without one is ignored."""
        client = request.headers.get(FORWARDED_FOR)
        if client is None:
            return request
        presented, at, by = (request.headers.get(FORWARD_PROOF), request.headers.get(FORWARDED_AT),
                             request.headers.get(FORWARDED_BY))
        if presented is None or at is None or by is None or not self._keys.verifying:
            return request
        if not self._keys.verify(request.method, request.raw_path, at, client, by, presented, time.time()):
            log.debug("a forwarded-for header without a valid proof, from %s: ignored", request.remote)
            return request
        return request.clone(remote=client)

    # ---------------------------------------------------------- the follower's side
    def wants_redirect(self, request: web.Request) -> bool:
        """True: this request gets the 307 (asked for, already forwarded once, or the channel)."""
        return self.asks_redirect(request) or FORWARDED_BY in request.headers

    @staticmethod
    def asks_redirect(request: web.Request) -> bool:
        """True: the caller asked for the redirect (``Rcq-Redirect: 1``), or it is the channel's upgrade."""
        return request.headers.get(REDIRECT, "").strip() not in ("", "0") or request.path in NOT_FORWARDED_PATHS

    async def answer(self, request: web.Request, refusal: NotLeader) -> web.Response:
        """The answer to ``request``, which raised ``refusal`` on this node (not the leader)."""
        if refusal.leader_url is None or self.wants_redirect(request):
            self._count("redirected")
            return self._error(refusal, request)
        return await self.forward(request, refusal.leader_url, self.dial_url(refusal.leader_url))

    async def forward(self, request: web.Request, leader_url: str, dial_url: str) -> web.Response:
        """``request`` sent, once, to the leader advertised as ``leader_url`` at ``dial_url``, and its
        answer (the refusals of the module docstring when that fails); within :data:`IN_FLIGHT_MAX`."""
        if self.in_flight >= IN_FLIGHT_MAX:
            self._count("busy")
            return self._error(Unavailable(f"this node is forwarding {IN_FLIGHT_MAX} requests to leaders "
                                           "already; retry shortly, or send to the leader",
                                           leader_url=leader_url), request)
        self.in_flight += 1
        try:
            return await self._forward(request, leader_url, dial_url)
        except RcqError as exc:
            return self._error(exc, request)
        finally:
            self.in_flight -= 1

    async def _forward(self, request: web.Request, leader_url: str, dial_url: str) -> web.Response:
        try:  # the handler may have read it already (read() keeps it); within this node's body limit
            body = await read_body(request, self._config.http_body_timeout_s)
        except web.HTTPRequestEntityTooLarge as exc:
            raise PayloadTooLarge(f"request body over the limit: {exc.text}") from None
        url = yarl.URL(dial_url.rstrip("/") + request.raw_path, encoded=True)
        where = leader_url if dial_url == leader_url else f"{dial_url} (advertised as {leader_url})"
        headers = self._headers_to_send(request)
        timeout = aiohttp.ClientTimeout(total=self._timeout_s(request), sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._http().request(request.method, url, data=body or None, headers=headers,
                                            allow_redirects=False, timeout=timeout) as response:
                raw = await response.read()
                status, headers_in = response.status, response.headers
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            self._count("not_sent")
            raise NoLeader(f"cannot reach the leader at {where} ({type(exc).__name__}); the request was not "
                           "sent: retry shortly", leader_url=leader_url) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._count("answer_lost")
            what = f"forwarded to the leader at {where}, no answer ({type(exc).__name__})"
            if request.method in SAFE_METHODS:
                raise Unavailable(f"{what}; retry shortly", leader_url=leader_url) from None
            raise CommitOutcomeUnknown(f"{what}: the request may have been applied; ask for the transaction's "
                                       "outcome, or retry it with the same transaction id or key",
                                       leader_url=leader_url) from None
        if status == NotLeader.http_status:
            self._count("leader_moved")
            raise NoLeader(f"the leader at {leader_url} stopped leading before it ran the request; "
                           "retry shortly", leader_url=_leader_named(raw) or None)
        self._count("answered")
        relayed = web.Response(status=status, body=raw)
        for name, value in headers_in.items():
            lowered = name.lower()
            if lowered in RELAYED_BACK or (lowered.startswith("rcq-") and lowered not in OWN_HEADERS):
                relayed.headers.add(name, value)
        relayed.headers[FORWARDED_TO] = leader_url
        return relayed

    def dial_url(self, leader_url: str) -> str:
        """Where a forward to the leader advertised as ``leader_url`` goes: its ``peer_urls`` entry,
        else ``leader_url`` itself."""
        if not self._config.peer_urls or self._directory is None:
            return leader_url
        wanted = leader_url.rstrip("/")
        for known in self._directory().values():
            if known.http_url.rstrip("/") == wanted:
                return self._config.peer_url(known.node_id, leader_url)
        return leader_url

    def _headers_to_send(self, request: web.Request) -> dict[str, str]:
        headers = {name: value for name, value in request.headers.items()
                   if (name.lower() in SENT_ON or name.lower().startswith("rcq-")) and name.lower() not in OWN_HEADERS}
        client, by, at_ms = request.remote or "", self._config.node_id, int(time.time() * 1000)
        headers[FORWARDED_BY] = by
        headers[FORWARDED_FOR] = client
        headers[FORWARDED_AT] = str(at_ms)
        if self._keys.signing is not None:
            headers[FORWARD_PROOF] = proof(self._keys.signing, request.method, request.raw_path, at_ms, client, by)
        return headers

    def _timeout_s(self, request: web.Request) -> float:
        """The longest the leader may take by its own limits, plus slack: a commit's timeout plus a
        long-polling dequeue's wait (a commit may receive), and a member's catch-up for /v1/cluster."""
        config = self._config
        longest = config.commit_timeout_s + config.dequeue_wait_max_ms / 1000
        if request.path.startswith("/v1/cluster/"):
            longest += ADMIN_WAIT_S
        return longest + SLACK_S

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._peer_tls if self._peer_tls is not None else True,
                                             limit=IN_FLIGHT_MAX)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    @staticmethod
    def _error(error: RcqError, request: web.Request) -> web.Response:
        return error_response(error, request)

    def _count(self, outcome: str) -> None:
        counter = self._counted.get(outcome)
        if counter is not None:
            counter.inc()

    async def close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _leader_named(raw: bytes) -> str | None:
    """The ``leader_url`` of a ``not_leader`` body, if it names one."""
    try:
        error = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        return None
    url = error.get("leader_url") if isinstance(error, dict) else None
    return url if isinstance(url, str) else None
