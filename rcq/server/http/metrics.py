"""Prometheus metrics: ``GET /metrics`` in the text format, with prometheus-client.

Values that rcq keeps anyway (queue depths, totals, Raft indexes, open transactions, how
transactions ended) are read at scrape time by :class:`RcqCollector`, never copied into a second
set of counters; only distributions (commit latency, group-commit batch sizes, fsync durations)
and HTTP request counts are observed as they happen. Names follow Prometheus's rules: prefix
``rcq_``, base units (seconds, bytes), ``_total`` on counters. Label values are bounded:
transaction ids never appear; queue names do, for at most ``QUEUE_LABELS_MAX`` queues (the
deepest; the rest are summed under ``queue="_other"``); routes are the route templates.

Each node has its own registry (tests run several nodes in one process).

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string

from rcq.server.config import NodeConfig
from rcq.server.core.features import level_max_read
from rcq.server.http.channel_stats import ChannelStats
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator
from rcq.version import rcq_version

QUEUE_LABELS_MAX = 1000
OTHER_QUEUES = "_other"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROLES = ("leader", "follower", "candidate")
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# Routes counted but not timed: a WebSocket session lasts as long as its client keeps it, so its
# whole life would swamp the request-duration histogram without saying how fast the node answers.
UNTIMED_ROUTES = frozenset({"/v1/session"})

# prometheus-client's own formatting of a bound (untyped there: given its type here)
float_to_go_string: Callable[[float], str] = _float_to_go_string


class _QueueFamilies(NamedTuple):
    items: GaugeMetricFamily
    item_bytes: GaugeMetricFamily
    enqueued: CounterMetricFamily
    dequeued: CounterMetricFamily
    purged: CounterMetricFamily
    returned: CounterMetricFamily
    died: CounterMetricFamily
    dropped: CounterMetricFamily
    redriven: CounterMetricFamily


class RcqCollector(Collector):
    """Everything read at scrape time from the state machine, the leader and Raft."""

    def __init__(self, config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> None:
        self._config = config
        self._manager = manager
        self._replicator = replicator

    def collect(self) -> Iterator[Metric]:
        yield from self._queues()
        yield from self._storage()
        yield from self._transactions()
        yield from self._raft()
        yield from self._versions()

    def _versions(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("rcq_build_info", "This node's rcq version (the value is 1)", labels=["version"])
        info.add_metric([rcq_version()], 1)
        levels = GaugeMetricFamily("rcq_feature_level", "The cluster's active feature level as this node applied "
                                   "it, and the highest this node reads (docs/upgrades.md)", labels=["level"])
        levels.add_metric(["active"], self._replicator.read(lambda sm: sm.level))
        levels.add_metric(["max"], level_max_read(self._config.test_feature_level_max))
        yield info
        yield levels
        cluster_id = self._replicator.read(lambda sm: sm.cluster_id)
        if cluster_id is not None:  # feature level 2 (docs/backup.md)
            identity = GaugeMetricFamily("rcq_cluster_info", "The cluster's identity (the value is 1)",
                                         labels=["cluster_id"])
            identity.add_metric([cluster_id], 1)
            yield identity

    def _queues(self) -> Iterator[Metric]:
        rows = self._replicator.read(lambda sm: sm.deepest_queues())
        shown, rest = rows[:QUEUE_LABELS_MAX], rows[QUEUE_LABELS_MAX:]
        items = GaugeMetricFamily("rcq_queue_items", "Items in a queue, by state (ready: available to a "
                                  "dequeue; locked: held by open transactions, known on the leader only; "
                                  "delayed: not visible yet)", labels=["queue", "state"])
        item_bytes = GaugeMetricFamily("rcq_queue_bytes", "Bytes of the items in a queue", labels=["queue"])
        enqueued = CounterMetricFamily("rcq_queue_enqueued", "Items committed into a queue", labels=["queue"])
        dequeued = CounterMetricFamily("rcq_queue_dequeued", "Items committed out of a queue", labels=["queue"])
        purged = CounterMetricFamily("rcq_queue_purged", "Items removed from a queue by purges", labels=["queue"])
        returned = CounterMetricFamily("rcq_queue_returned", "Items given back to the head of a queue by aborts, "
                                       "expiries and leader changes (this node as leader)", labels=["queue"])
        died = CounterMetricFamily("rcq_queue_died", "Items that left a queue dead, by reason (max_deliveries, "
                                   "expired, rejected): to its dead-letter queue, or dropped", labels=["queue", "reason"])
        dropped = CounterMetricFamily("rcq_queue_dropped", "Dead items dropped: their queue has no dead-letter queue",
                                      labels=["queue"])
        redriven = CounterMetricFamily("rcq_queue_redriven", "Dead items a dead-letter queue sent back to their "
                                       "source queues", labels=["queue"])
        families = _QueueFamilies(items, item_bytes, enqueued, dequeued, purged, returned, died, dropped, redriven)
        for name, stats in shown:
            self._queue_sample(families, name, [stats], [self._manager.locked_count(name)],
                               self._manager.returned_total.get(name, 0))
        if rest:
            names = {name for name, _ in rest}
            self._queue_sample(families, OTHER_QUEUES, [stats for _, stats in rest],
                               [self._manager.locked_count(n) for n in names],
                               sum(v for q, v in self._manager.returned_total.items() if q in names))
        yield from families

    @staticmethod
    def _queue_sample(families: _QueueFamilies, label: str, stats: list[dict[str, int]], locked: list[int | None],
                      returned_count: int) -> None:
        def total(key: str) -> int:
            return sum(s.get(key, 0) for s in stats)

        count, delayed = total("count"), total("delayed")
        known_locked = [n for n in locked if n is not None]
        if len(known_locked) == len(locked):
            families.items.add_metric([label, "locked"], sum(known_locked))
            families.items.add_metric([label, "ready"], max(0, count - sum(known_locked) - delayed))
        else:
            families.items.add_metric([label, "total"], count - delayed)
        families.items.add_metric([label, "delayed"], delayed)
        families.item_bytes.add_metric([label], total("bytes"))
        families.enqueued.add_metric([label], total("enqueued_total"))
        families.dequeued.add_metric([label], total("dequeued_total"))
        families.purged.add_metric([label], total("purged_total"))
        families.returned.add_metric([label], returned_count)
        for reason in ("max_deliveries", "expired", "rejected"):
            families.died.add_metric([label, reason], total(f"{reason}_total"))
        families.dropped.add_metric([label], total("dropped_total"))
        families.redriven.add_metric([label], total("redriven_total"))

    def _storage(self) -> Iterator[Metric]:
        cost, sizes = self._replicator.read(lambda sm: (sm.storage_cost, sm.table_sizes()))
        yield GaugeMetricFamily("rcq_storage_bytes", "What the queued items cost, bookkeeping included "
                                "(what storage_bytes_max limits)", value=cost)
        yield GaugeMetricFamily("rcq_storage_max_bytes", "The memory budget for queued items of this process: "
                                "its share of the node's budget (docs/partitions.md, \"Memory budget\")",
                                value=self._manager.storage_bytes_max)
        yield GaugeMetricFamily("rcq_node_storage_max_bytes", "The node's memory budget for queued items "
                                "(storage_bytes_max), shared by the partitions it hosts",
                                value=self._manager.node_storage_bytes_max)
        yield GaugeMetricFamily("rcq_queues", "Queues in the replicated state", value=sizes["queues"])
        yield GaugeMetricFamily("rcq_outcomes_remembered", "Transaction outcomes remembered for retries",
                                value=sizes["outcomes"])
        yield GaugeMetricFamily("rcq_idempotency_keys_remembered", "Idempotency keys remembered",
                                value=sizes["idempotency_keys"])
        yield GaugeMetricFamily("rcq_retry_keys_remembered", "Retry keys (the client library's own idempotency "
                                "keys, feature level 3) remembered", value=sizes["retry_keys"])

    def _transactions(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("rcq_transactions_open", "Open transactions on this node (the leader's)",
                                value=self._manager.open_count)
        closed = CounterMetricFamily("rcq_transactions", "Transactions ended on this node as leader, by outcome",
                                     labels=["outcome"])
        for outcome, count in sorted(self._manager.closed_total.items()):
            closed.add_metric([outcome], count)
        yield closed

    def _raft(self) -> Iterator[Metric]:
        status = self._replicator.status()
        role = GaugeMetricFamily("rcq_raft_role", "1 for this node's Raft role", labels=["role"])
        for name in ROLES:
            role.add_metric([name], 1 if status.role == name else 0)
        yield role
        yield GaugeMetricFamily("rcq_raft_term", "Current Raft term", value=status.term)
        yield GaugeMetricFamily("rcq_raft_commit_index", "Raft commit index", value=status.commit_index)
        yield GaugeMetricFamily("rcq_raft_applied_index", "Last Raft index applied to the state machine",
                                value=status.last_applied)
        yield GaugeMetricFamily("rcq_raft_log_entries", "Raft log entries held (since the last snapshot)",
                                value=status.log_length)
        yield GaugeMetricFamily("rcq_raft_has_quorum", "1 when this node (as leader) has a quorum",
                                value=int(status.has_quorum))
        yield GaugeMetricFamily("rcq_raft_members", "Voting members of the cluster, as this node sees them",
                                value=len(self._replicator.members()))
        yield CounterMetricFamily("rcq_raft_snapshots", "Snapshots written or received since start",
                                  value=status.snapshot_count)
        yield CounterMetricFamily("rcq_raft_leader_changes_seen", "Leader changes this node has seen",
                                  value=int(status.details.get("leader_changes_seen", 0)))
        yield CounterMetricFamily("rcq_raft_guard_ticks", "Raft ticks the guard thread ran while the event loop "
                                  "was busy for more than 0.2 s", value=int(status.details.get("guard_ticks", 0)))
        for way in ("sent", "received"):
            yield CounterMetricFamily(f"rcq_raft_messages_{way}", f"Raft messages this process {way} (whole frames, "
                                      "heartbeats and entries alike)",
                                      value=int(status.details.get(f"raft_messages_{way}", 0)))
        yield GaugeMetricFamily("rcq_serving", "1 when this node is the leader and serves (its barrier applied)",
                                value=int(self._manager.serving))


class HotHistogram(Collector):
    """A histogram observed once per commit or Raft entry, on every node: a list index and two
    additions per observation, summed into Prometheus's cumulative buckets at scrape time.
    prometheus-client's Histogram takes a lock per bucket and per sum on every observation, ~10 µs
    of a follower's ~150 µs per transaction in a py-spy profile. Observed from the event loop's
    thread, and from the Raft guard thread while the loop is busy: without a lock, an observation
    racing another may be lost (a count, not a value that is ever wrong), which a metric can bear."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def sum(self) -> float:
        return self._sum

    @property
    def count(self) -> int:
        return sum(self._counts)

    def collect(self) -> Iterator[Metric]:
        counts, cumulative, buckets = list(self._counts), 0, []
        for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append((float_to_go_string(bound), cumulative))  # the le label as prometheus-client writes it
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=self._sum)


