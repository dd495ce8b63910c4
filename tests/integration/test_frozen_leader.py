"""A leader that freezes (SIGSTOP: a VM stall, a long pause) while clients are using it: the client
notices the overdue request, finds the new serving leader and commits there soon after it is
elected — not when the old leader thaws or the request times out — and nothing is applied twice."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import pytest

from rcq.client import LeaderChanged, RcqClient
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import drain_until_empty, running_cluster

pytestmark = pytest.mark.cluster

FREEZE_S = 8.0  # longer than an election, shorter than the client's request timeout
AFTER_ELECTION_MAX_S = 1.5  # the goal is 1 s; the bound leaves room for a loaded 2-core machine


async def new_leader_serves(cluster, candidates: list[int]) -> bool:
    """Whether one of ``candidates`` (the nodes but the frozen leader) leads and serves."""
    for i in candidates:
        try:
            view = await asyncio.to_thread(cluster.status, i, 0.3)
        except OSError:
            continue
        if view.get("role") == "leader" and view.get("serving"):
            return True
    return False


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "http"])
async def test_clients_move_to_the_new_leader_while_the_old_one_is_frozen(channel: bool):
    with running_cluster() as cluster:
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        others = [i for i in range(3) if i != leader]
        acked: list[tuple[float, str]] = []
        stop = asyncio.Event()

        async with RcqClient(cluster.urls, request_timeout_s=30, retry_timeout_s=60, channel=channel,
                             **cluster.client_options()) as client:
            async def produce() -> None:
                n = 0
                while not stop.is_set():
                    value = f"v{n}"
                    n += 1
                    await client.enqueue("frozen", value)  # an idempotency key per call
                    acked.append((time.monotonic(), value))

            producer = asyncio.create_task(produce())
            await async_wait_until(lambda: len(acked) >= 20, CLUSTER_WAIT_S, what="commits before the freeze")
            frozen_at = time.monotonic()
            cluster.pause_node(leader)
            try:
                await async_wait_until(lambda: new_leader_serves(cluster, others), FREEZE_S,
                                       what="a new leader while the old one is frozen", interval_s=0.02)
                elected_at = time.monotonic()
                await async_wait_until(lambda: any(t > elected_at for t, _ in acked), FREEZE_S,
                                       what="a commit at the new leader while the old one is frozen")
                first_after = min(t for t, _ in acked if t > elected_at)
                print(f"election {elected_at - frozen_at:.2f} s after the freeze, first commit "
                      f"{first_after - elected_at:.2f} s after the election; switches {client._transport.leader_switches}")
                assert first_after - elected_at < AFTER_ELECTION_MAX_S
                assert client._transport.leader_switches >= 1
            finally:
                cluster.resume_node(leader)
            stop.set()
            await producer
            cluster.wait_for_convergence(CLUSTER_WAIT_S)
            drained = await drain_until_empty(client, "frozen")
        # every acknowledged value is there exactly once; an abandoned attempt applied nothing twice
        assert Counter(drained) == Counter(value for _, value in acked)


async def test_without_the_watch_a_frozen_leader_holds_the_client_until_it_thaws(monkeypatch):
    from rcq.client import leader_tracker

    monkeypatch.setattr(leader_tracker, "LEADER_PROBE_AFTER_S", 1e9)  # the client of the first version
    with running_cluster() as cluster:
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        others = [i for i in range(3) if i != leader]
        async with RcqClient(cluster.urls, request_timeout_s=30, retry_timeout_s=60, **cluster.client_options()) as client:
            await client.enqueue("frozen", "before")
            cluster.pause_node(leader)
            try:
                pending = asyncio.create_task(client.enqueue("frozen", "during"))
                await async_wait_until(lambda: new_leader_serves(cluster, others), LEADER_TIMEOUT_S,
                                       what="a new leader while the old one is frozen", interval_s=0.02)
                elected_at = time.monotonic()
                done, _ = await asyncio.wait({pending}, timeout=AFTER_ELECTION_MAX_S * 2)
                assert not done, "the enqueue went through without the watch: this test shows nothing"
                print(f"still waiting {time.monotonic() - elected_at:.2f} s after the election")
            finally:
                cluster.resume_node(leader)
            # Once the old leader thaws, the request gets its answer: its entry was never committed.
            with contextlib.suppress(LeaderChanged):
                await pending
