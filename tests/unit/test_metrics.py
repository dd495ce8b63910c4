"""GET /metrics: the Prometheus text format, read at scrape time, with bounded labels."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rcq.client import RcqClient
from rcq.server.http.metrics import BATCH_BUCKETS, FSYNC_BUCKETS_S, HotHistogram
from tests.helpers.nodes import running_node, url_of

NAME_RULE = re.compile(r"^(rcq|process|python)_[a-z0-9_]+$")


async def scrape(session: aiohttp.ClientSession) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    async with session.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        assert NAME_RULE.match(family.name), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


async def test_metrics_follow_what_happens(tmp_path: Path):
    # channel=False: the HTTP request counters are read, and the session channel would carry the verbs
    async with running_node(tmp_path) as node, aiohttp.ClientSession(url_of(node)) as session, \
            RcqClient(url_of(node), retry_timeout_s=1, channel=False) as client:
        before = await scrape(session)
        assert value(before, "rcq_transactions_open") == 0
        assert value(before, "rcq_raft_role", role="leader") == 1
        assert value(before, "rcq_serving") == 1
        assert value(before, "rcq_raft_members") == 1
        assert "process_resident_memory_bytes" in before
        await client.enqueue("jobs", b"a", b"bb")
        async with client.transaction() as tx:
            await tx.dequeue("jobs")
            after_lock = await scrape(session)
            assert value(after_lock, "rcq_queue_items", queue="jobs", state="locked") == 1
            assert value(after_lock, "rcq_queue_items", queue="jobs", state="ready") == 1
            assert value(after_lock, "rcq_transactions_open") == 1
            await tx.abort()
        after = await scrape(session)
        assert value(after, "rcq_queue_enqueued_total", queue="jobs") == 2
        assert value(after, "rcq_queue_returned_total", queue="jobs") == 1
        assert value(after, "rcq_queue_bytes", queue="jobs") == 3
        assert value(after, "rcq_transactions_total", outcome="committed") >= 1
        assert value(after, "rcq_transactions_total", outcome="aborted") == 1
        assert value(after, "rcq_commit_duration_seconds_count") >= 1
        async with session.get("/readyz") as response:  # read from the histogram, as the scrape
            latency = (await response.json())["commit_latency"]
        assert latency == {"count": value(after, "rcq_commit_duration_seconds_count"),
                           "sum_s": value(after, "rcq_commit_duration_seconds_sum")}
        assert value(after, "rcq_group_commit_units_count") >= 1
        assert value(after, "rcq_storage_bytes") > 3
        assert value(after, "rcq_http_requests_total", route="/v1/queues/{queue}/enqueue", method="POST",
                     status="2xx") == 1
        label_values = {v for series in after.values() for labels in series for _, v in labels}
        assert tx.transaction_id not in label_values
        assert not any(re.fullmatch(r"[0-9a-f]{1,16}\.[0-9a-f]{24}", v) for v in label_values)
        for labels in after["rcq_http_requests_total"]:
            assert dict(labels)["route"].startswith(("/", "unmatched")), labels


async def test_unknown_paths_do_not_become_labels(tmp_path: Path):
    async with running_node(tmp_path) as node, aiohttp.ClientSession(url_of(node)) as session:
        for i in range(20):
            async with session.get(f"/no/such/path/{i}") as response:
                assert response.status == 404
        samples = await scrape(session)
        routes = {dict(labels)["route"] for labels in samples["rcq_http_requests_total"]}
        assert "unmatched" in routes and not any("/no/such" in r for r in routes)


async def test_queue_labels_are_capped(tmp_path: Path, monkeypatch):
    from rcq.server.http import metrics

    monkeypatch.setattr(metrics, "QUEUE_LABELS_MAX", 3)
    async with running_node(tmp_path) as node, aiohttp.ClientSession(url_of(node)) as session, \
            RcqClient(url_of(node), retry_timeout_s=1) as client:
        for i in range(6):
            await client.enqueue(f"q{i}", *[b"x"] * (i + 1))
        samples = await scrape(session)
        queues = {dict(labels)["queue"] for labels in samples["rcq_queue_enqueued_total"]}
        assert queues == {"q5", "q4", "q3", "_other"}  # the deepest three, the rest summed
        assert value(samples, "rcq_queue_enqueued_total", queue="_other") == 1 + 2 + 3


@pytest.mark.parametrize("buckets", [FSYNC_BUCKETS_S, BATCH_BUCKETS], ids=["seconds", "units"])
def test_a_hot_histogram_reads_as_prometheus_clients_own(buckets: tuple[float, ...]) -> None:
    """Same buckets, counts and sum as prometheus-client's Histogram for the same observations,
    values on the bounds, between, above the last and at zero included (its _created aside)."""
    theirs_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    theirs = Histogram("rcq_test_seconds", "doc", buckets=buckets, registry=theirs_registry)
    ours = HotHistogram("rcq_test_seconds", "doc", buckets)
    ours_registry.register(ours)
    values = [0.0, *buckets, *(b * 1.01 for b in buckets), buckets[-1] * 10, *(i / 997 for i in range(200))]
    for value in values:
        theirs.observe(value)
        ours.observe(value)
    expected = [line for line in generate_latest(theirs_registry).decode().splitlines() if "_created" not in line]
    assert generate_latest(ours_registry).decode().splitlines() == expected
    assert f"rcq_test_seconds_count {float(len(values))}" in expected
    assert ours.count == len(values) and ours.sum == pytest.approx(sum(values))
