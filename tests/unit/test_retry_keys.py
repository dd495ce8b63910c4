"""Retry keys (feature level 3; rcq.server.core.outcomes): the client library's own idempotency
keys are kept 10 minutes (at least 2) in a table of their own, so that thousands of one-request
commits a second do not fill the day-long table of users' keys (500,000 keys, at least 15
minutes each: a sustained 3,300 keyed commits a second were refused after 143 seconds)."""

from __future__ import annotations

import pytest

from rcq.client.wire import retry_key
from rcq.limits import RETRY_KEY_PREFIX
from rcq.server.core.commands import SetLevel, encode
from rcq.server.core.features import LEVEL_OF_RETRY_KEYS
from rcq.server.core.outcomes import Retention, TransactionOutcome, TransactionRecords
from rcq.server.core.state_machine import (
    IDEMPOTENCY_RETENTION_MIN_MS,
    RETRY_KEY_RETENTION_MIN_MS,
    RETRY_KEY_RETENTION_MS,
    QueueStateMachine,
)
from tests.helpers.state import Node, tx, unit

RETRY = RETRY_KEY_PREFIX + "0123456789abcdef0123456789abcdef"


def at_level(level: int) -> Node:
    node = Node()
    if level > 1:
        node.apply_raw(encode(SetLevel(node.term, node.now_ms, level, "9.9.9")))
    return node


def sizes(node: Node) -> tuple[int, int]:
    table = node.sm.table_sizes()
    return table["idempotency_keys"], table["retry_keys"]


