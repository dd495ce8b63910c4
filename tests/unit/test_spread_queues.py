"""A spread queue's pure parts (docs/partitions.md, "Spread queues"): which fragment a partition
key names, the fragments' turns, and one answer made of every fragment's."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from rcq.names import fragment_for
from rcq.server.http.spread_queues import Turns, _took, merged_read, merged_write

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
    assert body["settings"] == {"max_priority": 3, "partitions": SPREAD} and body["spread"]


def test_a_write_answers_the_first_failure_else_the_sums() -> None:
    done = {p: (200, {"queue": "q", "removed": n}) for n, p in enumerate(SPREAD)}
    status, body = merged_write("q", SPREAD, done, summed=("removed",))
    assert status == 200 and body["removed"] == 3 and set(body["by_partition"]) == set(SPREAD)
    failed = {**done, "p1": (409, {"error": {"code": "x"}})}
    assert merged_write("q", SPREAD, failed) == (409, {"error": {"code": "x"}, "partition": "p1"})


def test_items_are_found_in_a_dequeues_results_and_a_receives_items() -> None:
    assert _took({"results": [{"op": "dequeue", "items": [{"value": "a"}]}]}) and _took({"items": [{"value": "a"}]})
    assert not _took({"results": [{"op": "dequeue", "items": []}]}) and not _took({"transaction_id": None, "items": []})
