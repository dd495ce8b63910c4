"""Routing between partitions (docs/partitions.md, "Routing"): a transaction id names its
partition; plain HTTP to any node's own port reaches every partition (forwarded to its leader);
a caller that asks for redirects gets ``421 wrong_partition`` naming the partition and its
leader; a request that spans two partitions is refused with ``409 cross_partition_transaction``
and changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rcq.client import CrossPartitionTransaction, Enqueue, RcqClient, SyncClient
from rcq.local.cluster import LocalCluster
from rcq.names import transaction_partition
from rcq.testing import wait_until
from tests.helpers import LEADER_TIMEOUT_S
from tests.helpers.cli import rcq
from tests.helpers.cluster import partitioned_cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with partitioned_cluster(2, partitions_max=2) as local:  # leaders stay put
        assert local.poll_json(local.url(0) + "/v1/queues/in-p1", method="PUT",
                               body={"partitions": ["p1"]})["settings"]["partitions"] == ["p1"]
        yield local


@pytest.fixture
async def http(cluster: LocalCluster) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {cluster.token}"}) as session:
        yield session


async def call(http: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any] | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with http.request(method, url, json=body, headers=headers, allow_redirects=False) as response:
        return response.status, await response.json()


def follower(cluster: LocalCluster) -> int:
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return next(i for i in range(3) if i != leader)


async def test_plain_http_to_any_node_runs_a_transaction_in_another_partition(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    node = cluster.url(follower(cluster))  # a p0 follower: forwarded straight to p1's leader
    status, begun = await call(http, "POST", f"{node}/v1/transactions", {"partition": "p1"})
    assert status == 201, begun
    transaction_id = begun["transaction_id"]
    assert transaction_id.startswith("p1.") and transaction_partition(transaction_id) == "p1"

    status, enqueued = await call(http, "POST", f"{node}/v1/transactions/{transaction_id}/enqueue",
                                  {"queue": "in-p1", "items": ["a", "b"]})
    assert status == 200 and enqueued["buffered"] == 2, enqueued
    status, committed = await call(http, "POST", f"{cluster.url(0)}/v1/transactions/{transaction_id}/commit", {})
    assert status == 200 and committed["committed"], committed

    for i in range(3):  # any node answers for the transaction and for the queue
        status, described = await call(http, "GET", f"{cluster.url(i)}/v1/transactions/{transaction_id}")
        assert (status, described["state"]) == (200, "committed"), described
        status, counted = await call(http, "GET", f"{cluster.url(i)}/v1/queues/in-p1")
        assert status == 200 and counted["settings"]["partitions"] == ["p1"], counted
        status, placed = await call(http, "GET", f"{cluster.url(i)}/v1/queues/in-p1/placement")
        assert (status, placed) == (200, {"queue": "in-p1", "partitions": ["p1"]})

    # one-request verbs on a node's own port go to the queue's partition
    status, one = await call(http, "POST", f"{node}/v1/queues/in-p1/enqueue", {"items": ["c"]})
    assert status == 200 and transaction_partition(one["transaction_id"]) == "p1", one
    status, received = await call(http, "POST", f"{node}/v1/queues/in-p1/dequeue", {"max_items": 10})
    assert status == 200 and sorted(i["value"] for i in received["results"][0]["items"]) == ["a", "b", "c"]
    status, placed = await call(http, "GET", f"{node}/v1/queues/never-made/placement")
    assert (status, placed["partitions"]) == (200, ["p0"])  # where a first enqueue would create it


async def test_a_caller_that_asks_for_redirects_gets_421_naming_the_partition_and_its_leader(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    redirect = {"Rcq-Redirect": "1"}
    leader = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))
    status, refused = await call(http, "POST", f"{leader}/v1/queues/in-p1/enqueue", {"items": ["x"]}, redirect)
    assert status == 421, refused
    error = refused["error"]
    assert (error["code"], error["retryable"], error["details"]) == (
        "wrong_partition", True, {"partition": "p1", "queue": "in-p1"})
    p1 = {row["name"]: row for row in cluster.partitions()}["p1"]
    assert error["leader_url"] == p1["leader_url"] and p1["leader_url"] in p1["urls"]
    assert len(p1["urls"]) == len(p1["members"]) == 3

    status, refused = await call(http, "POST", f"{leader}/v1/transactions", {"partition": "p1"}, redirect)
    assert (status, refused["error"]["code"]) == (421, "wrong_partition")
    # a partition's own process refuses what belongs to p0, and knows no directory to forward by
    status, begun = await call(http, "POST", f"{leader}/v1/transactions", {})
    assert status == 201 and transaction_partition(begun["transaction_id"]) == "p0"
    status, refused = await call(http, "POST", f"{p1['leader_url']}/v1/transactions/{begun['transaction_id']}/abort")
    assert (status, refused["error"]["code"], refused["error"]["details"]["partition"]) == (
        421, "wrong_partition", "p0")
    status, aborted = await call(http, "POST", f"{leader}/v1/transactions/{begun['transaction_id']}/abort")
    assert status == 200 and aborted["aborted"], aborted
    status, refused = await call(http, "GET", f"{p1['leader_url']}/v1/queues/elsewhere/placement")
    assert (status, refused["error"]["code"]) == (404, "queue_not_found")
    status, refused = await call(http, "POST", f"{leader}/v1/transactions", {"partition": "p9"})
    assert (status, refused["error"]["code"]) == (404, "partition_not_found")


async def test_requests_spanning_two_partitions_are_refused_and_change_nothing(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    node = cluster.url(0)
    status, _ = await call(http, "POST", f"{node}/v1/queues/in-p0/enqueue", {"items": ["keep"]})
    assert status == 200
    status, before_p1 = await call(http, "GET", f"{node}/v1/queues/in-p1")
    assert status == 200

    status, refused = await call(http, "POST", f"{node}/v1/execute", {"operations": [
        {"op": "enqueue", "queue": "in-p0", "items": ["no"]}, {"op": "enqueue", "queue": "in-p1", "items": ["no"]}]})
    assert status == 409, refused
    assert refused["error"]["code"] == "cross_partition_transaction"
    assert refused["error"]["details"] == {"queue": "in-p1", "queue_partitions": ["p1"],
                                           "transaction_partition": "p0"}

    _, in_p0 = await call(http, "POST", f"{node}/v1/transactions", {})
    _, in_p1 = await call(http, "POST", f"{node}/v1/transactions", {"partition": "p1"})
    status, refused = await call(http, "POST", f"{node}/v1/commit", {
        "transaction_ids": [in_p0["transaction_id"], in_p1["transaction_id"]]})
    assert (status, refused["error"]["code"]) == (409, "cross_partition_transaction"), refused
    assert refused["error"]["details"] == {"transaction_partitions": ["p0", "p1"]}
    for begun in (in_p0, in_p1):  # both still open and usable
        status, described = await call(http, "GET", f"{node}/v1/transactions/{begun['transaction_id']}")
        assert (status, described["state"]) == (200, "open"), described
        status, _ = await call(http, "POST", f"{node}/v1/transactions/{begun['transaction_id']}/abort")
        assert status == 200

    status, after_p0 = await call(http, "GET", f"{node}/v1/queues/in-p0")
    status, after_p1 = await call(http, "GET", f"{node}/v1/queues/in-p1")
    assert after_p0["count"] == 1 and after_p1["count"] == before_p1["count"]


async def test_the_client_routes_each_transaction_to_its_queues_partition(cluster: LocalCluster) -> None:
    options = cluster.client_options()
    async with RcqClient(cluster.urls, **options) as client:
        await client.configure_queue("routed", partitions=["p1"])
        await client.enqueue("routed-p0", "stays")
        # This client has seen no partition listing: its first transaction opens in p0, and its first
        # verb, refused there, opens it again in p1 (the empty p0 transaction is aborted).
        async with client.transaction() as tx:
            await tx.enqueue("routed", "a")
            assert tx.partition == "p1" and tx.opened_id.startswith("p1.")
        # Now it knows the cluster has partitions: the server's transaction opens at the first verb.
        tx = await client.begin()
        assert tx.transaction_id is None and tx.partition is None
        await tx.enqueue_batch("routed", ["b", "c"])
        assert tx.partition == "p1"
        with pytest.raises(CrossPartitionTransaction) as refused:
            await tx.enqueue("routed-p0", "never")
        assert refused.value.details == {"queue": "routed-p0", "queue_partitions": ["p0"],
                                         "transaction_partition": "p1"}
        await tx.commit()  # still usable: b and c commit, nothing went to routed-p0
        assert (await client.transaction_status(tx.opened_id))["state"] == "committed"
        assert await client.count("routed") == 3 and await client.count("routed-p0") == 1

        received = await client.receive("routed", 10)
        assert received is not None and received.partition == "p1"
        assert sorted(item.value for item in received.items) == [b"a", b"b", b"c"]
        in_p0 = await client.begin()
        await in_p0.enqueue("routed-p0", "more")
        with pytest.raises(CrossPartitionTransaction):
            await client.commit_many([received, in_p0])  # nothing sent: both still open
        await in_p0.commit()
        await received.abort()
        assert await client.count("routed") == 3 and await client.count("routed-p0") == 2

        peeked = await client.peek("routed")
        assert peeked in (b"a", b"b", b"c")
        result = await client.execute([Enqueue("routed", ["d"])])
        assert result.transaction_id.startswith("p1.")
        assert sorted(await client.dequeue("routed", 10)) == [b"a", b"b", b"c", b"d"]

    def in_sync_client() -> None:
        with SyncClient(cluster.urls, **options) as sync:
            with sync.transaction() as tx:
                tx.enqueue("routed", "sync")
            assert tx.partition == "p1" and sync.dequeue("routed") == [b"sync"]

    await asyncio.to_thread(in_sync_client)


async def test_queues_and_open_transactions_are_listed_over_every_partition(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    node = cluster.url(follower(cluster))
    await call(http, "POST", f"{node}/v1/queues/listed-p1/enqueue", {"items": ["x"]})  # a first enqueue: p0
    status, _ = await call(http, "PUT", f"{node}/v1/queues/listed-in-p1", {"partitions": ["p1"]})
    assert status == 200
    status, enqueued = await call(http, "POST", f"{node}/v1/queues/listed-in-p1/enqueue", {"items": ["y", "z"]})
    assert status == 200, enqueued
    status, listed = await call(http, "GET", f"{node}/v1/queues")
    assert status == 200 and "unanswered" not in listed, listed
    rows = {row["queue"]: row for row in listed["queues"]}
    assert (rows["listed-p1"]["partition"], rows["listed-p1"]["count"]) == ("p0", 1)
    assert (rows["listed-in-p1"]["partition"], rows["listed-in-p1"]["count"]) == ("p1", 2)

    _, in_p1 = await call(http, "POST", f"{node}/v1/transactions", {"partition": "p1", "label": "listed-1"})
    _, in_p0 = await call(http, "POST", f"{node}/v1/transactions", {"label": "listed-0"})
    status, open_now = await call(http, "GET", f"{node}/v1/transactions?label_prefix=listed-")
    assert status == 200, open_now
    assert sorted(t["transaction_id"] for t in open_now["transactions"]) == sorted(
        [in_p0["transaction_id"], in_p1["transaction_id"]])
    for begun in (in_p0, in_p1):
        await call(http, "POST", f"{node}/v1/transactions/{begun['transaction_id']}/abort")


async def test_a_dead_letter_queue_lives_in_its_source_queues_partition(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    node = cluster.url(0)
    assert (await call(http, "PUT", f"{node}/v1/queues/dlq-in-p1", {"partitions": ["p1"]}))[0] == 200
    assert (await call(http, "PUT", f"{node}/v1/queues/dlq-in-p0", {}))[0] == 200
    status, refused = await call(http, "PUT", f"{node}/v1/queues/src-p0", {"dead_letter_queue": "dlq-in-p1"})
    assert (status, refused["error"]["code"]) == (409, "dead_letter_partition_mismatch"), refused
    assert refused["error"]["details"]["dead_letter_queue_partitions"] == ["p1"]
    status, refused = await call(http, "PUT", f"{node}/v1/queues/src-p1",
                                 {"partitions": ["p1"], "dead_letter_queue": "dlq-in-p0"})
    assert (status, refused["error"]["code"]) == (409, "dead_letter_partition_mismatch"), refused
    status, _ = await call(http, "GET", f"{node}/v1/queues/src-p1/placement")
    assert _["partitions"] == ["p0"]  # nothing placed: the refusal wrote no entry
    status, made = await call(http, "PUT", f"{node}/v1/queues/src-p1",
                              {"partitions": ["p1"], "dead_letter_queue": "dlq-in-p1", "max_deliveries": 1})
    assert status == 200 and made["settings"]["dead_letter_queue"] == "dlq-in-p1", made


async def test_a_batch_answers_421_for_each_sub_request_of_another_partition_and_runs_the_rest(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    leader = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))
    status, _ = await call(http, "PUT", f"{leader}/v1/queues/batched-p1", {"partitions": ["p1"]})
    assert status == 200
    _, other = await call(http, "POST", f"{leader}/v1/transactions", {"partition": "p1"})
    status, answer = await call(http, "POST", f"{leader}/v1/batch", {"requests": [
        {"op": "execute", "operations": [{"op": "enqueue", "queue": "batched-p1", "items": ["no"]}]},
        {"op": "execute", "operations": [{"op": "enqueue", "queue": "batched-p0", "items": ["yes"]}]},
        {"op": "abort", "transaction_id": other["transaction_id"]},
        {"op": "begin", "partition": "p1"}]})
    assert status == 200, answer
    statuses = [r["status"] for r in answer["responses"]]
    assert statuses == [421, 200, 421, 421], answer
    assert [r["body"]["error"]["details"]["partition"] for r in answer["responses"] if r["status"] == 421] == \
        ["p1"] * 3
    _, p1_queue = await call(http, "GET", f"{leader}/v1/queues/batched-p1")
    _, p0_queue = await call(http, "GET", f"{leader}/v1/queues/batched-p0")
    assert (p1_queue["count"], p0_queue["count"]) == (0, 1)
    status, described = await call(http, "GET", f"{leader}/v1/transactions/{other['transaction_id']}")
    assert described["state"] == "open"  # its abort was not run


async def test_a_token_and_its_revocation_reach_the_partition_processes(cluster: LocalCluster) -> None:
    assert cluster.poll_json(cluster.url(0) + "/v1/queues/tok-p1", method="PUT",
                             body={"partitions": ["p1"]})["settings"]["partitions"] == ["p1"]
    token = cluster.add_token("tok-user", [{"queues": "tok-*", "actions": ["produce", "consume"]}])
    p1 = {row["name"]: row for row in cluster.partitions()}["p1"]

    async def enqueue_at(url: str) -> int:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
            async with session.post(f"{url}/v1/queues/tok-p1/enqueue", json={"items": ["t"]}) as response:
                return response.status

    # every partition process reads its node's tokens file, and add_token waited for each of them:
    # the new token works at each member at once, and through any node (p1's leader is asked who
    # leads without the caller's token)
    for url in p1["urls"] + cluster.urls:
        assert await enqueue_at(url) in (200, 307, 421), url
    cluster.revoke_token("tok-user")
    for url in p1["urls"] + cluster.urls:
        assert await enqueue_at(url) == 401, url


async def wait_for_async(ask: Any, done: Any, timeout_s: float = 30.0) -> Any:
    """``await ask()`` until ``done(answer)`` (bounded); the last answer."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        answer = await ask()
        if done(answer) or asyncio.get_running_loop().time() > deadline:
            return answer
        await asyncio.sleep(0.1)  # pace: nodes re-read their tokens file about once a second


