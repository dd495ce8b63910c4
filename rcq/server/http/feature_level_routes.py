"""The feature-level routes (admin only): what each member reads, and raising the active level.

``GET /v1/cluster/feature-level`` answers on any node (it asks the members); ``POST`` raises the
level on the serving leader only (others redirect). What is checked and written is
:class:`rcq.server.leader.feature_levels.FeatureLevels`; this module adds HTTP, and the survey of
a member: its ``/healthz``, which states its version and the highest level it reads.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import ssl

import aiohttp
from aiohttp import web

from rcq.server.core.features import LEVEL_BASE
from rcq.server.http.handlers import admin_only, json_response, read_model
from rcq.server.http.models import RaiseFeatureLevelRequest
from rcq.server.leader.feature_levels import FeatureLevels, NodeLevels, Survey

SURVEY_TIMEOUT_S = 3.0
FEATURE_LEVELS = web.AppKey("feature_levels", FeatureLevels)


class HealthSurvey:
    """Asks a node's ``/healthz`` what it reads; one HTTP session, closed with the app."""

    def __init__(self, peer_tls: ssl.SSLContext | None) -> None:
        self._peer_tls = peer_tls
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, url: str) -> NodeLevels | str:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._peer_tls if self._peer_tls is not None else True)
            self._session = aiohttp.ClientSession(connector=connector)
        try:
            async with self._session.get(f"{url.rstrip('/')}/healthz",
                                         timeout=aiohttp.ClientTimeout(total=SURVEY_TIMEOUT_S)) as response:
                if response.status != 200:
                    return f"/healthz answered HTTP {response.status}"
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError, ssl.SSLError) as exc:
            return f"/healthz did not answer ({type(exc).__name__})"
        if not isinstance(body, dict):
            return "/healthz answered no object"
        version, level_max = body.get("version"), body.get("feature_level_max", LEVEL_BASE)  # rcq 0.1: neither
        if not isinstance(level_max, int) or level_max < LEVEL_BASE:
            return f"/healthz states feature_level_max {level_max!r}"
        ports = body.get("partition_ports")
        return NodeLevels(version=version if isinstance(version, str) else None, level_max=level_max,
                          partition_ports=ports if isinstance(ports, dict) else None)

    async def close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()


def make_survey(app: web.Application, peer_tls: ssl.SSLContext | None) -> Survey:
    survey = HealthSurvey(peer_tls)
    app.on_cleanup.append(survey.close)
    return survey


def add_routes(app: web.Application) -> None:
    async def report(request: web.Request) -> web.Response:
        return json_response(await request.app[FEATURE_LEVELS].report())

    async def raise_level(request: web.Request) -> web.Response:
        body = await read_model(request, RaiseFeatureLevelRequest)
        return json_response(await request.app[FEATURE_LEVELS].raise_to(body.level))

    async def start(app: web.Application) -> None:
        app[FEATURE_LEVELS].start()

    async def stop(app: web.Application) -> None:
        await app[FEATURE_LEVELS].stop()

    app.router.add_get("/v1/cluster/feature-level", admin_only("read the feature levels", report))
    app.router.add_post("/v1/cluster/feature-level", admin_only("raise the feature level", raise_level))
    app.on_startup.append(start)
    app.on_shutdown.append(stop)
