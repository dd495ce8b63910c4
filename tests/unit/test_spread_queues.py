"""A spread queue's pure parts (docs/partitions.md, "Spread queues"): which fragment a partition
key names, the fragments' turns, and one answer made of every fragment's."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcq.client.routes import Routes
from rcq.client.spread import FRAGMENT_PASS_BUDGET_S, each_fragment
from rcq.errors import CommitOutcomeUnknown, InvalidRequest, Unavailable
from rcq.names import check_partition_key, fragment_for
from rcq.server.http.models import QueueSettingsRequest
from rcq.server.http.spread_queues import Turns, _took, fragment_settings, merged_read, merged_write

SPREAD = ["p0", "p1", "p2"]


@given(st.text(min_size=1, max_size=50))
def test_a_partition_key_names_one_fragment_the_same_everywhere(key: str) -> None:
    assert fragment_for(key, SPREAD) == SPREAD[zlib.crc32(key.encode()) % 3] == fragment_for(key, list(SPREAD))


def test_the_fragments_take_turns_per_queue_and_a_key_keeps_to_its_own() -> None:
    turns = Turns()
    assert [turns.order("q", SPREAD, None)[0] for _ in range(4)] == ["p0", "p1", "p2", "p0"]
    assert turns.order("q", SPREAD, None) == ["p1", "p2", "p0"]  # every fragment, from the next
    assert turns.order("other", SPREAD, None)[0] == "p0"  # each queue its own turn
    assert turns.order("q", SPREAD, "k") == [fragment_for("k", SPREAD)]


def test_a_read_sums_the_fragments_and_names_those_that_did_not_answer() -> None:
    answers = {"p0": (200, {"queue": "q", "count": 2, "locked": 1, "node_id": "node-0", "settings": {"max_priority": 3}}),
               "p1": (200, {"queue": "q", "count": 5, "locked": None, "node_id": "node-1", "settings": {"max_priority": 3}}),
               "p2": (503, {"error": {"code": "no_leader"}})}
    body = merged_read("q", SPREAD, answers)
    assert body["count"] == 7 and body["locked"] is None and "node_id" not in body
    assert body["by_partition"]["p1"]["count"] == 5 and body["unanswered"] == ["p2"]
    # the queue's split limits: unknown while a fragment did not answer (its share is missing)
    assert body["settings"] == {"max_priority": 3, "max_items": None, "max_bytes": None, "partitions": SPREAD}
    assert body["spread"]


def test_a_write_answers_the_first_failure_else_the_sums() -> None:
    done = {p: (200, {"queue": "q", "removed": n}) for n, p in enumerate(SPREAD)}
    status, body = merged_write("q", SPREAD, done, summed=("removed",))
    assert status == 200 and body["removed"] == 3 and set(body["by_partition"]) == set(SPREAD)
    failed = {**done, "p1": (409, {"error": {"code": "x"}})}
    assert merged_write("q", SPREAD, failed) == (409, {"error": {"code": "x"}, "partition": "p1"})


def test_items_are_found_in_a_dequeues_results_and_a_receives_items() -> None:
    assert _took({"results": [{"op": "dequeue", "items": [{"value": "a"}]}]}) and _took({"items": [{"value": "a"}]})
    assert not _took({"results": [{"op": "dequeue", "items": []}]}) and not _took({"transaction_id": None, "items": []})


def test_a_spread_queues_limits_are_split_into_shares_that_add_up() -> None:
    settings = QueueSettingsRequest(max_items=10, max_bytes=1_000, max_priority=2)
    each = fragment_settings("q", settings, SPREAD)
    assert [each[p].max_items for p in SPREAD] == [4, 3, 3] and [each[p].max_bytes for p in SPREAD] == [334, 333, 333]
    assert all(each[p].max_priority == 2 for p in SPREAD)  # the other settings, as given
    assert fragment_settings("q", QueueSettingsRequest(), SPREAD)["p1"].max_items is None  # unlimited stays so
    with pytest.raises(InvalidRequest, match="below one per fragment"):
        fragment_settings("q", QueueSettingsRequest(max_items=2), SPREAD)
    with pytest.raises(InvalidRequest, match="max_bytes"):
        fragment_settings("q", QueueSettingsRequest(max_bytes=1), SPREAD)
    answers = {p: (200, {"queue": "q", "count": 0, "settings": {"max_items": each[p].max_items, "max_bytes": None}})
               for p in SPREAD}
    body = merged_read("q", SPREAD, answers)
    assert body["settings"]["max_items"] == 10 and body["settings"]["max_bytes"] is None
    assert body["by_partition"]["p0"]["share"] == {"max_items": 4, "max_bytes": None}


def test_a_partition_key_is_one_to_two_hundred_characters() -> None:
    assert check_partition_key("k" * 200) == "k" * 200
    for bad in ("", "k" * 201):
        with pytest.raises(InvalidRequest, match="partition_key"):
            check_partition_key(bad)


async def _no_listing(path: str) -> dict[str, Any]:
    raise AssertionError(f"the placement is known: nothing is asked ({path})")


def _spread_routes() -> Routes:
    routes = Routes(_no_listing)
    routes.learn_placement("q", SPREAD)
    return routes


async def test_the_clients_take_passes_over_dark_fragments_and_raises_when_all_are() -> None:
    sent: list[tuple[str | None, int, float | None]] = []

    async def send(partition: str | None, wait_ms: int, budget_s: float | None) -> list[str]:
        sent.append((partition, wait_ms, budget_s))
        if partition == "p1":
            raise Unavailable("p1 has no leader")
        return ["item"] if partition == "p2" else []

    routes = _spread_routes()
    assert await each_fragment(routes, "q", 0, send, bool) == ["item"]
    assert [p for p, _, _ in sent] == ["p0", "p1", "p2"] and {b for _, _, b in sent} == {FRAGMENT_PASS_BUDGET_S}

    async def dark(partition: str | None, wait_ms: int, budget_s: float | None) -> list[str]:
        raise Unavailable(f"{partition} has no leader")

    with pytest.raises(Unavailable):
        await each_fragment(routes, "q", 1000, dark, bool)


async def test_the_clients_take_waits_in_a_fragment_that_answered_not_in_a_dark_one() -> None:
    sent: list[tuple[str | None, int]] = []

    async def send(partition: str | None, wait_ms: int, budget_s: float | None) -> list[str]:
        sent.append((partition, wait_ms))
        if partition == "p2":
            raise Unavailable("p2 has no leader")
        return []

    assert await each_fragment(_spread_routes(), "q", 1000, send, bool) == []
    assert sent == [("p0", 0), ("p1", 0), ("p2", 0), ("p1", 1000)], sent


async def test_the_clients_take_lets_an_unknown_outcome_through() -> None:
    async def send(partition: str | None, wait_ms: int, budget_s: float | None) -> list[str]:
        if partition == "p1":
            raise CommitOutcomeUnknown("p1's leader took it and never answered")
        return []

    with pytest.raises(CommitOutcomeUnknown):
        await each_fragment(_spread_routes(), "q", 0, send, bool)