async def test_a_nodes_metrics_carry_its_partition_processes_series_with_their_partition(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    node = cluster.url(0)
    await call(http, "PUT", f"{node}/v1/queues/metered-p1", {"partitions": ["p1"]})
    await call(http, "POST", f"{node}/v1/queues/metered-p1/enqueue", {"items": ["m"]})
    async with http.get(f"{node}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    partitions = {s.labels.get("partition") for s in families["rcq_raft_term"].samples}
    assert partitions == {None, "p1"}  # this process's series as before, and node-0's p1 process's
    assert any(s.labels.get("partition") == "p1" for s in families["process_resident_memory_bytes"].samples)
    assert families["rcq_partition_metrics_unanswered"].samples[0].value == 0


async def test_the_cli_routes_by_queue(cluster: LocalCluster, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert cluster.token is not None
    monkeypatch.setenv("RCQ_TOKEN", cluster.token)
    urls = [arg for url in cluster.urls for arg in ("--url", url)]
    code, out, err = await rcq(capsys, "queue", "configure", "cli-p1", "--partitions", "p1", "--json", *urls)
    assert code == 0, err
    code, out, err = await rcq(capsys, "enqueue", "--json", *urls, "cli-p1", "a", "b")
    assert code == 0 and json.loads(out)["enqueued"] == 2, (out, err)
    code, out, err = await rcq(capsys, "count", "--json", *urls, "cli-p1")
    assert code == 0 and json.loads(out)["count"] == 2 and json.loads(out)["settings"]["partitions"] == ["p1"]
    code, out, err = await rcq(capsys, "dequeue", "--json", *urls, "cli-p1", "--max", "5")
    assert code == 0 and [i["value"] for i in json.loads(out)["items"]] == ["a", "b"], (out, err)


async def test_a_nodes_digest_and_storage_carry_its_partition_processes(cluster: LocalCluster) -> None:
    node_urls = cluster.urls

    def p1_digests() -> set[str] | None:
        digests = set()
        for url in node_urls:
            answer = cluster.poll_json(url + "/v1/cluster/digest")
            assert "digest" in answer and set(answer["partitions"]) == {"p1"}, answer
            digests.add(f"{answer['partitions']['p1']['digest']}@{answer['partitions']['p1']['applied_index']}")
        return digests if len(digests) == 1 else None

    assert len(await asyncio.to_thread(wait_until, p1_digests, 30.0, what="p1's members converged")) == 1
    storage = cluster.poll_json(node_urls[0] + "/v1/cluster/storage")
    assert storage["storage_bytes"] >= 0 and storage["partitions"]["p1"]["storage_bytes"] > 0, storage


async def test_deleting_a_placed_queue_through_any_node_forgets_its_placement(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    leader = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))
    node = cluster.url(follower(cluster))
    assert (await call(http, "PUT", f"{leader}/v1/queues/moving", {"partitions": ["p1"]}))[0] == 200
    await call(http, "POST", f"{leader}/v1/queues/moving/enqueue", {"items": ["a", "b"]})
    status, deleted = await call(http, "DELETE", f"{node}/v1/queues/moving")  # a follower: to p0's leader, to p1
    assert (status, deleted["deleted"], deleted["removed"]) == (200, True, 2), deleted

    def forgotten() -> bool:
        return all(cluster.poll_json(cluster.url(i) + "/v1/queues/moving/placement")["partitions"] == ["p0"]
                   for i in range(3))

    await asyncio.to_thread(wait_until, forgotten, 30.0, what="every node forgot the placement")
    status, placed = await call(http, "PUT", f"{leader}/v1/queues/moving", {"partitions": ["p0"]})  # placed anew
    assert status == 200 and placed["settings"]["partitions"] == ["p0"], placed
    status, again = await call(http, "DELETE", f"{leader}/v1/queues/never-was")
    assert (status, again["error"]["code"]) == (404, "queue_not_found")


async def test_a_queue_request_a_token_does_not_permit_is_refused_by_the_node_asked_not_forwarded(
        cluster: LocalCluster) -> None:
    """Permissions are checked where the request arrives, before it is forwarded to the queue's
    partition: a partition process re-reads the tokens file on its own clock, so a forward of a
    token it does not know yet would answer 401 where the node asked knows a 403."""
    assert cluster.poll_json(cluster.url(0) + "/v1/queues/perm-p1", method="PUT",
                             body={"partitions": ["p1"]})["settings"]["partitions"] == ["p1"]
    token = cluster.add_token("perm-user", [{"queues": "perm-*", "actions": ["produce"]}])
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        for method, path in (("POST", "purge"), ("POST", "redrive"), ("DELETE", "")):  # manage, not granted
            url = f"{cluster.url(0)}/v1/queues/perm-p1" + (f"/{path}" if path else "")
            async with session.request(method, url, json={} if method == "POST" else None) as response:
                body = await response.json()
                assert (response.status, body["error"]["code"]) == (403, "forbidden"), (method, path, body)
                assert "Rcq-Forwarded-To" not in response.headers, (method, path)
    cluster.revoke_token("perm-user")


async def test_a_queue_placed_while_a_p0_transaction_enqueues_into_it_is_never_created_in_p0(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    """The leader lets the enqueue in (the queue is p0's then); the placement applies before the
    commit; p0's state machine rejects the commit whole, so p0 never holds the queue."""
    node = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))
    status, begun = await call(http, "POST", f"{node}/v1/transactions", {})
    assert status == 201, begun
    transaction_id = begun["transaction_id"]
    status, _ = await call(http, "POST", f"{node}/v1/transactions/{transaction_id}/enqueue",
                           {"queue": "placed-late", "items": ["x"]})
    assert status == 200
    status, placed = await call(http, "PUT", f"{node}/v1/queues/placed-late", {"partitions": ["p1"]})
    assert status == 200 and placed["settings"]["partitions"] == ["p1"], placed
    status, refused = await call(http, "POST", f"{node}/v1/transactions/{transaction_id}/commit", {})
    assert status == 409 and refused["error"]["code"] == "cross_partition_transaction", refused
    assert refused["error"]["details"] == {"queue": "placed-late", "queue_partitions": ["p1"],
                                           "transaction_partition": "p0"}
    status, described = await call(http, "GET", f"{node}/v1/transactions/{transaction_id}")
    assert (status, described["state"]) == (200, "aborted"), described
    status, counted = await call(http, "GET", f"{node}/v1/queues/placed-late")
    assert status == 200 and counted["count"] == 0 and counted["settings"]["partitions"] == ["p1"], counted
    status, listed = await call(http, "GET", f"{node}/v1/queues")
    assert status == 200
    assert [row["partition"] for row in listed["queues"] if row["queue"] == "placed-late"] == ["p1"], listed


def test_readyz_asked_for_partitions_is_ready_only_while_each_partition_process_of_the_node_is(
        cluster: LocalCluster) -> None:
    """Plain /readyz stays p0's readiness (the node forwards the rest); ?partitions=1 asks each of
    the node's partition processes, as a rolling restart must before it stops the next node. This
    test stops (SIGSTOP) one partition process of node 2 and lets it go again."""
    node = cluster.url(2)
    wait_until(lambda: (a := cluster.poll_json(node + "/readyz?partitions=1"))["ready"] and a, LEADER_TIMEOUT_S,
               what="node 2 and its partition processes ready")
    answer = cluster.poll_json(node + "/readyz?partitions=1")
    assert set(answer["partitions"]) == {"p1"} and answer["partitions"]["p1"]["ready"] is True, answer
    assert answer["partitions"]["p1"]["node_id"] == answer["node_id"]
    assert "partitions" not in cluster.poll_json(node + "/readyz")
    pid = cluster.partition_processes(2)["p1"]
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = cluster.poll_json(node + "/readyz?partitions=1")
        assert stopped["ready"] is False and stopped["partitions"] == {"p1": None}, stopped
        assert cluster.poll_json(node + "/readyz")["ready"] is True  # the node itself still serves
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: cluster.poll_json(node + "/readyz?partitions=1")["ready"], LEADER_TIMEOUT_S,
               what="node 2's p1 process ready again")
