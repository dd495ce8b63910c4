"""``rcq backup PATH``: take a backup of a cluster (docs/backup.md).

``backup`` asks the cluster's nodes who they are, takes the backup from a follower (the leader
only with ``--from-leader``) once it has applied what the leader had applied (so the backup holds
every commit acknowledged before the command began), and writes the stream as it arrives to
``PATH.part``, checking the length and the SHA-256 trailer; only a complete, checked file is
fsynced and renamed to ``PATH``.
A node that dies or a connection that breaks mid-stream: the partial file is removed and the
backup starts again from the next node; a local error (a full disk) removes it and fails.

A cluster with partitions besides p0 gets a backup set instead, a directory with one such file
per partition and a manifest (:mod:`rcq.cli.cluster_backup`). ``rcq restore`` is
:mod:`rcq.cli.restore`.

Must not import: pysyncobj, lmdb, rcq.server (the backup is a client of the cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcq.backup.fileformat import TRAILER_BYTES, TRAILER_MAGIC, Header, read_header
from rcq.cli.connection import _urls, client_security
from rcq.errors import InvalidRequest, RcqError, Unavailable

BACKUP_PATH = "/v1/admin/backup"
RECEIVE_CHUNK_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 10.0
# A follower has this long to apply what the leader had applied when the backup was asked for; one
# that lags longer (partitioned, overloaded) is passed over for the next node.
CATCH_UP_S = 10.0
CATCH_UP_POLL_S = 0.02
READ_TIMEOUT_S = 600.0  # between two chunks: a node's child writes the whole body before the first byte


class BackupFailed(RcqError):
    """No node could serve a complete backup."""

    code = "backup_failed"
    http_status = 503


def add_backup_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    backup = commands.add_parser(
        "backup", parents=[common], help="save a consistent backup of the cluster's state to PATH (admin token)",
        description="Stream a backup of the replicated state at one Raft index from a follower (the leader "
                    "keeps serving) into PATH, checked and fsynced; prints what it saved (docs/backup.md). A "
                    "cluster with partitions gets a backup set: PATH is a directory of one part per partition "
                    "and a manifest.")
    backup.add_argument("path", type=Path, metavar="PATH")
    backup.add_argument("--from-leader", action="store_true",
                        help="allow the leader to serve it (default: followers only)")
    backup.add_argument("--force", action="store_true", help="replace PATH if it exists")
    backup.set_defaults(func=cmd_backup)


# ------------------------------------------------------------------- backup
def cmd_backup(args: argparse.Namespace) -> int:
    urls, security = _urls(args), client_security(args)
    token = security["token"] or os.environ.get("RCQ_TOKEN") or None
    from rcq.backup.backup_set import P0
    from rcq.cli.cluster_backup import describe_set, list_partitions, save_cluster_backup

    options: dict[str, Any] = {"token": token, "ca_file": security["ca_file"],
                               "client_cert": security.get("client_cert"), "from_leader": args.from_leader,
                               "force": args.force}
    rows = asyncio.run(list_partitions(urls, token, security["ca_file"], security.get("client_cert")))
    if rows is not None and any(row["name"] != P0 for row in rows):  # a set: one part per partition
        backup_set = asyncio.run(save_cluster_backup(urls, args.path, rows=rows, **options))
        print(json.dumps({"path": str(args.path), **backup_set.manifest}) if args.json else describe_set(backup_set))
        return 0
    header = asyncio.run(save_backup(urls, args.path, **options))
    size = args.path.stat().st_size
    if args.json:
        print(json.dumps({"path": str(args.path), "bytes": size, **header.fields}))
    else:
        print(describe(header, args.path, size))
    return 0


def describe(header: Header, path: Path, size: int, done: str = "saved") -> str:
    """What a backup file holds, after ``done`` (what was just done to it)."""
    fields = header.fields
    return (f"{done} {path} ({size} bytes): {fields['items']} items ({fields['item_bytes']} bytes) in "
            f"{fields['queues']} queues holding items at Raft index {fields['index']} (term {fields['term']}), taken "
            f"{fields['taken_at']} from {fields['node_id']}\n"
            f"  data digest {fields['data_digest']}\n"
            f"  rcq {fields['rcq_version']}, feature level {fields['feature_level']}, backup format "
            f"{fields['backup_format']}, cluster {fields['cluster_id'] or '(no identity: feature level 1)'}")


async def save_backup(urls: list[str], path: Path, *, token: str | None, ca_file: Any = None,
                      client_cert: Any = None, from_leader: bool = False, force: bool = False,
                      on_chunk: Callable[[str, int], None] | None = None) -> Header:
    """Save a backup from the first node that serves a complete one; its header.

    ``on_chunk(node_url, bytes_so_far)`` is called after each chunk written (tests kill a node there)."""

    from rcq.client.exchange import new_session, normalize_url, tls_context

    path = Path(path)
    if path.exists() and not force:
        raise InvalidRequest(f"{path} exists; pass --force to replace it")
    part = path.with_name(path.name + ".part")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with new_session(tls_context(ca_file, client_cert)) as session:
        candidates, needed = await _candidates(session, [normalize_url(u) for u in urls], headers, from_leader)
        failures: list[str] = []
        for url in candidates:
            try:
                await _caught_up(session, url, headers, needed)
                await _receive(session, url, part, headers, from_leader, on_chunk)
            except _NodeFailed as exc:
                failures.append(f"{url}: {exc}")
                continue
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
                raise
            header = _check_saved(part)
            os.replace(part, path)
            _fsync_dir(path.parent)
            return header
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
        hint = "" if from_leader else " (followers only; --from-leader allows the leader)"
        raise BackupFailed(f"no node served a complete backup{hint}: " + ("; ".join(failures) or "no node answered"))


class _NodeFailed(Exception):
    """This node could not serve the backup; another may."""


async def _candidates(session: Any, urls: list[str], headers: dict[str, str], from_leader: bool
                      ) -> tuple[list[str], int]:
    """The nodes to ask, best first: followers that know a leader (most applied first), then the leader;
    and the leader's applied index (0 when no leader answered). Every commit acknowledged before this
    call is at or below that index: the leader answers a commit once it has applied it."""
    import aiohttp

    from rcq.errors import error_from_body

    known = dict.fromkeys(urls)
    views: dict[str, dict[str, Any]] = {}
    pending = list(urls)
    while pending:
        url = pending.pop(0)
        try:
            status, view = await _cluster_view(session, url, headers)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            continue
        if status in (401, 403):
            raise error_from_body(status, view)
        if not isinstance(view, dict):
            continue
        views[url] = view
        for peer in view.get("peers", []):
            peer_url = peer.get("url")
            if isinstance(peer_url, str) and peer_url.rstrip("/") not in known:
                known[peer_url.rstrip("/")] = None
                pending.append(peer_url.rstrip("/"))
    followers = [url for url, view in views.items() if view.get("role") != "leader" and view.get("leader_id")]
    followers.sort(key=lambda url: -int(views[url].get("last_applied") or 0))
    leaders = [url for url, view in views.items() if view.get("role") == "leader"]
    if not views:
        raise Unavailable(f"no node answered among {', '.join(urls)}")
    needed = max((int(views[url].get("last_applied") or 0) for url in leaders), default=0)
    return followers + (leaders if from_leader else []), needed


async def _cluster_view(session: Any, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    """The node's ``GET /v1/cluster``: its HTTP status and its JSON answer (a CertificateError, not a
    node that did not answer, when its certificate fails verification: no other node would pass)."""
    import aiohttp

    from rcq.client.exchange import certificate_error

    try:
        async with session.get(url + "/v1/cluster", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT_S)) as answer:
            return answer.status, await answer.json()
    except aiohttp.ClientConnectorCertificateError as exc:
        raise certificate_error(url, exc) from exc


async def _caught_up(session: Any, url: str, headers: dict[str, str], needed: int) -> None:
    """Wait until the node at ``url`` has applied index ``needed`` (a follower learns that an entry
    is committed with the leader's next message): its backup then holds every commit acknowledged
    before the backup was asked for. Within CATCH_UP_S, or :class:`_NodeFailed`."""
    import aiohttp

    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + CATCH_UP_S
    while True:
        try:
            status, view = await _cluster_view(session, url, headers)
            applied = int(view.get("last_applied") or 0) if isinstance(view, dict) else -1
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise _NodeFailed(f"it did not answer ({type(exc).__name__}: {exc})") from exc
        if status != 200:
            raise _NodeFailed(f"its /v1/cluster answered HTTP {status}")
        if applied >= needed:
            return
        if loop.time() >= give_up_at:
            raise _NodeFailed(f"it had applied index {applied}, behind the leader's {needed}, after {CATCH_UP_S:g} s")
        await asyncio.sleep(CATCH_UP_POLL_S)


async def _receive(session: Any, url: str, part: Path, headers: dict[str, str], from_leader: bool,
                   on_chunk: Callable[[str, int], None] | None) -> None:
    import aiohttp

    from rcq.errors import error_from_body

    query = {"from_leader": "true"} if from_leader else {}
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
    received = 0
    try:
        async with session.get(url + BACKUP_PATH, headers=headers, params=query, timeout=timeout) as answer:
            if answer.status != 200:
                try:
                    error = error_from_body(answer.status, await answer.json())
                except (ValueError, aiohttp.ContentTypeError):
                    error = Unavailable(f"HTTP {answer.status}")
                if answer.status in (401, 403):
                    raise error
                raise _NodeFailed(f"{error.code}: {error.message}")
            expected = answer.content_length
            digest = hashlib.sha256()
            tail = b""
            # every item is in it: readable by its owner only, as every file holding data or secrets
            with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
                os.fchmod(file.fileno(), 0o600)  # a .part left by an earlier attempt keeps its mode otherwise
                async for chunk in answer.content.iter_chunked(RECEIVE_CHUNK_BYTES):
                    file.write(chunk)  # an OSError (a full disk) is not the node's failure: it propagates
                    received += len(chunk)
                    # Everything but the trailer goes into the checksum: keep the last bytes aside.
                    tail += chunk
                    if len(tail) > TRAILER_BYTES:
                        digest.update(tail[:-TRAILER_BYTES])
                        tail = tail[-TRAILER_BYTES:]
                    if on_chunk is not None:
                        on_chunk(url, received)
                file.flush()
                os.fsync(file.fileno())
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        raise _NodeFailed(f"the stream broke off after {received} bytes ({type(exc).__name__}: {exc})") from exc
    if expected is not None and received != expected:
        raise _NodeFailed(f"the stream ended after {received} of {expected} bytes")
    if tail[:len(TRAILER_MAGIC)] != TRAILER_MAGIC or tail[len(TRAILER_MAGIC):] != digest.digest():
        raise _NodeFailed(f"the {received} bytes received do not match their checksum")


def _check_saved(part: Path) -> Header:
    with open(part, "rb") as file:
        return read_header(file, str(part))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
