"""The backup file: a header, the replicated state at one Raft index, and a SHA-256 over the whole.

Layout (docs/backup.md)::

    magic            b"RCQ-BACKUP\\n\\x00" (12 bytes)
    header length    u32, big-endian
    header           JSON (UTF-8): backup_format, rcq_version, feature_level, cluster_id, index, term,
                     taken_at, data_digest, node_id, items, item_bytes, queues
    body             records: kind (1 byte), payload length (u32, big-endian), payload
                       b"M"  the state's meta (everything but the items: queues and their settings and
                             totals, item metadata, remembered outcomes and idempotency keys), a pickle
                             of plain values, read back with no classes allowed
                       b"I"  a chunk of items, each: queue name length (u16), name, item id (u64),
                             value length (u32), value; in (queue, id) order, as snapshots hold them
                       b"E"  the end: the number of items (u64)
    trailer          b"RCQ-SHA256" and the SHA-256 (32 bytes) of every byte before the trailer

A reader checks the trailer over the whole file before it believes anything in it
(:func:`verify`): a truncated file, or one with any byte changed, is refused with a clear
message and nothing is restored. A backup of a newer ``backup_format`` than this code reads is
refused too (:class:`BackupUnsupported`).

The body is written by a node (a forked child, from a copy-on-write image of its state), and the
header by the node once the body is complete; both ends stream it in bounded memory.

Must not import: rcq.server, pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from rcq.errors import RcqError

MAGIC = b"RCQ-BACKUP\n\x00"
TRAILER_MAGIC = b"RCQ-SHA256"
TRAILER_BYTES = len(TRAILER_MAGIC) + 32
BACKUP_FORMAT = 1  # the newest written and read
BACKUP_FORMATS_READ = (1,)
HEADER_BYTES_MAX = 1 << 20
RECORD_BYTES_MAX = 1 << 31  # a meta record of a full outcome table is large, but not this large
CHUNK_BYTES = 1 << 20  # items are grouped into records of about this size
PICKLE_PROTOCOL = 5

KIND_META = b"M"
KIND_ITEMS = b"I"
KIND_END = b"E"

_LENGTH = struct.Struct(">I")
_RECORD = struct.Struct(">cI")
_NAME = struct.Struct(">H")
_ITEM = struct.Struct(">QI")
_COUNT = struct.Struct(">Q")

HEADER_FIELDS = ("backup_format", "rcq_version", "feature_level", "cluster_id", "index", "term", "taken_at",
                 "data_digest", "node_id", "items", "item_bytes", "queues")


class BackupCorrupt(RcqError):
    """The backup file is truncated or damaged."""

    code = "backup_corrupt"
    http_status = 422


class BackupUnsupported(RcqError):
    """The backup file was made by a newer rcq, in a format this one cannot read."""

    code = "backup_unsupported"
    http_status = 422


@dataclass(frozen=True, slots=True)
class Header:
    """What a backup says about itself (the JSON header)."""

    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    @property
    def index(self) -> int:
        return int(self.fields["index"])

    @property
    def term(self) -> int:
        return int(self.fields["term"])

    @property
    def data_digest(self) -> str:
        return str(self.fields["data_digest"])


# ------------------------------------------------------------------ writing
def encode_prefix(header: dict[str, Any]) -> bytes:
    """The magic and the header, as they start the file."""
    missing = [name for name in HEADER_FIELDS if name not in header]
    if missing:
        raise ValueError(f"a backup header needs {missing}")
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(len(raw)) + raw


def encode_trailer(sha256: bytes) -> bytes:
    return TRAILER_MAGIC + sha256


class BodyWriter:
    """Writes the body records to a binary file: the meta, then items in order, then the end."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._chunk = io.BytesIO()
        self.items = 0
        self.item_bytes = 0
        self.queues = 0
        self._queue: str | None = None

    def meta(self, meta: dict[str, Any]) -> None:
        self._record(KIND_META, pickle.dumps(meta, protocol=PICKLE_PROTOCOL))

    def item(self, queue: str, item_id: int, value: bytes) -> None:
        name = queue.encode()
        if queue != self._queue:
            self._queue = queue
            self.queues += 1
        chunk = self._chunk
        chunk.write(_NAME.pack(len(name)))
        chunk.write(name)
        chunk.write(_ITEM.pack(item_id, len(value)))
        chunk.write(value)
        self.items += 1
        self.item_bytes += len(value)
        if chunk.tell() >= CHUNK_BYTES:
            self._flush_items()

    def end(self) -> None:
        self._flush_items()
        self._record(KIND_END, _COUNT.pack(self.items))

    def _flush_items(self) -> None:
        if self._chunk.tell():
            self._record(KIND_ITEMS, self._chunk.getvalue())
            self._chunk = io.BytesIO()

    def _record(self, kind: bytes, payload: bytes) -> None:
        self._file.write(_RECORD.pack(kind, len(payload)))
        self._file.write(payload)


