"""A backup's body and the data digest, written by a child forked from the node at one applied index.

A backup must be the state at ONE applied Raft index, and taking it must neither stop the
applies (a big state takes seconds to write: docs/raft-hazards.md, H9) nor build the state's copy
in the node's heap. So, as snapshots and digests are (:mod:`rcq.server.raft.digest`), the state
lock is held only for ``os.fork()``; the child writes the body of the backup file
(:class:`rcq.backup.fileformat.BodyWriter`) from its copy-on-write image to a file in the node's
data directory, hashes the data digest of the same state on the way, answers one JSON line on a
pipe and exits. The node then streams that file (``rcq.server.http.backup_routes``) and deletes it.

**The data digest** hashes what a backup restores: queues, their settings and totals, items and
their metadata (dead-letter records included), the remembered outcomes and idempotency keys, the
next item id, and the partition directory's partitions and placements. It leaves out what
belongs to one cluster and not to its data: the Raft index and term, the directory of members,
the feature level and the cluster's identity (``NON_DATA_KEYS``), the ports the partition
directory records for each node, and the state's clock, which every entry moves (a new leader's
barrier too: a restored cluster's first entries would otherwise change its digest before anyone
wrote). A cluster restored from a backup, of other nodes, with a new identity, therefore has the
backup's data digest. It is the hash ``snapshot_format.digest`` computes, over the meta without
those (:class:`DataDigest`, fed item by item).

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rcq.backup.fileformat import BodyWriter
from rcq.errors import Unavailable
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.digest import ChildCancelled, ChildTimeout, describe_status, fork_child, read_answer_line, reap

NON_DATA_KEYS = frozenset({"format", "last_index", "barrier_term", "members", "level", "level_writer",
                           "cluster_id", "now_ms"})
WRITE_BUFFER_BYTES = 1 << 20

# Runs ``reader(state machine)`` with the state lock held (the replicator's ``read``).
StateReader = Callable[[Callable[[QueueStateMachine], Any]], Any]


def data_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The meta without what is not data (NON_DATA_KEYS, and the ports the partition directory
    records for each node: where a cluster's nodes listen, as its members are), key order kept."""
    data = {key: value for key, value in meta.items() if key not in NON_DATA_KEYS}
    directory = data.get("directory")
    if isinstance(directory, dict) and "node_ports" in directory:
        data["directory"] = {key: value for key, value in directory.items() if key != "node_ports"}
    return data


class DataDigest:
    """The data digest, fed item by item (so that one pass over the items can also write them).

    The same hash as ``snapshot_format.digest`` of the meta without NON_DATA_KEYS (a unit test
    holds the two together)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self._hash = hashlib.sha256()
        for key, value in data_meta(meta).items():
            self._hash.update(repr((key, value)).encode())

    def add(self, queue_name: str, item_id: int, value: bytes) -> None:
        self._hash.update(repr((queue_name, item_id, len(value))).encode())
        self._hash.update(value)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def data_digest(meta: dict[str, Any], items: Iterable[tuple[str, int, bytes]]) -> str:
    """The data digest of a snapshot's content (meta and items as the state machine encodes them)."""
    digest = DataDigest(meta)
    for queue_name, item_id, value in items:
        digest.add(queue_name, item_id, value)
    return digest.hexdigest()


def digested(items: Iterable[tuple[str, int, bytes]], digest: DataDigest) -> Iterator[tuple[str, int, bytes]]:
    """``items`` passed on unchanged, each added to ``digest`` on the way."""
    for queue_name, item_id, value in items:
        digest.add(queue_name, item_id, value)
        yield queue_name, item_id, value


def state_facts(state_machine: QueueStateMachine, meta: dict[str, Any]) -> dict[str, Any]:
    """What a backup header says of the state beside its digest."""
    return {"index": state_machine.last_index, "term": state_machine.barrier_term,
            "feature_level": state_machine.level, "cluster_id": meta.get("cluster_id")}


def write_body(state_machine: QueueStateMachine, path: str) -> dict[str, Any]:
    """Write the backup body of the state to ``path``; its facts and data digest (runs in the child)."""
    meta = state_machine.snapshot_meta()
    with open(path, "wb", buffering=WRITE_BUFFER_BYTES) as file:
        writer = BodyWriter(file)
        writer.meta(meta)

        digest = DataDigest(meta)
        for queue, item_id, value in digested(state_machine.snapshot_items(), digest):
            writer.item(queue, item_id, value)
        writer.end()
        file.flush()
        os.fsync(file.fileno())  # ENOSPC surfaces here at the latest, not later as a short file
    return {**state_facts(state_machine, meta), "data_digest": digest.hexdigest(), "items": writer.items,
            "item_bytes": writer.item_bytes, "queues": writer.queues}


def digest_only(state_machine: QueueStateMachine) -> dict[str, Any]:
    """The data digest and index of the state (runs in the child)."""
    meta = state_machine.snapshot_meta()
    return {"data_digest": data_digest(meta, state_machine.snapshot_items()), "index": state_machine.last_index}


def run_forked(read: StateReader, body: Callable[[QueueStateMachine], dict[str, Any]], timeout_s: float,
               cancel: threading.Event | None = None, label: str = "backup") -> dict[str, Any]:
    """``body(state machine)`` in a child forked while the state lock is held; its JSON answer.

    Blocking: call it in a worker thread. Unavailable when the fork fails, the child dies or fails
    (its error is on the node's stderr), or it does not answer within ``timeout_s`` or ``cancel``
    is set (it is killed). The child is reaped in every case."""
    read_fd, write_fd = os.pipe()
    try:
        def fork_now(state_machine: QueueStateMachine) -> int:
            return fork_child(lambda: _answer(write_fd, body(state_machine)), keep_fds=(write_fd,), label=label)

        try:
            pid = int(read(fork_now))
        except OSError as exc:
            raise Unavailable(f"cannot fork to take the {label}: {exc}") from exc
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)
    try:
        answer = read_answer_line(read_fd, time.monotonic() + timeout_s, cancel)
    except BaseException as exc:
        reap(pid, 0.0, kill_first=True)
        if isinstance(exc, ChildTimeout):
            raise Unavailable("the backup child gave no answer in time; it was killed") from None
        if isinstance(exc, ChildCancelled):
            raise Unavailable("the backup was cancelled: the node is stopping") from None
        raise
    finally:
        os.close(read_fd)
    status = reap(pid, 5.0)
    if answer is None:
        raise Unavailable(f"the {label} child {pid} {describe_status(status)} without an answer "
                          "(its error, if any, is in the node's log)")
    try:
        parsed = json.loads(answer)
    except ValueError:
        raise Unavailable(f"the {label} child {pid} answered {answer[:100]!r}") from None
    if not isinstance(parsed, dict):
        raise Unavailable(f"the {label} child {pid} answered {answer[:100]!r}")
    return parsed


def _answer(write_fd: int, answer: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    line = (json.dumps(answer, separators=(",", ":")) + "\n").encode()
    while line:
        line = line[os.write(write_fd, line):]


def remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
