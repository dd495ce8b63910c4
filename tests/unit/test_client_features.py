"""The client side of docs/queue-features.md against a recording fake node: what each new argument puts on
the wire (exactly, and nothing when not given), how new answer fields parse, and reject's retry policy.

A fake, not a real node: the point is the exact request bodies of the wire contract, which a server
(any version of it) would accept or refuse without telling the test what it was sent.
"""

from __future__ import annotations

import math
from typing import Any
from unittest.mock import ANY

import aiohttp
import pytest

from rcq.client import (
    CommitOutcomeUnknown,
    DeadLetter,
    Dequeue,
    Enqueue,
    InvalidQueueName,
    InvalidRequest,
    Item,
    RcqClient,
)
from rcq.errors import LeaderChanged, NoLeader
from tests.helpers.fakes import COMMITTED, FULL_ITEM, OLD_ITEM, FakeNode, Wire

TX = "tx-1"
TX_PATH = f"/v1/transactions/{TX}"


PARSED_FULL = Item(17, "jobs.dlq", b"job", delivery_count=2, priority=5, enqueued_at_ms=1795000000000,
                   dead_letter=DeadLetter("max_deliveries", "jobs", 3), expires_at_ms=1795000060000)
PARSED_OLD = Item(18, "jobs.dlq", b"old", delivery_count=0, priority=0, enqueued_at_ms=None, dead_letter=None,
                  expires_at_ms=None)


# ------------------------------------------------------------------ enqueue options
async def test_transactional_enqueues_send_the_options_given_and_no_others(fake: FakeNode, client: RcqClient):
    fake.answer("POST", f"{TX_PATH}/enqueue", {"buffered": 1})
    tx = client.attach(TX)
    await tx.enqueue("q", b"a")
    await tx.enqueue("q", "b", priority=3)
    await tx.enqueue_batch("q", [b"c", b"d"], priority=0, delay_s=1.5, ttl_s=60)
    await tx.enqueue_batch("q", [b"e"], delay_s=0)
    assert fake.bodies("POST", f"{TX_PATH}/enqueue") == [
        {"queue": "q", "items": ["a"], "encoding": "utf-8", "key": ANY},
        {"queue": "q", "items": ["b"], "encoding": "utf-8", "priority": 3, "key": ANY},
        {"queue": "q", "items": ["c", "d"], "encoding": "utf-8", "priority": 0, "delay_s": 1.5, "ttl_s": 60,
         "key": ANY},
        {"queue": "q", "items": ["e"], "encoding": "utf-8", "delay_s": 0, "key": ANY},
    ]


async def test_a_coalesced_transactional_enqueue_carries_the_options(fake: FakeNode):
    fake.answer("BATCH", "enqueue", {"buffered": 1})
    async with RcqClient(fake.url, coalesce=True) as client:
        await client.attach(TX).enqueue("q", b"a", ttl_s=2.5)
    assert fake.bodies("BATCH", "enqueue") == [
        {"op": "enqueue", "transaction_id": TX, "queue": "q", "items": ["a"], "encoding": "utf-8", "ttl_s": 2.5,
         "key": ANY}]


async def test_one_request_enqueue_sends_the_options_in_both_forms(fake: FakeNode, client: RcqClient):
    fake.answer("POST", "/v1/queues/q/enqueue", COMMITTED)
    info = await client.enqueue("q", b"a", b"b", idempotency_key="k1", priority=9, delay_s=2, ttl_s=0.5)
    assert info.index == 7
    await client.enqueue("q", b"c", idempotency_key="k2")
    assert fake.bodies("POST", "/v1/queues/q/enqueue") == [
        {"items": ["a", "b"], "encoding": "utf-8", "priority": 9, "delay_s": 2, "ttl_s": 0.5, "idempotency_key": "k1"},
        {"items": ["c"], "encoding": "utf-8", "idempotency_key": "k2"},
    ]
    fake.answer("BATCH", "execute", COMMITTED)
    async with RcqClient(fake.url, coalesce=True) as coalescing:
        await coalescing.enqueue("q", b"a", idempotency_key="k3", priority=1)
    assert fake.bodies("BATCH", "execute") == [
        {"op": "execute", "idempotency_key": "k3", "operations": [
            {"op": "enqueue", "queue": "q", "items": ["a"], "encoding": "utf-8", "priority": 1}]}]


