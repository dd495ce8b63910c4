"""LMDB snapshots: round trips, file layout, and the forking writer's protocol with pysyncobj."""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft import snapshots
from rcq.server.raft.snapshots import ForkingSnapshotWriter, SnapshotError, SnapshotState
from rcq.testing import wait_until
from tests.helpers import FORKED_CHILD_WAIT_S

# What pysyncobj hands the serializer: (last applied entry, previous entry, cluster nodes).
RAFT_DATA = ((b"\x00\x80\x02payload", 41, 3), (b"\x01", 40, 3), frozenset({"127.0.0.1:1", "127.0.0.1:2"}))


@pytest.fixture
def work_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rcq-snapshot-test-") as directory:
        yield Path(directory)


class _Log:
    """Applies commands to a state machine with consecutive indexes."""

    def __init__(self, state_machine: QueueStateMachine) -> None:
        self.state_machine = state_machine
        self.index = 0
        self.now_ms = 1_000

    def commit(self, *transactions: TransactionWrite, key: str | None = None, term: int = 1):
        self.index += 1
        self.now_ms += 10
        batch = CommitBatch(term=term, now_ms=self.now_ms,
                            units=(CommitUnit(transactions=transactions, idempotency_key=key),))
        return self.state_machine.apply(encode(batch), self.index)


def _populated_state_machine() -> QueueStateMachine:
    """Several queues (names that are prefixes of each other), tombstones, outcomes, idempotency keys."""
    state_machine = QueueStateMachine()
    log = _Log(state_machine)
    names = ["a", "a.b", "a-b", "A", "a0", "z_9", "jobs"]
    for round_number in range(3):
        for name in names:
            values = tuple(f"{name}/{round_number}/{i}".encode() for i in range(5))
            log.commit(TransactionWrite(f"enq-{name}-{round_number}", enqueues=((name, values),)),
                       key=f"key-{name}-{round_number}")
    jobs = state_machine.item_ids("jobs")
    # Dequeue from the middle: leaves tombstones behind the head.
    log.commit(TransactionWrite("take-middle", dequeues=(("jobs", tuple(jobs[3:6])),)))
    # A commit rejected whole (item already gone) is an outcome too.
    log.commit(TransactionWrite("take-again", dequeues=(("jobs", (jobs[3],)),)))
    # An atomic move between queues.
    log.commit(TransactionWrite("move", dequeues=(("a", (state_machine.item_ids("a")[0],)),),
                                enqueues=(("a.b", (b"moved",)), ("empty-later", (b"x",)))))
    log.commit(TransactionWrite("drain", dequeues=(("empty-later", tuple(state_machine.item_ids("empty-later"))),)))
    log.commit(TransactionWrite("binary", enqueues=(("bin", (b"\x00\xff" * 50, b"")),)))
    assert state_machine.outcome("take-again").status == "rejected"
    assert state_machine.count("empty-later") == 0
    return state_machine


def test_snapshot_round_trip_restores_the_same_state_and_raft_data(work_dir: Path) -> None:
    original = _populated_state_machine()
    path = work_dir / "snapshot.lmdb"

    info = snapshots.write_snapshot(path, original, RAFT_DATA)
    restored = QueueStateMachine()
    raft_data = snapshots.read_snapshot(path, restored)

    assert info.item_count == sum(original.count(name) for name in original.queue_names())
    assert restored.digest() == original.digest()
    assert raft_data == RAFT_DATA
    # pysyncobj compares these with its journal's tuples: lists would wipe the journal.
    assert type(raft_data) is tuple and type(raft_data[0]) is tuple and type(raft_data[1]) is tuple
    assert snapshots.read_raft_data(path) == RAFT_DATA
    for name in original.queue_names():
        assert restored.item_ids(name) == original.item_ids(name)
        assert restored.queue_stats(name) == original.queue_stats(name)
    assert restored.outcome("take-again") == original.outcome("take-again")
    assert restored.idempotency_key_index("key-jobs-2") == original.idempotency_key_index("key-jobs-2")
    assert restored.last_index == original.last_index


