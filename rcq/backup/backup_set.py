"""A backup set: the backup of a cluster with partitions, one backup file per partition and a manifest.

Layout (docs/backup.md)::

    PATH/manifest.json        what the set holds, written last
    PATH/p0.rcqbackup         p0's state: the queues that live in p0 and the partition directory
    PATH/<name>.rcqbackup     each partition the p0 part's directory lists, one backup file each

Each part is an ordinary backup file (:mod:`rcq.backup.fileformat`), consistent at its own Raft
index: no transaction spans two partitions, so no commit is split between parts. The manifest
names each part with its number, index, term, data digest and size, and a **combined digest**: the
SHA-256 of one line ``<name> <data digest>`` per partition in name order, which a restored
cluster has until it is written to.

:func:`verify_set` refuses a set before anything is restored when a part is missing, damaged
(its own checksum), not the part the manifest names (index, term or digest), or when the
partitions p0's directory lists are not exactly the parts: a p0 part alone would restore a
directory whose partitions have no data.

Must not import: rcq.server, pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcq.backup.fileformat import BackupCorrupt, BackupUnsupported, Header, read_body, verify

MANIFEST_NAME = "manifest.json"
SET_FORMAT = 1  # the newest written and read
P0 = "p0"
MANIFEST_BYTES_MAX = 1 << 20
PARTITIONS_ROOM = 4  # ports for partitions beyond a restored set's, as python -m cluster up gives


def part_file_name(name: str) -> str:
    return f"{name}.rcqbackup"


def combined_digest(digests: dict[str, str]) -> str:
    """The combined digest of partitions' data digests (name -> data digest)."""
    lines = "".join(f"{name} {digests[name]}\n" for name in sorted(digests))
    return hashlib.sha256(lines.encode()).hexdigest()


