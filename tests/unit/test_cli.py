"""The client verbs of ``rcq`` end to end: ``rcq.cli.main`` in a thread against an in-process node, and
against a recording fake node for what the flags of docs/queue-features.md put on the wire."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from unittest.mock import ANY

import pytest

from rcq.cli import main
from rcq.server.config import NodeConfig
from tests.helpers.cli import rcq
from tests.helpers.fakes import COMMITTED, FULL_ITEM, OLD_ITEM, FakeNode
from tests.helpers.nodes import serving_node


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    async with serving_node(NodeConfig(node_id="n1", http_port=0, raft_address="127.0.0.1:10001",
                                       data_dir=tmp_path, insecure=True)) as node_url:
        yield node_url


@pytest.fixture
def dead_url() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_enqueue_count_peek_dequeue_for_people(url: str, capsys):
    code, out, _ = await rcq(capsys, "enqueue", "--url", url, "jobs", "first", "second")
    assert code == 0 and out == "enqueued 2 items into jobs (commit index 2)\n"
    assert await rcq(capsys, "count", "--url", url, "jobs") == (0, "2\n", "")
    assert await rcq(capsys, "peek", "--url", url, "jobs") == (0, "first\n", "")
    assert await rcq(capsys, "count", "--url", url, "jobs") == (0, "2\n", "")  # peek consumed nothing
    assert await rcq(capsys, "dequeue", "--url", url, "jobs", "--max", "5") == (0, "first\nsecond\n", "")
    code, out, err = await rcq(capsys, "dequeue", "--url", url, "jobs", "--wait-ms", "50")
    assert (code, out, err) == (0, "", "(queue jobs is empty)\n")


async def test_json_output_for_machines(url: str, capsys):
    code, out, _ = await rcq(capsys, "enqueue", "--json", "--url", url, "q", "a", "b")
    enqueued = json.loads(out)
    assert code == 0 and (enqueued["queue"], enqueued["enqueued"], enqueued["duplicate"]) == ("q", 2, False)
    code, out, _ = await rcq(capsys, "count", "--json", "--url", url, "q")
    assert code == 0 and json.loads(out)["count"] == 2 and json.loads(out)["locked"] == 0
    code, out, _ = await rcq(capsys, "queues", "--json", "--url", url)
    assert code == 0 and json.loads(out) == [{"queue": "q", "count": 2, "locked": 0, "partition": "p0"}]
    code, out, _ = await rcq(capsys, "dequeue", "--json", "--url", url, "q", "--max", "9")
    assert code == 0 and json.loads(out) == {"queue": "q", "items": [
        {"value": "a", "encoding": "utf-8", "delivery_count": 0, "priority": 0},
        {"value": "b", "encoding": "utf-8", "delivery_count": 0, "priority": 0}]}


async def test_binary_items_go_in_and_come_out_as_base64(url: str, capsys):
    binary = bytes(range(256))
    encoded = base64.b64encode(binary).decode()
    assert (await rcq(capsys, "enqueue", "--base64", "--url", url, "bin", encoded))[0] == 0
    assert await rcq(capsys, "peek", "--url", url, "bin") == (0, f"base64:{encoded}\n", "")
    code, out, _ = await rcq(capsys, "dequeue", "--json", "--url", url, "bin")
    assert code == 0 and json.loads(out)["items"] == [  # the peek was a delivery (dequeue + abort)
        {"value": encoded, "encoding": "base64", "delivery_count": 1, "priority": 0}]


async def test_urls_come_from_the_environment(url: str, capsys, monkeypatch):
    monkeypatch.setenv("RCQ_URLS", f" {url}/ ,")
    assert (await rcq(capsys, "enqueue", "q", "x"))[0] == 0
    assert await rcq(capsys, "count", "q") == (0, "1\n", "")


async def test_queues_table(url: str, capsys):
    await rcq(capsys, "enqueue", "--url", url, "alpha", "1", "2")
    await rcq(capsys, "enqueue", "--url", url, "b", "3")
    code, out, _ = await rcq(capsys, "queues", "--url", url)
    assert code == 0 and out.splitlines() == ["QUEUE  COUNT  LOCKED", "alpha  2      0", "b      1      0"]


async def test_errors_print_code_and_message_and_exit_non_zero(url: str, capsys, monkeypatch):
    code, out, err = await rcq(capsys, "enqueue", "--url", url, "bad name", "x")
    assert code == 2 and out == "" and err.startswith("rcq: invalid_queue_name: ")
    code, _, err = await rcq(capsys, "enqueue", "--base64", "--url", url, "q", "not base64!")
    assert code == 2 and err.startswith("rcq: invalid_request: an ITEM is not valid base64")
    monkeypatch.delenv("RCQ_URLS", raising=False)
    code, _, err = await rcq(capsys, "count", "q")
    assert code == 2 and err == "rcq: invalid_request: no node URL: pass --url or set RCQ_URLS\n"


async def test_an_unreachable_cluster_is_an_error(dead_url: str, capsys):
    code, out, err = await rcq(capsys, "count", "--retry-timeout-s", "0.2", "--url", dead_url, "q")
    assert code == 2 and out == "" and err.startswith("rcq: unavailable: cannot connect to")


async def test_status_shows_every_node_and_fails_when_one_is_down(url: str, dead_url: str, capsys):
    code, out, err = await rcq(capsys, "status", "--url", url)
    lines = out.splitlines()
    assert code == 0 and err == "" and lines[0].split() == [
        "URL", "NODE", "ROLE", "TERM", "LEADER", "SERVING", "COMMIT", "APPLIED", "OPEN_TX"]
    assert lines[1].split()[:4] == [url, "n1", "leader", "1"]

    code, out, err = await rcq(capsys, "status", "--url", url, "--url", dead_url)
    assert code == 1
    assert out.splitlines()[2].split()[:3] == [dead_url, "-", "unreachable"]
    assert err.startswith(f"rcq: unavailable: {dead_url}: cannot connect")

    code, out, _ = await rcq(capsys, "status", "--json", "--url", url, "--url", dead_url)
    nodes = json.loads(out)["nodes"]
    assert code == 1 and [n["ok"] for n in nodes] == [True, False]
    assert nodes[0]["status"]["role"] == "leader" and nodes[1]["error"]["code"] == "unavailable"


# ------------------------------------------------------- docs/queue-features.md
async def test_enqueue_flags_reach_the_request_body(fake: FakeNode, capsys):
    fake.answer("POST", "/v1/queues/jobs/enqueue", COMMITTED)
    code, out, _ = await rcq(capsys, "enqueue", "--url", fake.url, "jobs", "a", "--priority", "7", "--delay-s", "1.5",
                             "--ttl-s", "60")
    assert code == 0 and out == "enqueued 1 item into jobs (commit index 7)\n"
    assert (await rcq(capsys, "enqueue", "--url", fake.url, "jobs", "b"))[0] == 0
    assert fake.bodies("POST", "/v1/queues/jobs/enqueue") == [
        {"items": ["a"], "encoding": "utf-8", "priority": 7, "delay_s": 1.5, "ttl_s": 60.0, "idempotency_key": ANY},
        {"items": ["b"], "encoding": "utf-8", "idempotency_key": ANY},
    ]


async def test_bad_enqueue_flags_are_clear_errors_and_send_nothing(fake: FakeNode, capsys):
    code, out, err = await rcq(capsys, "enqueue", "--url", fake.url, "jobs", "a", "--priority", "256")
    assert (code, out) == (2, "") and err == "rcq: invalid_request: priority must be an integer from 0 to 255, not 256\n"
    code, _, err = await rcq(capsys, "enqueue", "--url", fake.url, "jobs", "a", "--ttl-s", "0")
    assert code == 2 and err.startswith("rcq: invalid_request: ttl_s must be a finite number of seconds > 0")
    for flag, value in (("--delay-s", "nan"), ("--ttl-s", "soon"), ("--priority", "high")):
        with pytest.raises(SystemExit) as raised:
            main(["enqueue", "--url", fake.url, "jobs", "a", flag, value])
        assert raised.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err
    assert fake.requests == []


async def test_dequeue_json_shows_delivery_count_priority_and_dead_letter(fake: FakeNode, capsys):
    fake.answer("POST", "/v1/queues/jobs.dlq/dequeue", {**COMMITTED, "results": [
        {"op": "dequeue", "queue": "jobs.dlq", "items": [FULL_ITEM, OLD_ITEM]}]})
    code, out, _ = await rcq(capsys, "dequeue", "--json", "--url", fake.url, "jobs.dlq", "--max", "2")
    assert code == 0 and json.loads(out) == {"queue": "jobs.dlq", "items": [
        {"value": "job", "encoding": "utf-8", "delivery_count": 2, "priority": 5, "expires_at_ms": 1795000060000,
         "dead_letter": {"reason": "max_deliveries", "source_queue": "jobs", "delivery_count": 3}},
        {"value": "old", "encoding": "utf-8", "delivery_count": 0, "priority": 0}]}
    # for people: one value per line, as before
    assert await rcq(capsys, "dequeue", "--url", fake.url, "jobs.dlq", "--max", "2") == (0, "job\nold\n", "")
    assert fake.bodies("POST", "/v1/queues/jobs.dlq/dequeue") == [{"max_items": 2, "wait_ms": 0}] * 2


async def test_queue_configure_flags_reach_the_put_body(fake: FakeNode, capsys):
    settings = {"max_items": 10, "max_bytes": None, "max_deliveries": 3, "dead_letter_queue": "jobs.dlq",
                "default_ttl_s": 3600.0, "default_delay_s": 0.5, "max_priority": 9}
    fake.answer("PUT", "/v1/queues/jobs", {"queue": "jobs", "settings": settings, "limits": {}})
    code, out, _ = await rcq(capsys, "queue", "configure", "jobs", "--url", fake.url, "--max-items", "10",
                             "--max-deliveries", "3", "--dead-letter-queue", "jobs.dlq", "--default-ttl-s", "3600",
                             "--default-delay-s", "0.5", "--max-priority", "9")
    assert code == 0 and json.loads(out)["settings"] == settings
    assert (await rcq(capsys, "queue", "set", "jobs", "--url", fake.url, "--max-bytes", "99"))[0] == 0
    assert fake.bodies("PUT", "/v1/queues/jobs") == [settings, {"max_items": None, "max_bytes": 99}]


async def test_queue_redrive_sends_its_flags_and_says_where_items_went(fake: FakeNode, capsys):
    answer = {"queue": "jobs.dlq", "redriven": 3, "by_queue": {"other": 1, "jobs": 2}}
    fake.answer("POST", "/v1/queues/jobs.dlq/redrive", answer)
    code, out, _ = await rcq(capsys, "queue", "redrive", "jobs.dlq", "--url", fake.url)
    assert code == 0 and out == "redrove jobs.dlq: 3 item(s) moved back (2 to jobs, 1 to other)\n"
    code, out, _ = await rcq(capsys, "queue", "redrive", "jobs.dlq", "--json", "--url", fake.url, "--max-items", "5",
                             "--source-queue", "jobs")
    assert code == 0 and json.loads(out) == answer
    assert fake.bodies("POST", "/v1/queues/jobs.dlq/redrive") == [{}, {"max_items": 5, "source_queue": "jobs"}]


@pytest.mark.parametrize(("argv", "message"), [
    (["show", "jobs", "--max-deliveries", "3"], "--max-deliveries goes with rcq queue configure, not show"),
    (["purge", "jobs", "--max-items", "3"], "--max-items goes with rcq queue configure or redrive, not purge"),
    (["redrive", "dlq", "--max-bytes", "3"], "--max-bytes goes with rcq queue configure, not redrive"),
    (["configure", "jobs", "--source-queue", "q"], "--source-queue goes with rcq queue redrive, not configure"),
], ids=["show", "purge", "redrive", "configure"])
async def test_a_queue_flag_of_another_action_is_an_error(fake: FakeNode, capsys, argv: list[str], message: str):
    code, out, err = await rcq(capsys, "queue", *argv, "--url", fake.url)
    assert (code, out, err) == (2, "", f"rcq: invalid_request: {message}\n")
    assert fake.requests == []


async def test_queue_configure_refuses_seconds_that_are_not_numbers(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["queue", "configure", "jobs", "--url", "http://127.0.0.1:1", "--default-ttl-s", "inf"])
    assert raised.value.code == 2
    assert "argument --default-ttl-s: 'inf' is not a number of seconds" in capsys.readouterr().err