class _SessionCollector(Collector):
    def __init__(self, stats: ChannelStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from self._stats.metrics()


class NodeMetrics:
    """One node's registry, its observed metrics, and the ``/metrics`` handler."""

    def __init__(self, config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(RcqCollector(config, manager, replicator))
        self.sessions = ChannelStats()
        self.registry.register(_SessionCollector(self.sessions))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu, open fds
        self.commit_seconds = HotHistogram(
            "rcq_commit_duration_seconds", "From a commit's proposal to its outcome, on the leader", LATENCY_BUCKETS_S)
        self.batch_units = HotHistogram(
            "rcq_group_commit_units", "Commit units grouped into one Raft entry", BATCH_BUCKETS)
        self.fsync_seconds = HotHistogram(
            "rcq_wal_fsync_duration_seconds", "fdatasync of the Raft log (durability=fsync)", FSYNC_BUCKETS_S)
        for hot in (self.commit_seconds, self.batch_units, self.fsync_seconds):
            self.registry.register(hot)
        self.requests = Counter(
            "rcq_http_requests", "HTTP requests answered, by route template, method and status class",
            ["route", "method", "status"], registry=self.registry)
        self.request_seconds = Histogram(
            "rcq_http_request_duration_seconds", "Time to answer an HTTP request, by route template",
            ["route"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        # The labelled children of requests and request_seconds, as observe_request made them.
        self._request_counters: dict[tuple[str, str, int], Counter] = {}
        self._request_timers: dict[str, Histogram] = {}
        manager.on_commit_latency = self.commit_seconds.observe
        manager.committer.on_entry = self.batch_units.observe
        set_sync_observer = getattr(replicator, "set_sync_observer", None)
        if set_sync_observer is not None:
            set_sync_observer(self.fsync_seconds.observe)

    def observe_request(self, request: web.Request, status: int, started: float) -> None:
        """Count an answered request by route template, method and status class; time it from
        ``started`` (``time.monotonic()``), but for :data:`UNTIMED_ROUTES`. The labelled children
        are kept: looking them up through ``labels()`` on every request costs more than counting."""
        route = _route_of(request)
        key = (route, request.method, status // 100)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self.requests.labels(route, request.method, f"{status // 100}xx")
        counter.inc()
        if route in UNTIMED_ROUTES:
            return
        timer = self._request_timers.get(route)
        if timer is None:
            timer = self._request_timers[route] = self.request_seconds.labels(route)
        timer.observe(time.monotonic() - started)

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE})


def _route_of(request: web.Request) -> str:
    """The route template (``/v1/transactions/{transaction_id}/commit``), never the raw path: bounded."""
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", None)
    return str(canonical) if canonical else "unmatched"
