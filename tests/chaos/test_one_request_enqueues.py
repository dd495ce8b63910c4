"""One-request enqueues in the chaos workload (chaos.workload): which writes become one, what the
executor sends for them, and how it judges their errors (the client's retry keys make them
exactly once; the total-queue checker would see a duplicate)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chaos.checkers import check
from chaos.executor import Executor
from chaos.generator import Generator, Spec, Topology, headers_of, runs_by_headers
from rcq.errors import CommitOutcomeUnknown, QueueFull
from tests.helpers.history import History


class EnqueueOnlyClient:
    """What a one-request enqueue may use of a client: ``enqueue``, nothing else."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error = error

    async def enqueue(self, queue: str, *values: Any, **options: Any) -> None:
        self.calls.append((queue, values, options))
        if self.error is not None:
            raise self.error


def specs(seed: int, queues: list[str], topology: Topology | None) -> list[Spec]:
    return [g.next() for g in [Generator(seed, w, queues, topology=topology) for w in range(6)] for _ in range(300)]


@pytest.mark.parametrize("featured", [False, True])
def test_a_share_of_the_single_queue_writes_one_call_carries_are_one_request_enqueues(featured: bool) -> None:
    queues = ["q0", "q1", "q2"]
    topology = Topology.of(queues) if featured else None
    enqueues = [s for s in specs(11, queues, topology) if s.f == "enqueue"]
    assert [s.value for s in enqueues] == [s.value for s in specs(11, queues, topology) if s.f == "enqueue"]
    one_request = [s for s in enqueues if s.value.get("one_request")]
    eligible = [s for s in enqueues if len(s.value["writes"]) == 1
                and len(runs_by_headers(s.value["writes"][0]["values"], headers_of)) == 1]
    assert all(s in eligible for s in one_request)
    assert 0.25 < len(one_request) / len(eligible) < 0.55


def test_the_executor_sends_one_enqueue_with_the_writes_values_headers_and_options() -> None:
    client = EnqueueOnlyClient()
    spec = Spec("enqueue", {"writes": [{"queue": "q1", "values": ["1-5-h"], "priority": 2, "ttl_s": 9.5}],
                            "one_request": True})
    type_, value, error = asyncio.run(Executor(client).run(spec))  # type: ignore[arg-type]
    assert (type_, error) == ("ok", None) and value["one_request"] and "ack_ms" in value
    assert client.calls == [("q1", ("1-5-h",), {"headers": headers_of("1-5-h"), "priority": 2, "ttl_s": 9.5})]
    plain = Spec("enqueue", {"writes": [{"queue": "q0", "values": ["1-6", "1-7"]}], "one_request": True})
    asyncio.run(Executor(client).run(plain))  # type: ignore[arg-type]
    assert client.calls[-1] == ("q0", ("1-6", "1-7"), {"headers": None})


@pytest.mark.parametrize(("error", "expected"), [(QueueFull("full"), "fail"),
                                                 (CommitOutcomeUnknown("lost"), "info"),
                                                 (ConnectionResetError(), "info")])
def test_a_one_request_enqueue_fails_only_on_a_definite_error(error: Exception, expected: str) -> None:
    spec = Spec("enqueue", {"writes": [{"queue": "q0", "values": ["2-1"]}], "one_request": True})
    type_, value, _ = asyncio.run(Executor(EnqueueOnlyClient(error)).run(spec))  # type: ignore[arg-type]
    assert type_ == expected and value["writes"] == spec.value["writes"]


def test_the_checker_counts_one_request_enqueues_and_finds_one_applied_twice() -> None:
    history = History()
    history.op(0, "ok", "enqueue", {"writes": [{"queue": "q0", "values": ["0-1"]}], "one_request": True})
    history.dequeue(1, "ok", "q0", "0-1").dequeue(2, "ok", "q0", "0-1")  # applied twice: taken twice
    results = check(history.lines)
    assert results["stats"]["one_request_enqueues_by_type"] == {"ok": 1}
    assert not results["total_queue"]["valid"] and results["total_queue"]["duplicated_count"] > 0
