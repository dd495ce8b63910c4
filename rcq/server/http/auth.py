"""Authentication of HTTP requests: the token a request carries becomes its :class:`Principal`.

Every route needs a token except ``/healthz`` and ``/readyz`` (load balancers and orchestrators
probe those without credentials; they reveal roles and indexes, no data). A token comes as
``Authorization: Bearer <token>``, or as the password of HTTP Basic authentication (any user
name), which is what a browser sends for the status page after asking for it. What each route
then requires of the principal (a queue permission, ownership of a transaction, admin) is
checked where the route's work is done (:mod:`rcq.server.http.operations`, :mod:`.api`).

On a node without tokens (loopback only, see ``NodeConfig``) every request is :data:`OPEN`. A
partition process also takes the calls p0's leader signs with the cluster secret
(:mod:`rcq.server.security.cluster_calls`) on the few paths they cover, as the ``cluster`` admin.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time

from aiohttp import web

from rcq.server.config import NodeConfig
from rcq.server.security import cluster_calls
from rcq.tokens import OPEN, Principal, TokenRegistry

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
PRINCIPAL = web.RequestKey("principal", Principal)


def presented_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization`` header (Bearer, or Basic's password); None if absent/unusable."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return value or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


def principal_of(request: web.Request) -> Principal:
    principal: Principal = request.get(PRINCIPAL, OPEN)
    return principal


def authenticate(request: web.Request, registry: TokenRegistry) -> None:
    """Give ``request`` the principal of the token it carries; raises ``Unauthorized`` (or
    ``TokenExpired``) if it has none that is valid. Public paths need none, nor does any path of
    a node without tokens: those requests keep :data:`OPEN`. Called by the app's middleware."""
    if registry.enabled and request.path not in PUBLIC_PATHS:
        request[PRINCIPAL] = registry.authenticate(presented_token(request.headers.get("Authorization")))


async def authenticate_cluster_call(request: web.Request, config: NodeConfig) -> bool:
    """Give ``request`` the ``cluster`` principal when it is a call of p0's leader with a valid
    proof to a partition process; False (the request is authenticated as any other) otherwise."""
    presented = request.headers.get(cluster_calls.HEADER)
    if presented is None or config.partition_name is None or not cluster_calls.covers(request.path):
        return False
    secrets = [config.cluster_secret or "", *config.cluster_secrets_previous]
    if not cluster_calls.verify(secrets, request.method, request.raw_path, await request.read(), presented,
                                time.time()):
        log.debug("a cluster call without a valid proof, from %s: ignored", request.remote)
        return False
    request[PRINCIPAL] = cluster_calls.CLUSTER
    return True


# ``WWW-Authenticate`` of every 401: Basic, so that a browser asks for the token (as the password).
CHALLENGE = 'Basic realm="rcq", charset="UTF-8"'