def test_restored_state_machine_applies_further_commands_like_the_original(work_dir: Path) -> None:
    original = _populated_state_machine()
    path = work_dir / "snapshot.lmdb"
    snapshots.write_snapshot(path, original, RAFT_DATA)
    restored = QueueStateMachine()
    snapshots.read_snapshot(path, restored)

    index, now_ms = original.last_index, original.now_ms
    for state_machine in (original, restored):
        log = _Log(state_machine)
        log.index, log.now_ms = index, now_ms
        log.commit(TransactionWrite("after", enqueues=(("jobs", (b"new",)),)))
        log.commit(TransactionWrite("retry", enqueues=(("jobs", (b"dup",)),)), key="key-jobs-0")

    assert restored.digest() == original.digest()
    assert restored.count("jobs") == original.count("jobs")


def test_restore_discards_the_previous_state(work_dir: Path) -> None:
    path = work_dir / "snapshot.lmdb"
    empty = QueueStateMachine()
    snapshots.write_snapshot(path, empty, RAFT_DATA)
    busy = _populated_state_machine()

    snapshots.read_snapshot(path, busy)

    assert busy.digest() == empty.digest()
    assert busy.queue_names() == []


def test_items_are_stored_under_queue_and_big_endian_id_keys(work_dir: Path) -> None:
    original = _populated_state_machine()
    path = work_dir / "snapshot.lmdb"
    snapshots.write_snapshot(path, original, RAFT_DATA)

    env = lmdb.open(str(path), subdir=False, lock=False, readonly=True)
    try:
        with env.begin() as txn:
            keys = [bytes(key) for key, _ in txn.cursor()]
            meta = pickle.loads(txn.get(b"m:meta"))
            first_jobs_id = original.item_ids("jobs")[0]
            value = txn.get(b"i:jobs\x00" + first_jobs_id.to_bytes(8, "big"))
    finally:
        env.close()

    item_keys = [key for key in keys if key.startswith(b"i:")]
    assert keys == sorted(keys)
    assert set(keys) - set(item_keys) == {b"m:meta", b"m:raft"}
    assert len(item_keys) == sum(original.count(name) for name in original.queue_names())
    assert meta == original.snapshot_meta()
    assert value == original.values("jobs", [first_jobs_id])[0]
    assert not os.path.exists(str(path) + "-lock")  # lock=False: one self-contained file


