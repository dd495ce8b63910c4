"""Calls p0's leader makes to partition processes on its own (docs/partitions.md, "Leaders spread",
"Members of a partition" and "Memory budget"): hand a partition's leadership over, read and change
its members, give a partition process its share of its node's memory budget.

No caller's token is at hand when the leader balancer moves a leader at night, so such a call
carries a proof instead: ``Rcq-Cluster-Call: <unix ms>.<hex HMAC-SHA256>`` over the method, the
path with its query, the time and the SHA-256 of the body, under a key derived from the cluster
secret (not the secret itself, which seals Raft frames). A partition process takes a call whose
proof is valid, under the secret or one of ``cluster_secrets_previous`` (a rotation), and no more
than :data:`CALL_WINDOW_S` off its own clock, as the admin principal ``cluster``. Only partition
processes take them, and only on :data:`CALL_PATHS`: a node's own port (p0) never does.

A proof can be replayed within its window by whoever sees it: it goes over the peers' TLS when
the cluster has TLS (docs/security.md), and its paths only move a leader or change members, which
their own checks guard (a lagging member is never made leader, one change at a time), or set a
partition process's storage allowance, which p0's controller checks at every survey (a replayed
one lasts until its next round).

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from rcq.tokens import Principal

HEADER = "Rcq-Cluster-Call"
CALL_WINDOW_S = 30.0  # a proof older or newer than this (clock skew included) is refused
KEY_LABEL = b"rcq cluster call v1"
CLUSTER = Principal(name="cluster", admin=True)
STORAGE_BUDGET_PATH = "/v1/cluster/storage-budget"
CALL_PATHS = frozenset({"/v1/cluster/leadership", "/v1/cluster/members", STORAGE_BUDGET_PATH})


def _key(secret: str) -> bytes:
    return hmac.new(secret.encode("utf-8"), KEY_LABEL, hashlib.sha256).digest()


def _mac(key: bytes, method: str, path_qs: str, at_ms: int, body: bytes) -> str:
    message = "\n".join((method.upper(), path_qs, str(at_ms), hashlib.sha256(body).hexdigest()))
    return hmac.new(key, message.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def sign(secret: str | None, method: str, path_qs: str, body: bytes, now_s: float) -> str:
    """The header's value for a call (a cluster without a secret signs with the empty one: it
    takes every request as admin anyway)."""
    at_ms = int(now_s * 1000)
    return f"{at_ms}.{_mac(_key(secret or ''), method, path_qs, at_ms, body)}"


def covers(path: str) -> bool:
    """Whether a proof may stand for a token on ``path``: the members routes, leadership and the
    storage allowance."""
    return path in CALL_PATHS or path.startswith("/v1/cluster/members/")


def verify(secrets: Iterable[str], method: str, path_qs: str, body: bytes, presented: str, now_s: float) -> bool:
    """Whether ``presented`` is a proof for this call under one of ``secrets``, made within the window."""
    at, dot, mac = presented.partition(".")
    if not dot or not at.isdigit() or abs(now_s - int(at) / 1000) > CALL_WINDOW_S:
        return False
    # every key is tried, whichever matches: the time taken does not say which one did
    results = [hmac.compare_digest(_mac(_key(secret), method, path_qs, int(at), body), mac) for secret in secrets]
    return any(results)
