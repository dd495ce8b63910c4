"""A node's /metrics with its partition processes' series (rcq.server.http.metrics_merge)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rcq.server.http.metrics_merge import merged


def registry_with(depth: float, requests: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("rcq_queue_depth", "Items in a queue", ["queue"], registry=registry).labels("jobs").set(depth)
    Counter("rcq_http_requests", "Requests", registry=registry).inc(requests)
    return registry


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples
            if not s.name.endswith("_created")}


def test_each_partitions_series_join_their_family_with_a_partition_label_and_ours_stay_as_they_are() -> None:
    own = registry_with(3, 5)
    text = merged(own.collect(), {"p1": generate_latest(registry_with(7, 2)).decode(),
                                  "p2": generate_latest(registry_with(0, 9)).decode()}, unanswered=1)
    got = samples(text)
    assert got[("rcq_queue_depth", (("queue", "jobs"),))] == 3
    assert got[("rcq_queue_depth", (("partition", "p1"), ("queue", "jobs")))] == 7
    assert got[("rcq_queue_depth", (("partition", "p2"), ("queue", "jobs")))] == 0
    assert got[("rcq_http_requests_total", ())] == 5 and got[("rcq_http_requests_total", (("partition", "p2"),))] == 9
    assert got[("rcq_partition_metrics_unanswered", ())] == 1
    lines = text.decode().splitlines()
    assert lines.count("# TYPE rcq_queue_depth gauge") == 1  # one family, as the text format requires
    assert lines.count("# TYPE rcq_http_requests_total counter") == 1


def test_a_family_only_a_partition_has_is_kept_with_its_help_and_type() -> None:
    other = CollectorRegistry()
    Gauge("rcq_only_there", "Only in p1", registry=other).set(4)
    got = merged(CollectorRegistry().collect(), {"p1": generate_latest(other).decode()}, unanswered=0).decode()
    assert "# HELP rcq_only_there Only in p1" in got and 'rcq_only_there{partition="p1"} 4.0' in got