def test_items_out_of_key_order_are_refused(work_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state_machine = _populated_state_machine()
    items = list(state_machine.snapshot_items())
    monkeypatch.setattr(state_machine, "snapshot_items", lambda: iter([items[1], items[0], *items[2:]]))

    with pytest.raises(SnapshotError, match="does not sort after"):
        snapshots.write_snapshot(work_dir / "snapshot.lmdb", state_machine, RAFT_DATA)


def test_reading_a_file_without_raft_data_fails_clearly(work_dir: Path) -> None:
    path = work_dir / "snapshot.lmdb"
    env = lmdb.open(str(path), subdir=False, lock=False)
    env.close()

    with pytest.raises(SnapshotError, match="m:raft"):
        snapshots.read_raft_data(path)
    with pytest.raises(SnapshotError, match="no snapshot"):
        snapshots.read_raft_data(work_dir / "missing.lmdb")


def test_remove_stale_files_deletes_only_interrupted_snapshot_leftovers(work_dir: Path) -> None:
    final = work_dir / "raft.snapshot.lmdb"
    leftovers = [Path(str(final) + suffix) for suffix in (".part", ".tmp", ".1.tmp")]
    for path in [final, *leftovers]:
        path.write_bytes(b"x")

    removed = snapshots.remove_stale_files(final)

    assert sorted(removed) == sorted(str(p) for p in leftovers)
    assert final.exists() and not any(p.exists() for p in leftovers)


# ------------------------------------------------------------- forking writer
def _wait_for_state(writer: ForkingSnapshotWriter) -> SnapshotState:
    """The first state but WRITING the writer reports (in a list: IDLE is 0)."""
    return wait_until(lambda: [state for state in [writer.check()] if state != SnapshotState.WRITING],
                      FORKED_CHILD_WAIT_S, what="the snapshot child to finish", interval_s=0.01)[0]


def test_forking_writer_writes_in_a_child_and_reports_success_once(work_dir: Path) -> None:
    original = _populated_state_machine()
    final = work_dir / "raft.snapshot.lmdb"
    writer = ForkingSnapshotWriter(original, final, threading.Lock())

    assert writer.check() == SnapshotState.IDLE
    writer.serialize(str(final) + ".tmp", RAFT_DATA)
    # pysyncobj's temp name is never created, so pysyncobj trusts only check().
    assert not os.path.exists(str(final) + ".tmp")

    assert _wait_for_state(writer) == SnapshotState.SUCCEEDED
    assert writer.check() == SnapshotState.IDLE
    assert writer.written_count == 1
    assert not os.path.exists(str(final) + ".part")
    restored = QueueStateMachine()
    assert writer.deserialize(str(final)) == RAFT_DATA  # restores the writer's own machine
    assert snapshots.read_snapshot(final, restored) == RAFT_DATA
    assert restored.digest() == original.digest()
    writer.close()


def test_forking_writer_snapshot_is_the_state_at_fork_time(work_dir: Path) -> None:
    state_machine = _populated_state_machine()
    digest_at_fork = state_machine.digest()
    final = work_dir / "raft.snapshot.lmdb"
    writer = ForkingSnapshotWriter(state_machine, final, threading.Lock())

    writer.serialize(str(final) + ".tmp", RAFT_DATA)
    log = _Log(state_machine)
    log.index = state_machine.last_index
    log.commit(TransactionWrite("after-fork", enqueues=(("jobs", (b"late",)),)))

    assert _wait_for_state(writer) == SnapshotState.SUCCEEDED
    restored = QueueStateMachine()
    snapshots.read_snapshot(final, restored)
    assert restored.digest() == digest_at_fork != state_machine.digest()


def test_receiving_a_snapshot_cancels_the_write_in_progress(work_dir: Path) -> None:
    state_machine = QueueStateMachine()
    _Log(state_machine).commit(
        *(TransactionWrite(f"t{i}", enqueues=(("q", (b"v" * 100,) * 2000),)) for i in range(100)))
    final = work_dir / "raft.snapshot.lmdb"
    received = work_dir / "received.lmdb"
    snapshots.write_snapshot(received, _populated_state_machine(), RAFT_DATA)
    writer = ForkingSnapshotWriter(state_machine, final, threading.Lock())
    writer.serialize(str(final) + ".tmp", ((b"", 9, 1), (b"", 8, 1), frozenset()))

    assert writer.deserialize(str(received)) == RAFT_DATA

    # The child's older state must never be renamed over the received one.
    assert writer.check() == SnapshotState.FAILED  # once, so pysyncobj stops waiting
    assert writer.check() == SnapshotState.IDLE
    assert not final.exists() and not os.path.exists(str(final) + ".part")
    assert state_machine.digest() == _populated_state_machine().digest()
    assert writer.loaded_count == 1


def test_a_failed_fork_is_reported_as_failed_once(work_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise OSError("no more processes")

    writer = ForkingSnapshotWriter(QueueStateMachine(), work_dir / "raft.snapshot.lmdb", threading.Lock())
    monkeypatch.setattr(os, "fork", no_fork)

    writer.serialize(str(work_dir / "raft.snapshot.lmdb.tmp"), RAFT_DATA)

    assert writer.check() == SnapshotState.FAILED
    assert writer.check() == SnapshotState.IDLE


def test_a_child_that_fails_is_reported_as_failed(work_dir: Path) -> None:
    state_machine = _populated_state_machine()
    missing_dir = work_dir / "gone" / "raft.snapshot.lmdb"
    writer = ForkingSnapshotWriter(state_machine, missing_dir, threading.Lock())

    writer.serialize(str(missing_dir) + ".tmp", RAFT_DATA)

    assert _wait_for_state(writer) == SnapshotState.FAILED
    assert writer.written_count == 0


def test_close_waits_for_the_child_and_leaves_no_partial_file(work_dir: Path) -> None:
    final = work_dir / "raft.snapshot.lmdb"
    writer = ForkingSnapshotWriter(_populated_state_machine(), final, threading.Lock())
    writer.serialize(str(final) + ".tmp", RAFT_DATA)
    pid = writer._child_pid

    writer.close(timeout_s=30.0)

    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left
    assert not os.path.exists(str(final) + ".part")
    assert not final.exists()  # never renamed: pysyncobj did not trim its journal for it
