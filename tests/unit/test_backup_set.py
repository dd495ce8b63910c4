"""A backup set is refused, naming the problem, before anything is restored (docs/backup.md,
"Backup sets"): a missing, damaged, replaced or extra part, a manifest that is malformed, newer or
whose combined digest is wrong, and a p0 whose directory lists other partitions than the parts;
the data digest leaves out the ports the directory records for each node."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from rcq.backup.backup_set import (
    MANIFEST_NAME,
    SET_FORMAT,
    combined_digest,
    manifest_of,
    part_file_name,
    verify_set,
    write_manifest,
)
from rcq.backup.fileformat import (
    BACKUP_FORMAT,
    BackupCorrupt,
    BackupUnsupported,
    BodyWriter,
    encode_prefix,
    encode_trailer,
    verify,
)
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.backup_child import DataDigest, data_meta

MEMBERS = ("node-0", "node-1", "node-2")


def _directory(partitions: dict[str, int]) -> dict[str, Any]:
    return {"next_number": max(partitions.values(), default=0) + 1,
            "partitions": [(name, number, MEMBERS, None) for name, number in sorted(partitions.items())],
            "node_ports": [("node-0", "127.0.0.1", "http://127.0.0.1:1", (2000, 2009), (2000, 2009), 1, 1)],
            "placement": [("q", ("p1",))]}


def _part(path: Path, name: str, index: int, directory: dict[str, Any] | None = None, value: bytes = b"v") -> None:
    meta = QueueStateMachine().snapshot_meta()
    if directory is not None:
        meta["directory"] = directory
    body = io.BytesIO()
    writer = BodyWriter(body)
    writer.meta(meta)
    digest = DataDigest(meta)
    writer.item(f"in-{name}", 1, value)
    digest.add(f"in-{name}", 1, value)
    writer.end()
    header = {"backup_format": BACKUP_FORMAT, "rcq_version": "test", "feature_level": 4, "cluster_id": None,
              "index": index, "term": 2, "taken_at": "now", "data_digest": digest.hexdigest(), "node_id": "node-1",
              "items": writer.items, "item_bytes": writer.item_bytes, "queues": writer.queues}
    content = encode_prefix(header) + body.getvalue()
    path.write_bytes(content + encode_trailer(hashlib.sha256(content).digest()))


def make_set(path: Path, partitions: dict[str, int] | None = None, listed: dict[str, int] | None = None) -> Path:
    """A set of p0 and ``partitions`` (name -> number) whose p0 lists ``listed`` (default: the same)."""
    partitions = {"p1": 1, "p2": 2} if partitions is None else partitions
    path.mkdir()
    _part(path / part_file_name("p0"), "p0", 50, _directory(partitions if listed is None else listed))
    for name, number in partitions.items():
        _part(path / part_file_name(name), name, 30 + number)
    parts = [(name, number, verify(path / part_file_name(name)), 1)
             for name, number in [("p0", 0), *partitions.items()]]
    write_manifest(path, manifest_of(parts, "now", "test"))
    return path


def _edit_manifest(path: Path, change: Any) -> None:
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    change(manifest)
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_a_good_set_reads_back(tmp_path: Path) -> None:
    backup_set = verify_set(make_set(tmp_path / "s"))
    assert [(p.name, p.number, p.members) for p in backup_set.parts] == [("p0", 0, ()), ("p1", 1, MEMBERS),
                                                                        ("p2", 2, MEMBERS)]
    assert backup_set.combined_digest == combined_digest({p.name: p.header.data_digest for p in backup_set.parts})
    assert backup_set.items == 3


def test_the_combined_digest_is_one_line_per_partition_in_name_order() -> None:
    lines = "p0 aa\np1 bb\n"
    assert combined_digest({"p1": "bb", "p0": "aa"}) == hashlib.sha256(lines.encode()).hexdigest()


@pytest.mark.parametrize(("damage", "message"), [
    ("missing part", "part of partition p2 .* is missing"),
    ("flipped byte", "checksum"),
    ("replaced part", "the part was replaced"),
    ("no manifest", "without manifest.json"),
    ("manifest not json", "cannot read"),
    ("combined digest", "combine to"),
    ("part unlisted in p0", "p0's directory lists partitions"),
    ("wrong file name", "names 'other.rcqbackup'"),
    ("duplicate row", "each partition once"),
])
def test_a_damaged_set_is_refused_naming_the_problem(tmp_path: Path, damage: str, message: str) -> None:
    path = make_set(tmp_path / "s")
    if damage == "missing part":
        (path / "p2.rcqbackup").unlink()
    elif damage == "flipped byte":
        raw = bytearray((path / "p1.rcqbackup").read_bytes())
        raw[40] ^= 0x01
        (path / "p1.rcqbackup").write_bytes(bytes(raw))
    elif damage == "replaced part":
        _part(path / "p1.rcqbackup", "p1", 99)
    elif damage == "no manifest":
        (path / MANIFEST_NAME).unlink()
    elif damage == "manifest not json":
        (path / MANIFEST_NAME).write_text("{not json")
    elif damage == "combined digest":
        _edit_manifest(path, lambda m: m.update(combined_digest="0" * 64))
    elif damage == "part unlisted in p0":
        _part(path / "p0.rcqbackup", "p0", 50, _directory({"p1": 1}))
        _edit_manifest(path, lambda m: m["partitions"][0].update(verify(path / "p0.rcqbackup").fields))
        manifest = json.loads((path / MANIFEST_NAME).read_text())
        parts = {row["name"]: row["data_digest"] for row in manifest["partitions"]}
        _edit_manifest(path, lambda m: m.update(combined_digest=combined_digest(parts)))
    elif damage == "wrong file name":
        _edit_manifest(path, lambda m: m["partitions"][1].update(file="other.rcqbackup"))
    else:
        _edit_manifest(path, lambda m: m["partitions"].append(dict(m["partitions"][1])))
    with pytest.raises(BackupCorrupt, match=message):
        verify_set(path)


def test_a_newer_set_format_is_refused(tmp_path: Path) -> None:
    path = make_set(tmp_path / "s")
    _edit_manifest(path, lambda m: m.update(backup_set_format=SET_FORMAT + 1))
    with pytest.raises(BackupUnsupported, match="newer rcq"):
        verify_set(path)


def test_the_data_digest_leaves_out_the_ports_of_the_nodes() -> None:
    meta = QueueStateMachine().snapshot_meta()
    meta["directory"] = _directory({"p1": 1})
    moved = {**meta, "directory": {**meta["directory"], "node_ports": []}}
    assert DataDigest(meta).hexdigest() == DataDigest(moved).hexdigest()
    assert data_meta(meta)["directory"]["partitions"] == meta["directory"]["partitions"]
    other = {**meta, "directory": {**meta["directory"], "placement": []}}
    assert DataDigest(meta).hexdigest() != DataDigest(other).hexdigest()  # placements are data
