"""``rcq backup`` of a cluster with partitions: a backup set, one checked part per partition
(docs/backup.md; the format is :mod:`rcq.backup.backup_set`).

The command lists the partitions (``GET /v1/cluster/partitions``); a cluster with p0 only gets
one backup file, as it always has. Otherwise each partition's part is taken as one group's backup
is (:func:`rcq.cli.backup.save_backup`: from a caught-up follower of that partition, streamed,
checked), the partitions first and p0 last. A queue is placed in p0's directory before it is
created in its partition, so p0's part places every queue the other parts hold. The partitions
p0's part lists then decide the set: one created meanwhile is backed up too, one deleted
meanwhile (it held no queue) is dropped. Everything is written into ``PATH.part/``; only a
complete set, its manifest last, every file and the folder fsynced, is renamed to ``PATH``.

Must not import: pysyncobj, lmdb, rcq.server.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rcq.backup.backup_set import (
    P0,
    BackupSet,
    directory_partitions,
    manifest_of,
    part_file_name,
    read_directory,
    verify_set,
    write_manifest,
)
from rcq.backup.fileformat import Header
from rcq.cli.backup import BackupFailed, _fsync_dir, save_backup
from rcq.errors import InvalidRequest, RcqError, Unavailable
from rcq.version import rcq_version

ROUNDS_MAX = 3  # passes over partitions created while the set was taken, before it gives up
LIST_TIMEOUT_S = 10.0


async def list_partitions(urls: list[str], token: str | None, ca_file: Any = None,
                          client_cert: Any = None) -> list[dict[str, Any]] | None:
    """The cluster's partitions as the first node that answers lists them; None when no node
    knows partitions (an rcq before them: ``404``)."""
    import aiohttp

    from rcq.client.exchange import new_session, normalize_url, tls_context
    from rcq.errors import error_from_body

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    failures: list[str] = []
    async with new_session(tls_context(ca_file, client_cert)) as session:
        for url in (normalize_url(u) for u in urls):
            try:
                async with session.get(url + "/v1/cluster/partitions", headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=LIST_TIMEOUT_S)) as answer:
                    if answer.status == 404 and answer.content_type != "application/json":
                        return None  # no such route: an rcq from before partitions
                    body = await answer.json(content_type=None)
                    if answer.status != 200:
                        raise error_from_body(answer.status, body)
                    return list(body["partitions"])
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                failures.append(f"{url}: {type(exc).__name__}")
    raise Unavailable("no node listed the partitions: " + "; ".join(failures))


async def save_cluster_backup(urls: list[str], path: Path, *, token: str | None, ca_file: Any = None,
                              client_cert: Any = None, from_leader: bool = False, force: bool = False,
                              rows: list[dict[str, Any]] | None = None) -> BackupSet:
    """Save a backup set of every partition to the directory ``path``; the set, verified."""
    path = Path(path)
    if path.exists() and not force:
        raise InvalidRequest(f"{path} exists; pass --force to replace it")
    part_dir = path.with_name(path.name + ".part")
    if part_dir.exists():
        shutil.rmtree(part_dir)  # left by an interrupted run: never a complete set
    part_dir.mkdir(mode=0o700, parents=False)
    options = {"token": token, "ca_file": ca_file, "client_cert": client_cert, "from_leader": from_leader}
    try:
        rows = rows if rows is not None else await list_partitions(urls, token, ca_file, client_cert) or []
        taken: dict[str, tuple[int, Header]] = {}
        for row in rows:
            if row["name"] != P0:
                taken[row["name"]] = (int(row["number"]), await _save_part(row, part_dir, options))
        p0 = await save_backup(urls, part_dir / part_file_name(P0), **options)
        for _ in range(ROUNDS_MAX):
            listed = directory_partitions(read_directory(part_dir / part_file_name(P0)))
            for name in [name for name in taken if name not in listed]:  # deleted meanwhile: held no queue
                (part_dir / part_file_name(name)).unlink()
                del taken[name]
            missing = [name for name in listed if name not in taken]
            if not missing:
                break
            current = {row["name"]: row for row in await list_partitions(urls, token, ca_file, client_cert) or []}
            for name in missing:  # created meanwhile: its state now is at least what p0 knew of it
                if name not in current:
                    raise BackupFailed(f"partition {name} was listed in p0's state but is gone: run the backup again")
                taken[name] = (listed[name][0], await _save_part(current[name], part_dir, options))
        else:
            raise BackupFailed(f"partitions kept being created while the backup was taken ({ROUNDS_MAX} passes)")
        parts = [(P0, 0, p0, (part_dir / part_file_name(P0)).stat().st_size)]
        parts += [(name, number, header, (part_dir / part_file_name(name)).stat().st_size)
                  for name, (number, header) in taken.items()]
        write_manifest(part_dir, manifest_of(parts, datetime.now(UTC).isoformat(), rcq_version()))
        _fsync_dir(part_dir)
        backup_set = verify_set(part_dir)
        _put_in_place(part_dir, path)
    except BaseException:
        shutil.rmtree(part_dir, ignore_errors=True)
        raise
    return BackupSet(path, backup_set.manifest, tuple(
        dataclasses.replace(part, path=path / part.path.name) for part in backup_set.parts))


async def _save_part(row: dict[str, Any], part_dir: Path, options: dict[str, Any]) -> Header:
    name = str(row["name"])
    urls = [str(url) for url in row.get("urls") or []]
    if not urls:
        raise BackupFailed(f"partition {name} has no member whose ports are known: no node can serve its part")
    try:
        return await save_backup(urls, part_dir / part_file_name(name), **options)
    except RcqError as exc:
        raise BackupFailed(f"partition {name}: {exc.message}") from exc


def _put_in_place(part_dir: Path, path: Path) -> None:
    """Rename the complete set to ``path`` (a set or file there, with --force, replaced)."""
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        os.replace(path, old)
    os.replace(part_dir, path)
    _fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def describe_set(backup_set: BackupSet, done: str = "saved") -> str:
    """What a backup set holds, after ``done``."""
    size = sum(part.path.stat().st_size for part in backup_set.parts)
    manifest = backup_set.manifest
    lines = [f"{done} {backup_set.path} ({size} bytes in {len(backup_set.parts)} parts): {backup_set.items} items, "
             f"taken {manifest['taken_at']}, rcq {manifest['rcq_version']}, cluster "
             f"{manifest['cluster_id'] or '(no identity)'}",
             f"  combined digest {backup_set.combined_digest}"]
    for part in backup_set.parts:
        header = part.header
        members = f" on {', '.join(part.members)}" if part.members else ""
        lines.append(f"  {part.name}{members}: {header['items']} items in {header['queues']} queues at Raft index "
                     f"{header.index} (term {header.term}) from {header['node_id']}, data digest {header.data_digest}")
    return "\n".join(lines)