async def test_execute_sends_an_enqueue_operations_options(fake: FakeNode, client: RcqClient):
    fake.answer("POST", "/v1/execute", {**COMMITTED, "results": [
        {"op": "enqueue", "queue": "q", "enqueued": 1}, {"op": "enqueue", "queue": "r", "enqueued": 1}]})
    await client.execute([Enqueue("q", [b"a"], priority=4, delay_s=10, ttl_s=3600), Enqueue("r", [b"b"])],
                         idempotency_key="k")
    assert fake.bodies("POST", "/v1/execute") == [{"idempotency_key": "k", "operations": [
        {"op": "enqueue", "queue": "q", "items": ["a"], "encoding": "utf-8", "priority": 4, "delay_s": 10,
         "ttl_s": 3600},
        {"op": "enqueue", "queue": "r", "items": ["b"], "encoding": "utf-8"}]}]


def test_enqueue_options_are_keyword_only():
    with pytest.raises(TypeError):
        Enqueue("q", [b"a"], 3)


@pytest.mark.parametrize("options", [
    {"priority": 256}, {"priority": -1}, {"priority": True}, {"priority": 1.0}, {"priority": "1"},
    {"delay_s": -0.5}, {"delay_s": math.nan}, {"delay_s": math.inf}, {"delay_s": "1"},
    {"ttl_s": 0}, {"ttl_s": -1}, {"ttl_s": math.nan}, {"ttl_s": False},
], ids=str)
async def test_bad_enqueue_options_are_refused_before_sending(fake: FakeNode, client: RcqClient,
                                                              options: dict[str, Any]):
    name = next(iter(options))
    with pytest.raises(InvalidRequest, match=f"^{name} must be "):
        await client.enqueue("q", b"a", **options)
    with pytest.raises(InvalidRequest, match=f"^{name} must be "):
        await client.attach(TX).enqueue("q", b"a", **options)
    with pytest.raises(InvalidRequest, match=f"^{name} must be "):
        await client.execute([Enqueue("q", [b"a"], **options)])
    assert fake.requests == []


# ---------------------------------------------------------------- dequeued items
async def test_dequeued_items_carry_the_new_fields_and_default_without_them(fake: FakeNode, client: RcqClient):
    fake.answer("POST", f"{TX_PATH}/dequeue", {"items": [FULL_ITEM, OLD_ITEM]})
    tx = client.attach(TX)
    assert await tx.dequeue_items("jobs.dlq", 2) == [PARSED_FULL, PARSED_OLD]
    assert await tx.dequeue_batch("jobs.dlq", 2) == [b"job", b"old"]  # still bytes
    assert await tx.dequeue("jobs.dlq") == b"job"


async def test_one_request_dequeues_and_execute_results_carry_the_new_fields(fake: FakeNode, client: RcqClient):
    answer = {**COMMITTED, "enqueued": 0, "dequeued": 2,
              "results": [{"op": "dequeue", "queue": "jobs.dlq", "items": [FULL_ITEM, OLD_ITEM]}]}
    fake.answer("POST", "/v1/queues/jobs.dlq/dequeue", answer)
    fake.answer("POST", "/v1/execute", answer)
    assert await client.dequeue_items("jobs.dlq", 2, wait_ms=5) == [PARSED_FULL, PARSED_OLD]
    assert await client.dequeue("jobs.dlq", 2) == [b"job", b"old"]  # still bytes
    assert fake.bodies("POST", "/v1/queues/jobs.dlq/dequeue") == [{"max_items": 2, "wait_ms": 5},
                                                                  {"max_items": 2, "wait_ms": 0}]
    result = await client.execute([Dequeue("jobs.dlq", 2)])
    assert result.results[0].items == (PARSED_FULL, PARSED_OLD)


