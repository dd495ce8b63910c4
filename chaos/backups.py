"""The ``backup`` nemesis: backups taken while the other faults run, each restored into a scratch
cluster and checked against a history (docs/chaos.md, docs/backup.md).

The workload's history says when each operation was acknowledged, not at which Raft index it
committed, and a backup is the state at one index (a follower's, once it has applied what the
leader had when the backup was asked for): only an index tells which acknowledged operations a
backup must hold. So this nemesis keeps a history of its own, as tests/integration/test_backup.py does: a small **probe** load on
its own queue (``backup-probe``, outside the workload's topology, so neither the workload's drain
nor its checkers see it) — producers, a committing consumer and an aborting one — whose every
acknowledged commit is recorded with its index. Every few seconds it takes a backup with
``rcq backup``'s code (from a follower, through the clients' links, so client faults hit it too),
and restores at most ``restores_max`` of them, each into a new 1-node scratch cluster
(``rcq restore --node-config``), where it checks:

* every probe item whose enqueue was acknowledged at an index at or before the backup's, and not
  dequeued by a commit acknowledged at or before it, is there exactly once (``missing``,
  ``duplicated``);
* no probe item enqueued after the backup's index, or dequeued at or before it, is there
  (``from_after``, ``reappeared``), nor one never sent (``unknown_items``); commits whose outcome
  was unknown, or still in flight when the check began, may go either way;
* in the whole backup file no value is in two places (the workload's values are unique, and a
  move takes an item out as it puts it in): ``duplicated_values``;
* the backup holds every probe commit acknowledged before it was asked for: its index is at or
  after the highest such commit's (``acknowledged_before`` in the ``taken`` line; checked for
  every backup taken, restored or not, by the checker);
* the restore accepted the file (it refuses content that is not the header's data digest), and
  the scratch cluster's identity differs from the backed-up cluster's (at feature level 2). Its
  data digest is recorded (``digest_matches``) but not held to the header's: its leader applies
  the queues' rules at once, and an item whose time to live passed since the backup leaves.

Each backup is a nemesis line ``backup`` (``phase`` ``taken``, with the header's index, term, node
and data digest, or ``failed`` with the error: a backup may fail under faults, that is no
finding), and each restore a line ``backup-restore`` (``phase`` ``checked``, with the counts, at
most 20 offenders of each kind, and ``valid``). These are not fault windows (no start/stop pair).
The ``backups`` checker (chaos.checkers.backups) makes the run invalid when a restore was not.

Must not import: the targets' modules (it sees the cluster through chaos.target), the workload's
modules (chaos.workload, chaos.executor, chaos.generator), the checkers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import NEMESIS_PROCESS
from chaos.target import ChaosTarget
from rcq.backup.fileformat import Header, read_body
from rcq.cli.backup import save_backup
from rcq.client import RcqClient
from rcq.errors import RcqError

PROBE_QUEUE = "backup-probe"
BACKUP_EVERY_S = (5.0, 10.0)
RESTORES_MAX = 3  # a restore starts a scratch cluster: on 2 cores, a few are enough per run
BACKUP_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 120.0
PROBE_PAUSE_S = 0.02  # between a probe worker's operations: a light load beside the workload
SAMPLES_MAX = 20


@dataclass
class ProbeHistory:
    """What the probe's clients were told: values acknowledged with their commit index."""

    enqueued: dict[str, int] = field(default_factory=dict)
    dequeued: dict[str, int] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)  # enqueues whose outcome is not known
    maybe_dequeued: set[str] = field(default_factory=set)  # dequeues whose commit outcome is not known
    in_flight: set[str] = field(default_factory=set)  # sent, not answered yet

    def highest_index(self) -> int:
        """The highest index of a probe commit acknowledged so far (0: none)."""
        return max(max(self.enqueued.values(), default=0), max(self.dequeued.values(), default=0))

    def verdict(self, index: int, restored: list[str]) -> dict[str, Any]:
        """The restored probe items against the history at backup index ``index``."""
        counts = Counter(restored)
        present = set(restored)
        undecided = self.unknown | self.maybe_dequeued | self.in_flight
        missing, from_after, reappeared = [], [], []
        checked = 0
        for value, at in self.enqueued.items():
            if value in undecided:
                continue
            gone_at = self.dequeued.get(value)
            if at <= index and (gone_at is None or gone_at > index):
                checked += 1
                if value not in present:
                    missing.append(value)
            elif at > index and value in present:
                from_after.append(value)
            elif at <= index and gone_at is not None and value in present:
                reappeared.append(value)
        sent = set(self.enqueued) | self.unknown | self.in_flight
        unknown_items = sorted(present - sent)
        duplicated = sorted(v for v, c in counts.items() if c > 1)
        valid = not (missing or from_after or reappeared or unknown_items or duplicated)
        return {"probe_checked": checked, "probe_restored": len(restored), "valid": valid,
                **{name: sorted(values)[:SAMPLES_MAX] for name, values in (
                    ("missing", missing), ("from_after", from_after), ("reappeared", reappeared),
                    ("unknown_items", unknown_items), ("duplicated", duplicated)) if values}}


