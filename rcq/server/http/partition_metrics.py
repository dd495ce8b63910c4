"""The metrics of a node's partitions, read at scrape time (docs/partitions.md, "Observability").

On every node that hosts partitions, of each partition process as its supervisor sees it:
``rcq_partition_process_running``, ``rcq_partition_process_restarts_total``,
``rcq_partition_process_cpu_seconds_total`` and ``rcq_partition_process_resident_bytes``
(labelled ``partition``; from ``/proc``, so they are there while a process does not answer its
own ``/metrics``). On p0's leader, from its controller's last survey: ``rcq_partition_leaders``
(partitions each node leads), ``rcq_partition_member_lag_entries`` (each member's entries behind
its partition's leader), and the balancer's ``rcq_partition_leader_moves_total``,
``rcq_partition_leader_moves_failed_total`` and ``rcq_partition_member_changes_total``.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rcq.server.leader.leader_balance import leaders_per_node
from rcq.server.leader.partition_controller import PartitionController


class PartitionCollector(Collector):
    """``hosted()``: the host's status (empty without one); ``controller()``: p0's controller, or
    None in a partition process; ``leading()``: whether this node is p0's serving leader."""

    def __init__(self, hosted: Callable[[], dict[str, dict[str, Any]]],
                 controller: Callable[[], PartitionController | None], leading: Callable[[], bool]) -> None:
        self._hosted = hosted
        self._controller = controller
        self._leading = leading

    def collect(self) -> Iterator[Metric]:
        yield from self._processes()
        controller = self._controller()
        if controller is not None and self._leading():
            yield from self._balance(controller)

    def _processes(self) -> Iterator[Metric]:
        hosted = self._hosted()
        running = GaugeMetricFamily("rcq_partition_process_running", "1 while this node's process of the partition "
                                    "runs, 0 while its supervisor waits to start it again", labels=["partition"])
        restarts = CounterMetricFamily("rcq_partition_process_restarts", "Times this node started the partition's "
                                       "process again after it ended", labels=["partition"])
        cpu = CounterMetricFamily("rcq_partition_process_cpu_seconds", "CPU time (user and system) of this node's "
                                  "process of the partition, since it started", labels=["partition"])
        rss = GaugeMetricFamily("rcq_partition_process_resident_bytes", "Resident memory of this node's process of "
                                "the partition", labels=["partition"])
        for name, state in sorted(hosted.items()):
            running.add_metric([name], 1.0 if state.get("running") else 0.0)
            restarts.add_metric([name], float(state.get("restarts") or 0))
            if state.get("cpu_s") is not None:
                cpu.add_metric([name], float(state["cpu_s"]))
            if state.get("rss_bytes") is not None:
                rss.add_metric([name], float(state["rss_bytes"]))
        yield from (running, restarts, cpu, rss)

    @staticmethod
    def _balance(controller: PartitionController) -> Iterator[Metric]:
        views = controller.views
        leaders = GaugeMetricFamily("rcq_partition_leaders", "Partitions (besides p0) each node leads, as p0's "
                                    "leader last surveyed them", labels=["node_id"])
        for node, count in sorted(leaders_per_node([v.leaders() for v in views], controller.nodes()).items()):
            leaders.add_metric([node], float(count))
        lag = GaugeMetricFamily("rcq_partition_member_lag_entries", "Entries a member of a partition is behind its "
                                "leader's commit index (absent while it does not answer)",
                                labels=["partition", "node_id"])
        for view in views:
            for node, behind in sorted(view.lag().items()):
                if behind is not None:
                    lag.add_metric([view.name, node], float(behind))
        status = controller.status
        moves = CounterMetricFamily("rcq_partition_leader_moves", "Leader hand-overs the balancer made (rebalances "
                                    "by hand included), since this node became p0's leader")
        moves.add_metric([], float(status.moves_total))
        failed = CounterMetricFamily("rcq_partition_leader_moves_failed", "Leader hand-overs the balancer asked "
                                     "for that were refused or not answered")
        failed.add_metric([], float(status.moves_failed_total))
        changes = CounterMetricFamily("rcq_partition_member_changes", "Members added to or removed from partitions' "
                                      "Raft groups by p0's controller")
        changes.add_metric([], float(status.member_changes_total))
        yield from (leaders, lag, moves, failed, changes)
