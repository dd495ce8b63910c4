"""In-process rcq nodes for the unit tests: the HTTP app and the leader over the in-memory replicator.

``make_config`` is the one node configuration of the unit tests (an insecure node on an
ephemeral HTTP port); ``running_node`` and ``serving_node`` start a whole node and stop it after;
``enqueue_committed`` and ``drain`` drive the leader's transaction manager without HTTP;
``skip_loop_time`` moves the event loop's clock, by which the leader judges deadlines, ahead.

Must not import: a test module or a conftest; pysyncobj (the replication here is in memory).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rcq.server.config import NodeConfig
from rcq.server.leader.transactions import TransactionManager
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import NODE_SERVING_TIMEOUT_S

NO_DATA_DIR = Path("/nonexistent")  # for what never touches the disk: a failed write would say so


def make_config(data_dir: Path = NO_DATA_DIR, node_id: str = "n1", raft_address: str = "127.0.0.1:10001",
                peers: list[dict[str, str]] | None = None, **overrides: Any) -> NodeConfig:
    """An insecure node ``node_id`` on an ephemeral HTTP port; ``overrides``: more NodeConfig fields."""
    return NodeConfig.model_validate(dict(node_id=node_id, http_port=0, raft_address=raft_address,
                                          data_dir=data_dir, insecure=True, peers=peers or [], **overrides))


def skip_loop_time(seconds: float) -> None:
    """Move the running event loop's clock ``seconds`` ahead, as if that long had passed at once:
    the leader judges deadlines and lifetimes by it, and timers due meanwhile run at the loop's
    next iteration. For the rest of the loop's life (a test's own loop), so a test waits for no
    time to pass."""
    loop = asyncio.get_running_loop()
    clock = loop.time
    loop.time = lambda: clock() + seconds  # type: ignore[method-assign]


def url_of(node: Node) -> str:
    return f"http://127.0.0.1:{node.port}"


@asynccontextmanager
async def started(node: Node) -> AsyncIterator[Node]:
    """``node`` started and serving, stopped after."""
    await node.start()
    try:
        await async_wait_until(lambda: node.manager.serving, NODE_SERVING_TIMEOUT_S, what="node serving")
        yield node
    finally:
        await node.stop()


@asynccontextmanager
async def running_node(tmp_path: Path, replicator: InMemoryReplicator | None = None,
                       **overrides: Any) -> AsyncIterator[Node]:
    """A node ``n1`` with its data under ``tmp_path`` (``overrides``: NodeConfig fields), serving."""
    node = Node(make_config(tmp_path / "n1", **overrides), replicator=replicator or InMemoryReplicator())
    async with started(node):
        yield node


@asynccontextmanager
async def serving_node(config: NodeConfig) -> AsyncIterator[str]:
    """A node of ``config`` (in-memory replication) serving HTTP; yields its URL."""
    async with started(Node(config, replicator=InMemoryReplicator())) as node:
        yield url_of(node)


async def enqueue_committed(manager: TransactionManager, queue: str, *values: bytes) -> None:
    """``values`` enqueued into ``queue`` by one committed transaction."""
    tx = manager.begin()
    manager.enqueue(tx.transaction_id, queue, list(values))
    await manager.commit(tx.transaction_id)


async def drain(manager: TransactionManager, queue: str) -> list[bytes]:
    """Every value of ``queue`` (up to 10,000), dequeued by one committed transaction."""
    tx = manager.begin()
    items = await manager.dequeue(tx.transaction_id, queue, max_items=10_000)
    await manager.commit(tx.transaction_id)
    return [i.value for i in items]


async def call(session: Any, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """(status, decoded JSON body) of one request of an aiohttp session, redirects not followed."""
    async with session.request(method, path, allow_redirects=False, **kwargs) as response:
        return response.status, await response.json()


async def begin(session: Any) -> str:
    """A transaction begun over HTTP; its id."""
    status, body = await call(session, "POST", "/v1/transactions", json={})
    assert status == 201, body
    return str(body["transaction_id"])