# ----------------------------------------------------------------------- reject
async def test_reject_sends_item_ids_from_ints_or_items_and_the_reason_only_when_given(fake: FakeNode,
                                                                                       client: RcqClient):
    fake.answer("POST", f"{TX_PATH}/reject",
                {"transaction_id": TX, "queue": "jobs", "rejected": 2, "dead_letter_queue": "jobs.dlq"})
    tx = client.attach(TX)
    assert await tx.reject("jobs", [3, Item(4, "jobs", b"x")]) == 2
    assert await tx.reject("jobs", (i for i in [5]), reason="malformed payload") == 2
    assert fake.bodies("POST", f"{TX_PATH}/reject") == [
        {"queue": "jobs", "item_ids": [3, 4]},
        {"queue": "jobs", "item_ids": [5], "reason": "malformed payload"},
    ]
    assert tx.state == "open"  # the transaction goes on without them


async def test_a_coalesced_reject_is_a_batch_part(fake: FakeNode):
    fake.answer("BATCH", "reject", {"transaction_id": TX, "queue": "jobs", "rejected": 1, "dead_letter_queue": None})
    async with RcqClient(fake.url, coalesce=True) as client:
        assert await client.attach(TX).reject("jobs", [9], reason="bad") == 1
    assert fake.bodies("BATCH", "reject") == [
        {"op": "reject", "transaction_id": TX, "queue": "jobs", "item_ids": [9], "reason": "bad"}]


@pytest.mark.parametrize(("queue", "entries", "error", "message"), [
    ("jobs", [Item(4, "other", b"x")], InvalidRequest, "item 4 was dequeued from 'other', not 'jobs'"),
    ("jobs", [True], InvalidRequest, "item ids or Items, not bool"),
    ("jobs", ["4"], InvalidRequest, "item ids or Items, not str"),
    ("no spaces", [4], InvalidQueueName, "bad queue name"),
], ids=["other-queue", "bool", "str", "queue-name"])
async def test_bad_rejects_are_refused_before_sending(fake: FakeNode, client: RcqClient, queue: str,
                                                      entries: list[Any], error: type[Exception], message: str):
    with pytest.raises(error, match=message):
        await client.attach(TX).reject(queue, entries)
    assert fake.requests == []


async def test_a_reject_whose_answer_was_lost_is_not_resent(fake: FakeNode):
    fake.answer("POST", f"{TX_PATH}/reject", {"transaction_id": TX, "queue": "jobs", "rejected": 1,
                                              "dead_letter_queue": None})
    recorder = Wire()
    recorder.lose[f"{TX_PATH}/reject"] = 1
    async with aiohttp.ClientSession(middlewares=[recorder]) as session, \
            RcqClient(fake.url, session=session, retry_timeout_s=2) as client:
        with pytest.raises(CommitOutcomeUnknown, match="cannot safely be re-sent") as raised:
            await client.attach(TX).reject("jobs", [1])
    assert raised.value.maybe_committed
    assert recorder.count("/reject") == 1  # a repeat would meet items no longer held, and fail


async def test_a_reject_that_certainly_did_not_execute_is_resent(fake: FakeNode, client: RcqClient):
    fake.answer("POST", f"{TX_PATH}/reject", NoLeader().to_body(), status=503)
    fake.answer("POST", f"{TX_PATH}/reject", {"transaction_id": TX, "queue": "jobs", "rejected": 1,
                                              "dead_letter_queue": "jobs.dlq"})
    assert await client.attach(TX).reject("jobs", [1]) == 1
    assert len(fake.bodies("POST", f"{TX_PATH}/reject")) == 2


