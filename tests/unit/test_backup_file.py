"""The backup file refuses bad input with a clear error and changes nothing (docs/backup.md):
any byte flipped, a truncated file, a newer format or feature level, a data directory that holds
something; and the data digest is the state digest's hash without the non-data keys."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from rcq.backup.fileformat import (
    BACKUP_FORMAT,
    BackupCorrupt,
    BackupUnsupported,
    BodyWriter,
    encode_prefix,
    encode_trailer,
    read_body,
    verify,
)
from rcq.server.core import snapshot_format
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.backup_child import DataDigest, data_digest, data_meta
from rcq.server.raft.restore_seed import RestoreRefused, build_snapshot, seed_data_dir

ITEMS = [("a", i, bytes([i % 256]) * (i % 50)) for i in range(1, 300)] + [("b", 7, b"seven")]


def make_backup(path: Path, **header_changes: object) -> dict[str, object]:
    meta = QueueStateMachine().snapshot_meta()
    body = io.BytesIO()
    writer = BodyWriter(body)
    writer.meta(meta)
    digest = DataDigest(meta)
    for queue, item_id, value in ITEMS:
        writer.item(queue, item_id, value)
        digest.add(queue, item_id, value)
    writer.end()
    header = {"backup_format": BACKUP_FORMAT, "rcq_version": "test", "feature_level": 1, "cluster_id": None,
              "index": 10, "term": 2, "taken_at": "now", "data_digest": digest.hexdigest(), "node_id": "node-1",
              "items": writer.items, "item_bytes": writer.item_bytes, "queues": writer.queues, **header_changes}
    content = encode_prefix(header) + body.getvalue()
    path.write_bytes(content + encode_trailer(hashlib.sha256(content).digest()))
    return header


def test_a_good_file_reads_back(tmp_path: Path) -> None:
    header = make_backup(tmp_path / "b")
    assert verify(tmp_path / "b").fields == header
    _header, _meta, items = read_body(tmp_path / "b")
    assert list(items) == ITEMS


def test_every_flipped_byte_is_refused(tmp_path: Path) -> None:
    make_backup(tmp_path / "b")
    good = (tmp_path / "b").read_bytes()
    for position in range(0, len(good), max(1, len(good) // 400)):
        damaged = bytearray(good)
        damaged[position] ^= 0x01
        (tmp_path / "d").write_bytes(bytes(damaged))
        with pytest.raises(BackupCorrupt):
            verify(tmp_path / "d")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    make_backup(tmp_path / "b")
    good = (tmp_path / "b").read_bytes()
    for length in (0, 5, 20, len(good) // 2, len(good) - 33, len(good) - 1):
        (tmp_path / "t").write_bytes(good[:length])
        with pytest.raises(BackupCorrupt, match=r"truncated|too short|checksum|not an rcq backup"):
            verify(tmp_path / "t")


def test_a_newer_format_or_level_is_refused(tmp_path: Path) -> None:
    make_backup(tmp_path / "newer", backup_format=BACKUP_FORMAT + 1)
    with pytest.raises(BackupUnsupported, match="newer rcq"):
        verify(tmp_path / "newer")
    make_backup(tmp_path / "level", feature_level=99)
    with pytest.raises(BackupUnsupported, match="feature level 99"):
        build_snapshot(tmp_path / "level", tmp_path / "snapshot")
    assert not (tmp_path / "snapshot").exists()


def test_a_content_that_does_not_match_its_data_digest_writes_nothing(tmp_path: Path) -> None:
    make_backup(tmp_path / "b", data_digest="0" * 64)
    with pytest.raises(BackupCorrupt, match="data digest"):
        build_snapshot(tmp_path / "b", tmp_path / "snapshot")
    assert list(tmp_path.iterdir()) == [tmp_path / "b"]


def test_a_data_dir_that_holds_something_is_refused_and_left_alone(tmp_path: Path) -> None:
    make_backup(tmp_path / "b")
    header = verify(tmp_path / "b")
    build_snapshot(tmp_path / "b", tmp_path / "snapshot")
    data = tmp_path / "data"
    data.mkdir()
    (data / "raft.wal").write_bytes(b"a node's log")
    with pytest.raises(RestoreRefused, match="not empty"):
        seed_data_dir(tmp_path / "snapshot", data, header, "127.0.0.1:1", ["127.0.0.1:2"])
    assert [p.name for p in data.iterdir()] == ["raft.wal"] and (data / "raft.wal").read_bytes() == b"a node's log"
    seed_data_dir(tmp_path / "snapshot", tmp_path / "fresh", header, "127.0.0.1:1", ["127.0.0.1:2"])
    meta = json.loads((tmp_path / "fresh" / "raft.wal.meta").read_text())
    assert meta["current_term"] == 2 and meta["commit_index"] == 10


def test_the_data_digest_is_the_state_digest_without_the_non_data_keys() -> None:
    meta = {"format": 4, "next_item_id": 5, "now_ms": 9, "last_index": 3, "queues": [("a", 1, 2)],
            "members": [("n", "x", "y")], "outcomes": [], "level": 2}
    assert data_digest(meta, ITEMS) == snapshot_format.digest(data_meta(meta), ITEMS)
    assert data_digest(meta, ITEMS) == data_digest({**meta, "last_index": 99, "members": [], "now_ms": 1}, ITEMS)
    assert data_digest(meta, ITEMS) != data_digest({**meta, "next_item_id": 6}, ITEMS)
