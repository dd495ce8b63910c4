"""Backups served by a node: ``GET /v1/admin/backup`` streams a backup file of this node's state,
``GET /v1/cluster/data-digest`` answers the data digest; both for admins (docs/backup.md).

A backup is the state at one applied index, written by a forked child to a file in the node's
data directory (:mod:`rcq.server.raft.backup_child`: the state lock is held only for the fork,
and the node's heap never holds a copy), then streamed from that file in chunks of 1 MiB with the
header before it and the SHA-256 trailer after it, and deleted. The answer's ``Content-Length``
is exact, so a client that gets fewer bytes knows the node died or the connection broke.

One backup at a time per node (``409 backup_in_progress`` meanwhile). A leader answers only when
asked with ``from_leader=true``: a backup costs a fork, a file the size of the data and the bytes
on the wire, which belong on a follower (``409 backup_from_leader`` otherwise).

What this node served last (time, index, bytes) is in ``/v1/cluster`` (``last_backup``), on the
status page, and in the ``rcq_backup_last_*`` metrics with ``rcq_backups_served_total`` by outcome.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from rcq.backup.fileformat import BACKUP_FORMAT, CHUNK_BYTES, encode_prefix, encode_trailer
from rcq.errors import RcqError
from rcq.server.config import NodeConfig
from rcq.server.http.handlers import CONFIG, METRICS, REPLICATOR, admin_only, json_response
from rcq.server.raft.backup_child import digest_only, remove_quietly, run_forked, write_body
from rcq.server.raft.protocol import Replicator
from rcq.version import rcq_version

log = logging.getLogger(__name__)

BACKUP_PATH = "/v1/admin/backup"
DATA_DIGEST_PATH = "/v1/cluster/data-digest"
BODY_FILE = "backup.body.part"  # in the data directory; removed after each backup and at start
CHILD_TIMEOUT_S = 1800.0  # tens of millions of items take minutes; past this the child is killed
DIGEST_TIMEOUT_S = 600.0
CONTENT_TYPE = "application/vnd.rcq.backup"
OUTCOMES = ("served", "failed", "cut")


class BackupInProgress(RcqError):
    """This node is already serving a backup; try another node or later."""

    code = "backup_in_progress"
    http_status = 409
    retryable = True


class BackupFromLeader(RcqError):
    """This node is the leader: a backup is taken from a follower (ask with from_leader=true to take it here)."""

    code = "backup_from_leader"
    http_status = 409


class BackupService:
    """One node's backups: one at a time, the last one remembered, counted in its metrics."""

    def __init__(self, config: NodeConfig, replicator: Replicator, registry: CollectorRegistry | None) -> None:
        self._config = config
        self._replicator = replicator
        self._body_path = os.fspath(config.data_dir / BODY_FILE)
        remove_quietly(self._body_path)  # left by a node killed while serving one
        self._busy = False
        self._closing = threading.Event()
        self.last: dict[str, Any] | None = None
        self._served: Counter | None = None
        self._gauges: dict[str, Gauge] = {}
        if registry is not None:
            self._served = Counter("rcq_backups_served", "Backups this node was asked for, by outcome (served; "
                                   "failed before the first byte; cut: the stream broke off)", ["outcome"],
                                   registry=registry)
            for outcome in OUTCOMES:
                self._served.labels(outcome=outcome)
            for name, text in (("timestamp_seconds", "Unix time the last backup this node served completed"),
                               ("index", "Raft index of the last backup this node served"),
                               ("bytes", "Size in bytes of the last backup this node served"),
                               ("duration_seconds", "Seconds the last backup this node served took")):
                self._gauges[name] = Gauge(f"rcq_backup_last_{name}", text, registry=registry)

    async def close(self, app: web.Application) -> None:
        self._closing.set()

    # --------------------------------------------------------------- routes
    async def backup(self, request: web.Request) -> web.StreamResponse:
        from_leader = request.query.get("from_leader", "false").lower() in ("1", "true", "yes")
        if self._replicator.is_leader() and not from_leader:
            raise BackupFromLeader()
        if self._busy:
            raise BackupInProgress()
        self._busy = True
        started = time.monotonic()
        try:
            try:
                facts = await asyncio.to_thread(run_forked, self._replicator.read,
                                                lambda sm: write_body(sm, self._body_path), CHILD_TIMEOUT_S,
                                                self._closing)
            except RcqError:
                self._count("failed")
                raise
            return await self._stream(request, facts, started)
        finally:
            remove_quietly(self._body_path)
            self._busy = False

    async def data_digest(self, request: web.Request) -> web.Response:
        answer = await asyncio.to_thread(run_forked, self._replicator.read, digest_only, DIGEST_TIMEOUT_S,
                                         self._closing, "data digest")
        return json_response({"node_id": self._config.node_id, "data_digest": answer["data_digest"],
                              "applied_index": answer["index"]})

    async def _stream(self, request: web.Request, facts: dict[str, Any], started: float) -> web.StreamResponse:
        now = datetime.now(UTC)
        header = {"backup_format": BACKUP_FORMAT, "rcq_version": rcq_version(), "taken_at": now.isoformat(),
                  "node_id": self._config.node_id, **facts}
        prefix = encode_prefix(header)
        body_bytes = os.path.getsize(self._body_path)
        total = len(prefix) + body_bytes + len(encode_trailer(b"\0" * 32))
        response = web.StreamResponse(headers={
            "Content-Type": CONTENT_TYPE, "Content-Length": str(total),
            "Rcq-Backup-Index": str(facts["index"]), "Rcq-Backup-Data-Digest": str(facts["data_digest"]),
            "Content-Disposition": f'attachment; filename="rcq-{facts["index"]}.rcqbackup"'})
        digest = hashlib.sha256(prefix)
        try:
            await response.prepare(request)
            await response.write(prefix)
            with open(self._body_path, "rb") as body:
                while True:
                    chunk = await asyncio.to_thread(body.read, CHUNK_BYTES)
                    if not chunk:
                        break
                    digest.update(chunk)
                    await response.write(chunk)
            await response.write(encode_trailer(digest.digest()))
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError, asyncio.CancelledError) as exc:
            self._count("cut")
            log.info("node %s: a backup at index %s broke off after it started (the client went away: %s)",
                     self._config.node_id, facts["index"], type(exc).__name__)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return response  # the connection is gone: nobody reads an answer
        seconds = time.monotonic() - started
        self.last = {"at": now.timestamp(), "index": facts["index"], "bytes": total, "seconds": round(seconds, 3),
                     "items": facts["items"]}
        self._count("served")
        for name, value in (("timestamp_seconds", now.timestamp()), ("index", facts["index"]), ("bytes", total),
                            ("duration_seconds", seconds)):
            if name in self._gauges:
                self._gauges[name].set(value)
        log.info("node %s served a backup: index %s, %d items, %d bytes in %.1f s", self._config.node_id,
                 facts["index"], facts["items"], total, seconds)
        return response

    def _count(self, outcome: str) -> None:
        if self._served is not None:
            self._served.labels(outcome=outcome).inc()


BACKUPS = web.AppKey("backups", BackupService)


def add_backup_routes(app: web.Application) -> None:
    service = BackupService(app[CONFIG], app[REPLICATOR], app[METRICS].registry)
    app[BACKUPS] = service
    app.on_cleanup.append(service.close)
    app.router.add_get(BACKUP_PATH, admin_only("take a backup", service.backup))
    app.router.add_get(DATA_DIGEST_PATH, admin_only("read the data digest", service.data_digest))