def test_the_client_makes_retry_keys_of_128_random_bits() -> None:
    keys = {retry_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(k.startswith(RETRY_KEY_PREFIX) and len(k) == len(RETRY_KEY_PREFIX) + 32 for k in keys)


def test_at_level_3_a_retry_key_has_its_own_table_and_a_retry_answers_duplicate() -> None:
    node = at_level(LEVEL_OF_RETRY_KEYS)
    first = node.commit_one(unit(tx("t1", [("q", [b"a"])]), key=RETRY))
    assert first.status == "committed" and sizes(node) == (0, 1)
    again = node.commit_one(unit(tx("t2", [("q", [b"a"])]), key=RETRY))  # the retry: a new transaction
    assert (again.status, again.index) == ("duplicate", first.index)
    assert node.commit_one(unit(tx("t3", [("q", [b"b"])]), key="users-own")).status == "committed"
    assert sizes(node) == (1, 1) and node.sm.count("q") == 2
    assert node.sm.idempotency_key_index(RETRY) == first.index


def test_below_level_3_a_retry_key_is_an_idempotency_key_as_older_releases_keep_it() -> None:
    node = at_level(2)
    assert node.commit_one(unit(tx("t1", [("q", [b"a"])]), key=RETRY)).status == "committed"
    assert sizes(node) == (1, 0)
    assert node.sm.snapshot_meta().get("retry_keys") is None  # a level-2 snapshot keeps its shape


def test_a_retry_across_the_raise_to_level_3_is_still_a_duplicate() -> None:
    # Committed at level 2 (in the day-long table), retried after the raise: both tables are asked.
    node = at_level(2)
    first = node.commit_one(unit(tx("t1", [("q", [b"a"])]), key=RETRY))
    node.apply_raw(encode(SetLevel(node.term, node.now_ms, LEVEL_OF_RETRY_KEYS, "9.9.9")))
    assert node.commit_one(unit(tx("t2", [("q", [b"a"])]), key=RETRY)).status == "duplicate"
    assert node.sm.count("q") == 1 and first.status == "committed"


def test_a_retry_key_is_forgotten_after_ten_minutes_a_users_key_after_a_day() -> None:
    node = at_level(LEVEL_OF_RETRY_KEYS)
    node.commit_one(unit(tx("t1", [("q", [b"a"])]), key=RETRY))
    node.commit_one(unit(tx("t2", [("q", [b"b"])]), key="users-own"))
    node.now_ms += RETRY_KEY_RETENTION_MS + 1
    node.commit_one(unit(tx("t3", [("q", [b"c"])])))  # any entry forgets by its time
    assert sizes(node) == (1, 0)
    assert node.sm.idempotency_key_index(RETRY) is None and node.sm.idempotency_key_index("users-own") is not None


def test_a_snapshot_at_level_3_keeps_the_retry_keys_in_order() -> None:
    node = at_level(LEVEL_OF_RETRY_KEYS)
    for number in range(3):
        node.now_ms += 1
        node.commit_one(unit(tx(f"t{number}", [("q", [b"x"])]), key=f"{RETRY_KEY_PREFIX}{number}"))
    meta = node.sm.snapshot_meta()
    assert [k for k, _, _ in meta["retry_keys"]] == [f"{RETRY_KEY_PREFIX}{n}" for n in range(3)]
    restored = QueueStateMachine()
    restored.restore(meta, list(node.sm.snapshot_items()))
    assert restored.digest() == node.sm.digest()
    copy = Node(restored)
    assert copy.commit_one(unit(tx("t9", [("q", [b"x"])]), key=f"{RETRY_KEY_PREFIX}1")).status == "duplicate"
    assert copy.commit_one(unit(tx("t10", [("q", [b"y"])]), key=f"{RETRY_KEY_PREFIX}7")).status == "committed"
    assert restored.table_sizes()["retry_keys"] == 4


@pytest.mark.parametrize("full", ["users", "retry"])
def test_a_full_table_refuses_only_keys_of_its_own_kind(full: str) -> None:
    # Small tables, the same rules: a unit under a key of the full kind is refused, the other kind
    # and unkeyed units still commit.
    records = TransactionRecords(outcomes=Retention(600_000, 120_000, 1_000),
                                 keys=Retention(86_400_000, IDEMPOTENCY_RETENTION_MIN_MS, 3),
                                 retry_keys=Retention(RETRY_KEY_RETENTION_MS, RETRY_KEY_RETENTION_MIN_MS, 3))
    records.retry_keys_on = True
    prefix = "" if full == "users" else RETRY_KEY_PREFIX
    other = RETRY_KEY_PREFIX if full == "users" else ""
    for number in range(3):
        assert records.room_problem(unit(tx(f"t{number}"), key=f"{prefix}k{number}"), 1_000) is None
        records.record(unit(tx(f"t{number}"), key=f"{prefix}k{number}"), _committed(number))
    assert records.room_problem(unit(tx("t7"), key=f"{prefix}k7"), 1_000) == "idempotency_keys_full"
    assert not records.can_remember(1, f"{prefix}k7", 1_000)
    assert records.can_remember(1, f"{other}k7", 1_000) and records.can_remember(1, None, 1_000)
    assert records.room_problem(unit(tx("t8"), key=f"{other}k8"), 1_000) is None


def test_thousands_of_retry_keyed_commits_a_second_are_not_refused_when_users_keys_would_be() -> None:
    # The 500,000-key table at 15 minutes' minimum took 555 keyed commits a second; retry keys,
    # 1,000,000 at 2 minutes, take 8,333. Scaled down 1,000 times: 500 and 1,000 keys.
    def refused(prefix: str, per_s: int, seconds: int) -> int:
        records = TransactionRecords(outcomes=Retention(600_000, 120_000, 10**9),
                                     keys=Retention(86_400_000, IDEMPOTENCY_RETENTION_MIN_MS, 500),
                                     retry_keys=Retention(RETRY_KEY_RETENTION_MS, RETRY_KEY_RETENTION_MIN_MS, 1_000))
        records.retry_keys_on = True
        count = 0
        for second in range(seconds):
            now_ms = second * 1000
            records.expire(now_ms)
            for number in range(per_s):
                key_unit = unit(tx(f"t{second}.{number}"), key=f"{prefix}{second}.{number}")
                if records.room_problem(key_unit, now_ms) is not None:
                    count += 1
                    continue
                records.record(key_unit, _committed(second))
        return count

    assert refused("", 4, 300) > 0  # users' keys: 4 a second fill 500 before 15 minutes
    assert refused(RETRY_KEY_PREFIX, 4, 300) == 0  # retry keys: forgotten after 2 minutes under pressure


def _committed(index: int) -> TransactionOutcome:
    return TransactionOutcome("committed", index, 1_000)
