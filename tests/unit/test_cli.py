"""The client verbs of ``rcq`` end to end: ``rcq.cli.main`` in a thread against an in-process node."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rcq.cli import main
from rcq.server.config import NodeConfig
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, wait_until


@contextlib.asynccontextmanager
async def serving_node(config: NodeConfig) -> AsyncIterator[str]:
    """An in-process node (in-memory replication) serving HTTP; yields its URL."""
    node = Node(config, replicator=InMemoryReplicator())
    await node.start()
    try:
        await wait_until(lambda: node.manager.serving, 5, message="node serving")
        yield f"http://127.0.0.1:{node.port}"
    finally:
        await node.stop()


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


async def rcq(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``rcq ARGV...`` (its own event loop, in a thread); return (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


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
    assert code == 0 and json.loads(out) == [{"queue": "q", "count": 2, "locked": 0}]
    code, out, _ = await rcq(capsys, "dequeue", "--json", "--url", url, "q", "--max", "9")
    assert code == 0 and json.loads(out) == {"queue": "q", "items": [{"value": "a", "encoding": "utf-8"},
                                                        {"value": "b", "encoding": "utf-8"}]}


async def test_binary_items_go_in_and_come_out_as_base64(url: str, capsys):
    binary = bytes(range(256))
    encoded = base64.b64encode(binary).decode()
    assert (await rcq(capsys, "enqueue", "--base64", "--url", url, "bin", encoded))[0] == 0
    assert await rcq(capsys, "peek", "--url", url, "bin") == (0, f"base64:{encoded}\n", "")
    code, out, _ = await rcq(capsys, "dequeue", "--json", "--url", url, "bin")
    assert code == 0 and json.loads(out)["items"] == [{"value": encoded, "encoding": "base64"}]


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
