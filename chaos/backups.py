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

**After the heal**, when no backup was restored and checked under the faults (on a loaded machine
every one taken may fail), the runner has the nemesis take one more (``after_heal`` in its line),
restored and checked the same way: a run always checks a restore, or says why it could not.

**With partitions** (``--partitions``), the probe has a queue in each partition there is when the
nemesis starts (``backup-probe-<name>``, placed there), and every backup is a set (``rcq backup``
of a cluster with partitions: one part per partition, each at its own index). The ``taken`` line
carries each part's index and the highest probe commit of that partition acknowledged before the
set was asked for (``parts``); a set is restored into a scratch cluster with the same node ids and
partitions (at most SET_RESTORES_MAX per run: it runs every partition's processes), and each
partition's probe items are checked against that partition's history at its part's index. The
scratch cluster's combined digest is recorded (``digest_matches``) as for one file.

Must not import: the targets' modules (it sees the cluster through chaos.target), the workload's
modules (chaos.workload, chaos.executor, chaos.generator), the checkers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import NEMESIS_PROCESS
from chaos.target import ChaosTarget
from rcq.backup.backup_set import P0, BackupSet, combined_digest, partitions_room
from rcq.backup.fileformat import Header, read_body
from rcq.cli.backup import save_backup
from rcq.cli.cluster_backup import list_partitions, save_cluster_backup
from rcq.client import RcqClient
from rcq.errors import RcqError

PROBE_QUEUE = "backup-probe"
BACKUP_EVERY_S = (5.0, 10.0)
RESTORES_MAX = 3  # a restore starts a scratch cluster: on 2 cores, a few are enough per run
SET_RESTORES_MAX = 2  # a set's scratch cluster runs every partition's processes too
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


def probe_queue(partition: str) -> str:
    """The probe's queue in ``partition`` (p0's has the name it always had)."""
    return PROBE_QUEUE if partition == P0 else f"{PROBE_QUEUE}-{partition}"


class BackupNemesis:
    """Runs the probe load and takes, restores and checks backups until ``stop``."""

    def __init__(self, cluster: ChaosTarget, history: Any, rng: random.Random,
                 progress: Callable[[str], None] = lambda _: None, restores_max: int = RESTORES_MAX) -> None:
        self.cluster = cluster
        self.history = history
        self.random = rng
        self.progress = progress
        self.restores_max = restores_max
        self.probes: dict[str, ProbeHistory] = {P0: ProbeHistory()}  # partition -> its probe's history
        self.directory = Path(cluster.base_dir) / "backups"
        self.taken = 0
        self.restored = 0

    @property
    def probe(self) -> ProbeHistory:
        """p0's probe (a cluster without partitions has only it)."""
        return self.probes[P0]

    async def run(self, stop: asyncio.Event) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        async with RcqClient(self.cluster.client_urls, token=self.cluster.token, request_timeout_s=10.0,
                             retry_timeout_s=10.0) as client:
            # With partitions, a probe queue in each one there is now: the parts of a set are each
            # at their own index, and each is checked against its own probe's history.
            rows = await list_partitions(self.cluster.client_urls, self.cluster.token) or []
            for name in sorted(row["name"] for row in rows if row["name"] != P0):
                await client.configure_queue(probe_queue(name), partitions=[name])
                self.probes[name] = ProbeHistory()
            per_queue = 2 if len(self.probes) == 1 else 1
            workers = [asyncio.create_task(self._producer(client, name, f"b{i}", stop))
                       for name in self.probes for i in range(per_queue)]
            workers += [asyncio.create_task(self._consumer(client, name, stop, abort))
                        for name in self.probes for abort in (False, True)]
            try:
                while not await _sleep(stop, self.random.uniform(*BACKUP_EVERY_S)):
                    await self._one_backup(stop)
            finally:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    async def after_heal(self) -> None:
        """One more backup, restored and checked, when none was under the faults (the probe load
        has stopped: its history is final but for outcomes it never learnt)."""
        if not self.restored and self.probes:
            self.progress("nemesis: no backup restored under the faults: one more after the heal")
            await self._one_backup(asyncio.Event(), after_heal=True)

    # ------------------------------------------------------------- the probe load
    async def _producer(self, client: RcqClient, partition: str, name: str, stop: asyncio.Event) -> None:
        probe = self.probes[partition]
        n = 0
        while not stop.is_set():
            values = [f"{partition}-{name}-{n + i}" for i in range(3)]
            n += 3
            probe.in_flight.update(values)
            try:
                info = await client.enqueue(probe_queue(partition), *(v.encode() for v in values))
            except (RcqError, OSError, TimeoutError, asyncio.CancelledError) as exc:
                probe.unknown.update(values)  # cancelled at the stop too: the node may commit it all the same
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                for value in values:
                    probe.enqueued[value] = info.index
            finally:
                probe.in_flight.difference_update(values)
            await asyncio.sleep(PROBE_PAUSE_S)

    async def _consumer(self, client: RcqClient, partition: str, stop: asyncio.Event, abort: bool) -> None:
        probe = self.probes[partition]
        while not stop.is_set():
            values: list[str] = []
            try:
                tx = await client.begin(timeout_s=30)
                values = [v.decode() for v in await tx.dequeue_batch(probe_queue(partition), 3)]
                if abort or not values:
                    await tx.abort()
                    await asyncio.sleep(PROBE_PAUSE_S * 5)
                    continue
                probe.maybe_dequeued.update(values)  # until the commit's answer says
                info = await tx.commit()
            except (RcqError, OSError, TimeoutError):
                continue  # values stay in maybe_dequeued: a commit whose outcome is not known
            probe.maybe_dequeued.difference_update(values)
            for value in values:
                probe.dequeued[value] = info.index
            await asyncio.sleep(PROBE_PAUSE_S)

    # ------------------------------------------------------------- backups
    async def _one_backup(self, stop: asyncio.Event, after_heal: bool = False) -> None:
        if len(self.probes) > 1:
            await self._one_set(stop, after_heal)
            return
        number = self.taken
        self.taken += 1
        path = self.directory / f"backup-{number}.rcqbackup"
        started = time.monotonic()
        acknowledged_before = self.probe.highest_index()  # a backup asked for now must hold it
        try:
            header = await asyncio.wait_for(save_backup(self.cluster.client_urls, path, token=self.cluster.token),
                                            BACKUP_TIMEOUT_S)
        except Exception as exc:  # under faults a backup may fail: recorded, not a finding
            self._line("backup", {"phase": "failed", "number": number, "error": f"{type(exc).__name__}: {exc}"[:300],
                                  **({"after_heal": True} if after_heal else {})})
            self.progress(f"nemesis: backup {number} failed: {type(exc).__name__}")
            return
        fields = {key: header[key] for key in ("index", "term", "node_id", "data_digest", "items", "feature_level",
                                               "cluster_id")}
        self._line("backup", {"phase": "taken", "number": number, "path": str(path),
                              "seconds": round(time.monotonic() - started, 3),
                              "acknowledged_before": acknowledged_before, **fields,
                              **({"after_heal": True} if after_heal else {})})
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

    # ------------------------------------------------------------- backup sets
    async def _one_set(self, stop: asyncio.Event, after_heal: bool = False) -> None:
        """A backup set of every partition; each part checked against its own probe's history."""
        number = self.taken
        self.taken += 1
        path = self.directory / f"backup-{number}.rcqset"
        started = time.monotonic()
        before = {name: probe.highest_index() for name, probe in self.probes.items()}
        try:
            backup_set = await asyncio.wait_for(save_cluster_backup(self.cluster.client_urls, path,
                                                                    token=self.cluster.token), BACKUP_TIMEOUT_S)
        except Exception as exc:  # under faults a backup may fail: recorded, not a finding
            self._line("backup", {"phase": "failed", "number": number, "error": f"{type(exc).__name__}: {exc}"[:300],
                                  **({"after_heal": True} if after_heal else {})})
            self.progress(f"nemesis: backup set {number} failed: {type(exc).__name__}")
            return
        parts = [{"partition": part.name, "index": part.header.index, "term": part.header.term,
                  "node_id": part.header["node_id"], "data_digest": part.header.data_digest,
                  "items": part.header["items"], "acknowledged_before": before.get(part.name, 0)}
                 for part in backup_set.parts]
        p0 = backup_set.p0.header
        self._line("backup", {"phase": "taken", "number": number, "path": str(path),
                              "seconds": round(time.monotonic() - started, 3), "acknowledged_before": before[P0],
                              "index": p0.index, "term": p0.term, "node_id": p0["node_id"],
                              "data_digest": p0.data_digest, "items": backup_set.items,
                              "feature_level": p0["feature_level"], "cluster_id": p0["cluster_id"],
                              "combined_digest": backup_set.combined_digest, "parts": parts,
                              **({"after_heal": True} if after_heal else {})})
        self.progress(f"nemesis: backup set {number}: " + ", ".join(f"{p['partition']}@{p['index']}" for p in parts))
        if self.restored >= min(self.restores_max, SET_RESTORES_MAX) or stop.is_set():
            shutil.rmtree(path, ignore_errors=True)  # every part verified on the way; not restored
            return
        self.restored += 1
        try:
            result = await asyncio.wait_for(asyncio.to_thread(self._restore_set, backup_set), RESTORE_TIMEOUT_S)
            indexes = {part.name: part.header.index for part in backup_set.parts}
            verdicts = {name: self.probes[name].verdict(indexes[name], probe)
                        for name, probe in result.pop("probes").items()}
            valid = all(v["valid"] for v in verdicts.values()) and result["identity_new"] \
                and not result.get("duplicated_values")
            verdict = {"valid": valid, "probe_checked": sum(v["probe_checked"] for v in verdicts.values()),
                       "partitions": verdicts, **result}
        except Exception as exc:  # the restore itself failed: a finding
            verdict = {"valid": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        self._line("backup-restore", {"phase": "checked", "number": number, "index": p0.index, **verdict})
        self.progress(f"nemesis: backup set {number} restored: {'valid' if verdict['valid'] else 'INVALID'}")
        if verdict["valid"]:
            shutil.rmtree(path, ignore_errors=True)  # kept only when it shows a problem

    def _restore_set(self, backup_set: BackupSet) -> dict[str, Any]:
        """Restore a set into a scratch cluster with the same node ids and partitions; each probe's
        items, the digests and the identity."""
        from rcq.local.cluster import LocalCluster

        duplicated_values = [v for part in backup_set.parts for v in _values_in_two_places(part.path)]
        members = {m for part in backup_set.parts for m in part.members}
        nodes = max([len(self.cluster.nodes)] + [int(m.rsplit("-", 1)[1]) + 1 for m in members])
        scratch = LocalCluster(nodes, log_level="WARNING", partitions_max=partitions_room(backup_set))
        try:
            scratch.restore_from(backup_set.path)
            scratch.start()
            scratch.wait_for_leader(60.0)
            rows = scratch.wait_partitions_led([part.name for part in backup_set.parts], 60.0)
            digests = {row["name"]: scratch.poll_json((row["leader_url"] if row["name"] != P0 else scratch.url(0))
                                                      + "/v1/cluster/data-digest")["data_digest"] for row in rows}
            cluster_id = scratch.status(0).get("cluster_id")
            probes = {name: asyncio.run(_drain(scratch.urls, scratch.client_options(), probe_queue(name)))
                      for name in self.probes if backup_set.part(name) is not None}
        finally:
            scratch.close()
        header = backup_set.p0.header
        identity_new = header["cluster_id"] is None or (cluster_id is not None and cluster_id != header["cluster_id"])
        return {"probes": probes, "identity_new": identity_new, "restored_cluster_id": cluster_id,
                "digest_matches": combined_digest(digests) == backup_set.combined_digest,
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


async def _drain(urls: list[str], options: dict[str, Any], queue: str = PROBE_QUEUE) -> list[str]:
    """Every item of the scratch cluster's probe ``queue``, dequeued and committed."""
    got: list[str] = []
    async with RcqClient(urls, **options) as client:
        while True:
            tx = await client.begin(timeout_s=30)
            batch = await tx.dequeue_batch(queue, 200)
            await tx.commit()
            if not batch:
                return got
            got.extend(v.decode() for v in batch)


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