class BackupNemesis:
    """Runs the probe load and takes, restores and checks backups until ``stop``."""

    def __init__(self, cluster: ChaosTarget, history: Any, rng: random.Random,
                 progress: Callable[[str], None] = lambda _: None, restores_max: int = RESTORES_MAX) -> None:
        self.cluster = cluster
        self.history = history
        self.random = rng
        self.progress = progress
        self.restores_max = restores_max
        self.probe = ProbeHistory()
        self.directory = Path(cluster.base_dir) / "backups"
        self.taken = 0
        self.restored = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        async with RcqClient(self.cluster.client_urls, token=self.cluster.token, request_timeout_s=10.0,
                             retry_timeout_s=10.0) as client:
            workers = [asyncio.create_task(self._producer(client, f"b{i}", stop)) for i in range(2)]
            workers += [asyncio.create_task(self._consumer(client, stop, abort)) for abort in (False, True)]
            try:
                while not await _sleep(stop, self.random.uniform(*BACKUP_EVERY_S)):
                    await self._one_backup(stop)
            finally:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    # ------------------------------------------------------------- the probe load
    async def _producer(self, client: RcqClient, name: str, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            values = [f"{name}-{n + i}" for i in range(3)]
            n += 3
            self.probe.in_flight.update(values)
            try:
                info = await client.enqueue(PROBE_QUEUE, *(v.encode() for v in values))
            except (RcqError, OSError, TimeoutError):
                self.probe.unknown.update(values)
            else:
                for value in values:
                    self.probe.enqueued[value] = info.index
            finally:
                self.probe.in_flight.difference_update(values)
            await asyncio.sleep(PROBE_PAUSE_S)

    async def _consumer(self, client: RcqClient, stop: asyncio.Event, abort: bool) -> None:
        while not stop.is_set():
            values: list[str] = []
            try:
                tx = await client.begin(timeout_s=30)
                values = [v.decode() for v in await tx.dequeue_batch(PROBE_QUEUE, 3)]
                if abort or not values:
                    await tx.abort()
                    await asyncio.sleep(PROBE_PAUSE_S * 5)
                    continue
                self.probe.maybe_dequeued.update(values)  # until the commit's answer says
                info = await tx.commit()
            except (RcqError, OSError, TimeoutError):
                continue  # values stay in maybe_dequeued: a commit whose outcome is not known
            self.probe.maybe_dequeued.difference_update(values)
            for value in values:
                self.probe.dequeued[value] = info.index
            await asyncio.sleep(PROBE_PAUSE_S)

    # ------------------------------------------------------------- backups
    async def _one_backup(self, stop: asyncio.Event) -> None:
        number = self.taken
        self.taken += 1
        path = self.directory / f"backup-{number}.rcqbackup"
        started = time.monotonic()
        acknowledged_before = self.probe.highest_index()  # a backup asked for now must hold it
        try:
            header = await asyncio.wait_for(save_backup(self.cluster.client_urls, path, token=self.cluster.token),
                                            BACKUP_TIMEOUT_S)
        except Exception as exc:  # under faults a backup may fail: recorded, not a finding
            self._line("backup", {"phase": "failed", "number": number, "error": f"{type(exc).__name__}: {exc}"[:300]})
            self.progress(f"nemesis: backup {number} failed: {type(exc).__name__}")
            return
        fields = {key: header[key] for key in ("index", "term", "node_id", "data_digest", "items", "feature_level",
                                               "cluster_id")}
        self._line("backup", {"phase": "taken", "number": number, "path": str(path),
                              "seconds": round(time.monotonic() - started, 3),
                              "acknowledged_before": acknowledged_before, **fields})
        self.progress(f"nemesis: backup {number} at index {header.index} from {header['node_id']}")
        if self.restored >= self.restores_max or stop.is_set():
            path.unlink(missing_ok=True)  # verified by its checksum on the way; not restored
            return
        self.restored += 1
        # The check reads the probe's history as it is when the check begins (in-flight ops undecided).
        try:
            result = await asyncio.wait_for(asyncio.to_thread(self._restore_and_read, path, header), RESTORE_TIMEOUT_S)
            verdict = {**self.probe.verdict(header.index, result.pop("probe")), **result}
            # Not the scratch cluster's digest: its leader applies the queues' rules at once (items
            # whose time to live passed leave for their dead-letter queue), which changes the data.
            # The restore itself refused a file whose content is not the header's data digest.
            verdict["valid"] = verdict["valid"] and result["identity_new"] and not result.get("duplicated_values")
        except Exception as exc:  # the restore itself failed: a finding
            verdict = {"valid": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        self._line("backup-restore", {"phase": "checked", "number": number, "index": header.index, **verdict})
        self.progress(f"nemesis: backup {number} restored: {'valid' if verdict['valid'] else 'INVALID'}")
        if verdict["valid"]:
            path.unlink(missing_ok=True)  # kept only when it shows a problem

    def _restore_and_read(self, path: Path, header: Header) -> dict[str, Any]:
        """Restore ``path`` into a 1-node scratch cluster; its probe items, digest and identity."""
        from rcq.local.cluster import LocalCluster

        duplicated_values = _values_in_two_places(path)
        # Its own temporary directory, removed on close; not a `with` block, which would start it
        # before its data directory is seeded.
        scratch = LocalCluster(1, log_level="WARNING")
        try:
            scratch.restore_from(path)
            scratch.start()
            scratch.wait_for_leader(60.0)
            digest = scratch.data_digest(0)["data_digest"]
            cluster_id = scratch.status(0).get("cluster_id")
            probe = asyncio.run(_drain(scratch.urls, scratch.client_options()))
        finally:
            scratch.close()
        identity_new = header["cluster_id"] is None or (cluster_id is not None and cluster_id != header["cluster_id"])
        return {"probe": probe, "digest_matches": digest == header.data_digest, "identity_new": identity_new,
                "restored_cluster_id": cluster_id,
                **({"duplicated_values": duplicated_values[:SAMPLES_MAX]} if duplicated_values else {})}

    def _line(self, f: str, value: dict[str, Any]) -> None:
        self.history.info(NEMESIS_PROCESS, f, {"nodes": [], **value})


def _values_in_two_places(path: Path) -> list[str]:
    """Values the backup holds more than once, in any queues (streamed: one set of hashes)."""
    _header, _meta, items = read_body(path)
    seen: set[bytes] = set()
    twice: list[str] = []
    for _queue, _item_id, value in items:
        if value in seen:
            twice.append(value.decode(errors="replace"))
        seen.add(value)
    return twice


async def _drain(urls: list[str], options: dict[str, Any]) -> list[str]:
    """Every probe item of the scratch cluster, dequeued and committed."""
    got: list[str] = []
    async with RcqClient(urls, **options) as client:
        while True:
            tx = await client.begin(timeout_s=30)
            batch = await tx.dequeue_batch(PROBE_QUEUE, 200)
            await tx.commit()
            if not batch:
                return got
            got.extend(v.decode() for v in batch)


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
