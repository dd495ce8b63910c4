"""The partitions one node hosts: kept running as the directory in p0's state says.

A :class:`PartitionHost` runs in the node's process (p0's) when the node has ``partition_ports``.
Every ``poll_s`` it reads the directory (a copy, under the replicator's lock) and wants, of its
:class:`~rcq.server.partitions.supervisor.Supervisor`, one child per partition this node is a
member of whose members all have their ports recorded: ``rcq serve`` with the partition's
configuration (:func:`rcq.server.partitions.ports.partition_config`) in a private file,
``<data_dir>/partitions/<name>.json``, its output in ``<name>.log`` beside it. A configuration
that changes (this node's ports, its secrets) restarts its child, but not a change of the other
members: a partition process takes its peers from its configuration only the first time it starts
(then from its log, where p0's controller changes its members: docs/membership.md), so the file
is rewritten for the day its data is rebuilt and the process runs on. Nor does the number of
partitions its static share of the memory budget is split between (``storage_share_partitions``,
read at its next start: docs/partitions.md, "Memory budget"). A partition gone from the
directory, or no longer naming this node, stops it, and its data (``<name>.<number>``) is
removed once its process has stopped: a node that joins a partition again starts empty and
catches up. The node stops them all before it stops itself.

Every node reads the directory from its own replica of p0, so a follower starts its partitions as
soon as it has applied the entry, and keeps them running while p0 has no leader.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from rcq.private_files import write_private
from rcq.server.config import NodeConfig
from rcq.server.core.directory import Directory
from rcq.server.partitions.ports import (
    PARTITIONS_DIR,
    PartitionPortsExhausted,
    data_dir_name,
    member_ports,
    partition_config,
)
from rcq.server.partitions.proc_stats import usage
from rcq.server.partitions.supervisor import ChildSpec, Supervisor
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)

POLL_S = 0.5


class PartitionHost:
    def __init__(self, config: NodeConfig, replicator: Replicator, supervisor: Supervisor | None = None,
                 poll_s: float = POLL_S) -> None:
        self._config = config
        self._replicator = replicator
        self._supervisor = supervisor or Supervisor()
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._waiting: set[str] = set()  # partitions waiting for a member's ports (logged once)

    @property
    def directory_path(self) -> Path:
        return self._config.data_dir / PARTITIONS_DIR

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep(), name="rcq-partition-host")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._supervisor.close()

    def status(self) -> dict[str, dict[str, object]]:
        """Each hosted partition's process: pid, starts, restarts, last exit, and while it runs its
        CPU seconds and resident bytes (``cpu_s``, ``rss_bytes``; None elsewhere)."""
        status = self._supervisor.status()
        for state in status.values():
            pid = state.get("pid")
            used = usage(pid) if isinstance(pid, int) else None
            state["cpu_s"], state["rss_bytes"] = (round(used[0], 3), used[1]) if used is not None else (None, None)
        return status

    async def _keep(self) -> None:
        while True:
            try:
                directory = self._replicator.read(lambda sm: sm.directory.copy())
                await self._supervisor.want(self.wanted(directory))
                self.remove_deleted(directory)
            except Exception:  # a bug here must not stop the partitions from being kept
                log.exception("keeping this node's partitions failed")
            await asyncio.sleep(self._poll_s)

    def remove_deleted(self, directory: Directory) -> list[Path]:
        """Remove the data of partitions deleted from ``directory``, or no longer naming this node
        (their processes stopped by :meth:`Supervisor.want` just before): a folder
        ``<name>.<number>`` whose number the directory has given out (below its next number) and
        that no partition of this node has now. A replica that has not yet applied a partition's
        creation has a lower next number, so it never takes a live partition's data for a deleted
        one's. The removed folders."""
        removed: list[Path] = []
        live = {data_dir_name(p.name, p.number) for p in directory.partitions.values()
                if self._config.node_id in p.members}
        if not self.directory_path.is_dir():
            return removed
        for folder in sorted(self.directory_path.iterdir()):
            name, dot, number = folder.name.rpartition(".")
            if not (folder.is_dir() and dot and name and number.isdigit()) or folder.name in live:
                continue
            if int(number) >= directory.next_number:
                continue
            shutil.rmtree(folder)
            gone = "deleted partition" if name not in directory.partitions else "partition, no longer a member of"
            log.info("removed the data of %s %s (number %s)", gone, name, number)
            removed.append(folder)
        return removed

    def wanted(self, directory: Directory) -> dict[str, ChildSpec]:
        """The children this node should run for ``directory`` (their config files written)."""
        specs: dict[str, ChildSpec] = {}
        hosted = directory.hosted()
        for partition in directory.partitions.values():
            if self._config.node_id not in partition.members:
                continue
            missing = [m for m in partition.members if m not in directory.node_ports]
            if missing:
                if partition.name not in self._waiting:
                    log.warning("partition %s waits for the ports of %s", partition.name, ", ".join(missing))
                    self._waiting.add(partition.name)
                continue
            self._waiting.discard(partition.name)
            try:
                config = partition_config(self._config, partition.name, partition.number,
                                          [member_ports(directory.node_ports[m]) for m in partition.members],
                                          share_partitions=1 + max(hosted.get(m, 0) for m in partition.members))
            except (PartitionPortsExhausted, ValueError) as exc:
                log.error("partition %s cannot run on this node: %s", partition.name, exc)
                continue
            specs[partition.name] = self._spec(partition.name, config)
        return specs

    def _spec(self, name: str, config: NodeConfig) -> ChildSpec:
        text = json.dumps(config.model_dump(mode="json"), sort_keys=True)
        path = self.directory_path / f"{name}.json"
        self.directory_path.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            write_private(path, text)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        # The configuration's hash is part of the spec: a changed configuration restarts the child,
        # except for the other members, which the process reads only at its first start, and its
        # static share of the budget, which it needs only until p0's controller gives it one (a
        # partition created elsewhere must not restart this one).
        own = json.dumps(config.model_dump(mode="json", exclude={"peers", "peer_urls", "storage_share_partitions"}),
                         sort_keys=True)
        fingerprint = hashlib.sha256(own.encode()).hexdigest()[:16]
        return ChildSpec((sys.executable, "-m", "rcq", "serve", "--config", str(path), "--log-level", str(level)),
                         self.directory_path / f"{name}.log", env={"RCQ_PARTITION_CONFIG": fingerprint})


def hosted(host: PartitionHost | None) -> dict[str, Any]:
    """What /v1/cluster says of a node's partition processes (empty without a host)."""
    return {} if host is None else host.status()