# ------------------------------------------------------------------ reading
def verify(path: str | os.PathLike[str]) -> Header:
    """Check the whole file against its trailer and read its header; BackupCorrupt or BackupUnsupported."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        file = open(path, "rb")  # closed below
    except OSError as exc:
        raise BackupCorrupt(f"cannot read the backup {path}: {exc.strerror}") from exc
    with file:
        if size < len(MAGIC) + _LENGTH.size + TRAILER_BYTES:
            raise BackupCorrupt(f"{path} is {size} bytes: too short to be an rcq backup (truncated?)")
        if file.read(len(MAGIC)) != MAGIC:
            raise BackupCorrupt(f"{path} is not an rcq backup (its first bytes are not the backup magic)")
        file.seek(0)
        digest = hashlib.sha256()
        remaining = size - TRAILER_BYTES
        while remaining:
            block = file.read(min(CHUNK_BYTES, remaining))
            if not block:
                raise BackupCorrupt(f"{path} changed while it was read")
            digest.update(block)
            remaining -= len(block)
        trailer = file.read(TRAILER_BYTES)
    if trailer[:len(TRAILER_MAGIC)] != TRAILER_MAGIC:
        raise BackupCorrupt(f"{path} has no checksum trailer at its end: the file is truncated or damaged")
    if trailer[len(TRAILER_MAGIC):] != digest.digest():
        raise BackupCorrupt(f"{path} does not match its SHA-256 checksum: the file is damaged or truncated")
    with open(path, "rb") as file:
        return read_header(file, path)


def read_header(file: BinaryIO, path: str = "the backup") -> Header:
    """The header at the start of ``file`` (left positioned at the body)."""
    if file.read(len(MAGIC)) != MAGIC:
        raise BackupCorrupt(f"{path} is not an rcq backup")
    raw_length = file.read(_LENGTH.size)
    if len(raw_length) < _LENGTH.size:
        raise BackupCorrupt(f"{path} ends inside its header")
    (length,) = _LENGTH.unpack(raw_length)
    if length > HEADER_BYTES_MAX:
        raise BackupCorrupt(f"{path} declares a {length}-byte header: damaged")
    raw = file.read(length)
    try:
        fields = json.loads(raw)
    except ValueError as exc:
        raise BackupCorrupt(f"{path} has an unreadable header: {exc}") from exc
    if not isinstance(fields, dict):
        raise BackupCorrupt(f"{path} has an unreadable header")
    version = fields.get("backup_format")
    if isinstance(version, int) and version > max(BACKUP_FORMATS_READ):
        raise BackupUnsupported(
            f"{path} is backup format {version}, made by rcq {fields.get('rcq_version')}; this rcq reads "
            f"backup formats up to {max(BACKUP_FORMATS_READ)}: restore it with a newer rcq")
    if version not in BACKUP_FORMATS_READ or any(name not in fields for name in HEADER_FIELDS):
        raise BackupCorrupt(f"{path} has a header without the fields of backup format {version!r}")
    return Header(fields)


def read_body(path: str | os.PathLike[str]) -> tuple[Header, dict[str, Any], Iterator[tuple[str, int, bytes]]]:
    """The header, the meta and an iterator of the items (queue, id, value) of a file :func:`verify`
    accepted. The iterator holds the file open until exhausted; it checks the end record."""
    path = os.fspath(path)
    file = open(path, "rb")  # the items iterator closes it
    try:
        header = read_header(file, path)
        kind, payload = _next_record(file, path)
        if kind != KIND_META:
            raise BackupCorrupt(f"{path}: the body does not start with the state's meta")
        meta = _SafeUnpickler(io.BytesIO(payload)).load()
        if not isinstance(meta, dict):
            raise BackupCorrupt(f"{path}: the meta record is not a mapping")
    except BaseException:
        file.close()
        raise
    return header, meta, _Items(file, _items(file, path))


class _Items:
    """The items of a body; ``close()`` closes the file even before the first item is read (a
    generator's close does nothing until it has started)."""

    def __init__(self, file: BinaryIO, items: Generator[tuple[str, int, bytes], None, None]) -> None:
        self._file = file
        self._items = items

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> tuple[str, int, bytes]:
        return next(self._items)

    def close(self) -> None:
        self._items.close()
        self._file.close()


def _items(file: BinaryIO, path: str) -> Generator[tuple[str, int, bytes], None, None]:
    count = 0
    with file:
        while True:
            kind, payload = _next_record(file, path)
            if kind == KIND_END:
                (declared,) = _COUNT.unpack(payload)
                if declared != count:
                    raise BackupCorrupt(f"{path}: {count} items read, the end record says {declared}")
                return
            if kind != KIND_ITEMS:
                raise BackupCorrupt(f"{path}: unexpected record {kind!r}")
            view = memoryview(payload)
            offset = 0
            while offset < len(view):
                (name_length,) = _NAME.unpack_from(view, offset)
                offset += _NAME.size
                name = bytes(view[offset:offset + name_length]).decode()
                offset += name_length
                item_id, value_length = _ITEM.unpack_from(view, offset)
                offset += _ITEM.size
                value = bytes(view[offset:offset + value_length])
                offset += value_length
                if offset > len(view):
                    raise BackupCorrupt(f"{path}: an item runs past its record")
                count += 1
                yield name, item_id, value


def _next_record(file: BinaryIO, path: str) -> tuple[bytes, bytes]:
    head = file.read(_RECORD.size)
    if len(head) < _RECORD.size:
        raise BackupCorrupt(f"{path}: the body ends before its end record (truncated)")
    kind, length = _RECORD.unpack(head)
    if length > RECORD_BYTES_MAX:
        raise BackupCorrupt(f"{path}: a record declares {length} bytes: damaged")
    payload = file.read(length)
    if len(payload) < length:
        raise BackupCorrupt(f"{path}: a record is cut short (truncated)")
    return kind, payload


class _SafeUnpickler(pickle.Unpickler):
    """Plain values only (dicts, lists, tuples, str, bytes, numbers, None): no class is ever loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise BackupCorrupt(f"the backup's meta names {module}.{name}; a backup holds plain values only")