def is_backup_set(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a backup set (a directory) rather than one backup file."""
    return Path(path).is_dir()


@dataclass(frozen=True, slots=True)
class Part:
    """One partition's backup in a set."""

    name: str
    number: int
    path: Path
    header: Header
    members: tuple[str, ...]  # as p0's directory names them (p0: none: its members are Raft's own)


@dataclass(frozen=True, slots=True)
class BackupSet:
    path: Path
    manifest: dict[str, Any]
    parts: tuple[Part, ...]  # p0 first, then by name

    @property
    def p0(self) -> Part:
        return self.parts[0]

    def part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    @property
    def combined_digest(self) -> str:
        return str(self.manifest["combined_digest"])

    @property
    def items(self) -> int:
        return sum(int(p.header["items"]) for p in self.parts)


def partitions_room(backup_set: BackupSet) -> int:
    """How many partitions' ports each node of a local cluster restored from ``backup_set`` gets:
    up to the highest number among them (numbers are kept: ports derive from them), and room for
    PARTITIONS_ROOM more."""
    return max((part.number for part in backup_set.parts), default=0) + PARTITIONS_ROOM


def directory_partitions(meta: dict[str, Any]) -> dict[str, tuple[int, tuple[str, ...]]]:
    """The partitions a p0 state's meta lists in its directory: name -> (number, members)."""
    directory = meta.get("directory") or {}
    return {str(row[0]): (int(row[1]), tuple(str(m) for m in row[2])) for row in directory.get("partitions", ())}


def read_directory(p0_file: str | os.PathLike[str]) -> dict[str, Any]:
    """The meta of a verified p0 backup file (its directory, its queues' placement)."""
    _header, meta, items = read_body(p0_file)
    getattr(items, "close", lambda: None)()
    return meta


def manifest_of(parts: list[tuple[str, int, Header, int]], taken_at: str, rcq_version: str) -> dict[str, Any]:
    """The manifest of ``parts`` (name, number, header, bytes), p0 among them."""
    ordered = sorted(parts, key=lambda part: (part[0] != P0, part[0]))
    rows = [{"name": name, "number": number, "file": part_file_name(name), "bytes": size,
             **{key: header[key] for key in ("index", "term", "data_digest", "items", "item_bytes", "queues",
                                              "node_id", "feature_level", "taken_at")}}
            for name, number, header, size in ordered]
    p0 = next(header for name, _, header, _ in parts if name == P0)
    return {"backup_set_format": SET_FORMAT, "rcq_version": rcq_version, "taken_at": taken_at,
            "cluster_id": p0["cluster_id"], "combined_digest": combined_digest(
                {row["name"]: row["data_digest"] for row in rows}), "partitions": rows}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """``manifest.json`` in ``directory``, fsynced (readable by its owner only, as every part)."""
    target = directory / MANIFEST_NAME
    with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as file:
        json.dump(manifest, file, indent=1, sort_keys=True)
        file.write("\n")
        file.flush()
        os.fsync(file.fileno())


def read_manifest(path: Path) -> dict[str, Any]:
    target = path / MANIFEST_NAME
    try:
        if target.stat().st_size > MANIFEST_BYTES_MAX:
            raise BackupCorrupt(f"{target} is over {MANIFEST_BYTES_MAX} bytes: not a backup set's manifest")
        manifest = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise BackupCorrupt(f"{path} is a directory without {MANIFEST_NAME}: not a complete backup set "
                            "(an interrupted rcq backup leaves PATH.part, never PATH)") from exc
    except (OSError, ValueError) as exc:
        raise BackupCorrupt(f"cannot read {target}: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("partitions"), list):
        raise BackupCorrupt(f"{target} is not a backup set's manifest")
    version = manifest.get("backup_set_format")
    if isinstance(version, int) and version > SET_FORMAT:
        raise BackupUnsupported(f"{path} is backup set format {version}, made by rcq {manifest.get('rcq_version')}; "
                                f"this rcq reads formats up to {SET_FORMAT}: restore it with a newer rcq")
    if version != SET_FORMAT:
        raise BackupCorrupt(f"{target} names backup set format {version!r}")
    return manifest


def verify_set(path: str | os.PathLike[str]) -> BackupSet:
    """Check every part of the set at ``path`` and how they fit together; BackupCorrupt (or
    BackupUnsupported) naming the first problem, before anything is restored."""
    path = Path(path)
    manifest = read_manifest(path)
    rows = manifest["partitions"]
    try:
        names = [str(row["name"]) for row in rows]
        if len(set(names)) != len(names) or P0 not in names:
            raise BackupCorrupt(f"{path}: the manifest must name p0 and each partition once, it names {names}")
        headers: dict[str, Header] = {}
        for row in rows:
            file = path / part_file_name(str(row["name"]))
            if str(row["file"]) != file.name:
                raise BackupCorrupt(f"{path}: the manifest names {row['file']!r} for {row['name']}, not {file.name}")
            if not file.exists():
                raise BackupCorrupt(f"{path}: the part of partition {row['name']} ({file.name}) is missing")
            header = verify(file)  # its own checksum over every byte
            for key in ("index", "term", "data_digest"):
                if header[key] != row[key]:
                    raise BackupCorrupt(f"{file}: its {key} is {header[key]!r}, the manifest says {row[key]!r}: "
                                        "the part was replaced")
            headers[row["name"]] = header
        numbers = {str(row["name"]): int(row["number"]) for row in rows}
    except (KeyError, TypeError, ValueError) as exc:
        raise BackupCorrupt(f"{path}/{MANIFEST_NAME} is malformed: {exc!r}") from exc
    computed = combined_digest({name: header.data_digest for name, header in headers.items()})
    if computed != manifest.get("combined_digest"):
        raise BackupCorrupt(f"{path}: the parts' data digests combine to {computed}, the manifest says "
                            f"{manifest.get('combined_digest')}")
    listed = directory_partitions(read_directory(path / part_file_name(P0)))
    expected = {name: number for name, number in numbers.items() if name != P0}
    if {name: number for name, (number, _) in listed.items()} != expected:
        raise BackupCorrupt(f"{path}: p0's directory lists partitions {sorted(listed)}, the set holds parts of "
                            f"{sorted(expected)}: a partition's part is missing or extra")
    parts = [Part(P0, 0, path / part_file_name(P0), headers[P0], ())]
    parts += [Part(name, number, path / part_file_name(name), headers[name], listed[name][1])
              for name, number in sorted(expected.items())]
    return BackupSet(path, manifest, tuple(parts))
