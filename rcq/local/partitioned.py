"""The partitions of a local cluster (docs/partitions.md): their listing, creating p1 ... and
waiting until they lead, and the signals a harness sends one partition's process (kill -9,
SIGSTOP, SIGCONT) while its node runs on. :class:`PartitionedCluster` is the base of
:class:`rcq.local.cluster.LocalCluster`, which owns the nodes and their files.

Must not import: rcq.server, pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from rcq.local.nodes import LocalNode
from rcq.local.polls import WAIT_TIMEOUT_S, PolledCluster
from rcq.local.processes import partition_processes
from rcq.local.waits import wait_until


class PartitionedCluster(PolledCluster[LocalNode]):
    """Partition views and controls over ``nodes``; ``partitions_max``: how many partitions
    besides p0 each node has ports for (0: p0 only)."""

    partitions_max: int = 0

    def url(self, i: int) -> str:
        raise NotImplementedError

    def partition_processes(self, i: int) -> dict[str, int]:
        """Node ``i``'s partition processes now (docs/partitions.md): partition name -> pid."""
        pid = self.nodes[i].pid
        return partition_processes(pid) if pid is not None and self.nodes[i].running() else {}

    def kill_partition_process(self, i: int, partition: str) -> int | None:
        """SIGKILL node ``i``'s process of ``partition`` (its node restarts it); its pid, None if it has none."""
        pid = self.partition_processes(i).get(partition)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid

    def pause_partition_process(self, i: int, partition: str) -> int | None:
        """SIGSTOP node ``i``'s process of ``partition`` (its node left running); its pid, None if it
        has none. :meth:`resume_process` undoes it."""
        pid = self.partition_processes(i).get(partition)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pid

    @staticmethod
    def resume_process(pid: int) -> None:
        """SIGCONT a process paused by :meth:`pause_partition_process` (gone meanwhile: nothing)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def _partition_process_urls(self, i: int) -> list[str]:
        """The URLs of node ``i``'s partition processes (none in a cluster never given partitions)."""
        if not self.partitions_max:
            return []
        node_id = self.nodes[i].node_id
        return [url for row in self.partitions(i) if row["name"] != "p0"
                for member, url in zip(row["members"], row.get("urls") or [], strict=False) if member == node_id]

    def partitions(self, i: int | None = None) -> list[dict[str, Any]]:
        """GET /v1/cluster/partitions of node ``i`` (default: the leader)."""
        i = self.wait_for_leader() if i is None else i
        return list(self.poll_json(self.url(i) + "/v1/cluster/partitions")["partitions"])

    def ensure_partitions(self, count: int, timeout_s: float = WAIT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Partitions p0 ... p{count-1}, the missing ones created (docs/partitions.md), once each
        names a leader; their listing. Needs ``partitions_max`` of at least ``count - 1``."""
        deadline = time.monotonic() + timeout_s
        for number in range(1, count):
            name = f"p{number}"
            while name not in [row["name"] for row in self.partitions()]:
                answer = self.poll_json(self.url(self.wait_for_leader()) + "/v1/cluster/partitions", method="POST",
                                        body={"name": name})
                code = answer.get("error", {}).get("code")
                # A new cluster raises its level to 4, and records every node's ports, within a turn
                # or two of its leader's feature-level loop (5 s): until then creating is refused.
                if code not in (None, "partition_exists", "node_has_no_partition_ports", "feature_level_required",
                                "not_leader", "no_leader"):
                    raise RuntimeError(f"creating partition {name}: {answer['error']}")
                if code is not None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"partition {name} not created within {timeout_s} s: {answer['error']}")
                    time.sleep(self.poll_interval_s)  # pace: the leader records the nodes' ports at its next turn

        return self.wait_partitions_led([f"p{number}" for number in range(count)], max(deadline - time.monotonic(), 1.0))

    def wait_partitions_led(self, names: Sequence[str], timeout_s: float = WAIT_TIMEOUT_S) -> list[dict[str, Any]]:
        """The partition listing once each of ``names`` is listed and names a leader."""
        def led() -> list[dict[str, Any]] | None:
            rows = self.partitions()
            leaders = {row["name"]: row["leader_url"] for row in rows}
            return rows if all(leaders.get(name) for name in names) else None

        return wait_until(led, timeout_s, what=f"partitions {', '.join(names)} led")


def range_partitions(ports: Any) -> int:
    """How many partitions a node's ``partition_ports`` setting (``"first-last"``) serves."""
    if not isinstance(ports, str) or "-" not in ports:
        return 0
    first, last = (int(part) for part in ports.split("-", 1))
    return (last - first + 1) // 2