# ---------------------------------------------------------------------- redrive
async def test_redrive_sends_only_the_limits_given_and_returns_the_answer(fake: FakeNode, client: RcqClient):
    answer = {"queue": "jobs.dlq", "redriven": 3, "by_queue": {"jobs": 2, "other": 1}}
    fake.answer("POST", "/v1/queues/jobs.dlq/redrive", answer)
    assert await client.redrive("jobs.dlq") == answer
    await client.redrive("jobs.dlq", max_items=5)
    await client.redrive("jobs.dlq", max_items=10, source_queue="jobs")
    assert fake.bodies("POST", "/v1/queues/jobs.dlq/redrive") == [
        {}, {"max_items": 5}, {"max_items": 10, "source_queue": "jobs"}]


async def test_redrive_refuses_bad_queue_names_before_sending(fake: FakeNode, client: RcqClient):
    with pytest.raises(InvalidQueueName):
        await client.redrive("a/b")
    with pytest.raises(InvalidQueueName):
        await client.redrive("dlq", source_queue="..")
    assert fake.requests == []


# --------------------------------------------------------------------- settings
async def test_configure_queue_sends_the_limits_always_and_newer_settings_when_given(fake: FakeNode,
                                                                                     client: RcqClient):
    settings = {"max_items": 100, "max_bytes": None, "max_deliveries": 3, "dead_letter_queue": "jobs.dlq",
                "default_ttl_s": 86400.0, "default_delay_s": 0, "max_priority": 9}
    fake.answer("PUT", "/v1/queues/jobs", {"queue": "jobs", "settings": settings, "limits": {}})
    answer = await client.configure_queue("jobs", **settings)
    assert answer["settings"] == settings
    await client.configure_queue("jobs", max_bytes=1000)
    await client.configure_queue("jobs", max_priority=0)
    assert fake.bodies("PUT", "/v1/queues/jobs") == [
        settings,
        {"max_items": None, "max_bytes": 1000},  # what an older server takes
        {"max_items": None, "max_bytes": None, "max_priority": 0},
    ]


async def test_configure_queue_refuses_a_bad_dead_letter_queue_name_before_sending(fake: FakeNode,
                                                                                    client: RcqClient):
    with pytest.raises(InvalidQueueName):
        await client.configure_queue("jobs", dead_letter_queue="no spaces")
    assert fake.requests == []


# ------------------------------------------------------- leader_changed on one-request transactions
async def test_a_one_request_enqueue_aborted_by_a_leader_change_is_retried_under_the_same_key(
        fake: FakeNode, client: RcqClient):
    fake.answer("POST", "/v1/queues/q/enqueue", LeaderChanged("aborted").to_body(), status=409)
    fake.answer("POST", "/v1/queues/q/enqueue", COMMITTED)
    info = await client.enqueue("q", b"x")
    assert info.index == 7
    sent = fake.bodies("POST", "/v1/queues/q/enqueue")
    assert len(sent) == 2 and sent[0]["idempotency_key"] == sent[1]["idempotency_key"]


async def test_a_one_request_enqueue_gives_up_on_leader_changed_when_the_budget_is_spent(fake: FakeNode):
    fake.answer("POST", "/v1/queues/q/enqueue", LeaderChanged("aborted").to_body(), status=409)
    async with RcqClient(fake.url, retry_timeout_s=0.3) as client:
        with pytest.raises(LeaderChanged):
            await client.enqueue("q", b"x")
    assert len(fake.bodies("POST", "/v1/queues/q/enqueue")) >= 2


async def test_an_interactive_commit_aborted_by_a_leader_change_is_not_retried(fake: FakeNode, client: RcqClient):
    fake.answer("POST", f"{TX_PATH}/commit", LeaderChanged("aborted").to_body(), status=409)
    with pytest.raises(LeaderChanged):
        await client.attach(TX).commit()
    assert len(fake.bodies("POST", f"{TX_PATH}/commit")) == 1  # its transaction died with the old leader
