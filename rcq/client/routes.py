"""Which partition a request goes to, as the client knows it (docs/partitions.md, "Routing").

:class:`Routes` keeps the cluster's partitions (``GET /v1/cluster/partitions``: each one's
members' URLs and leader) and where queues are placed (``GET /v1/queues/{q}/placement``, asked
once per queue, and whatever a ``421 wrong_partition`` answer names). A transaction's partition
needs no lookup: its id names it (rcq.names).

What is cached goes stale: partitions are created, queues deleted and placed anew. Each such case
shows in an answer that ran nothing (a ``421 wrong_partition``, which the transport follows and
learns from; a ``409 cross_partition_transaction`` at a transaction's first verb, after which the
transaction is opened again where the queue lives), so a stale entry costs one round trip. A
listing of p0 alone is asked again after :data:`LONE_LISTING_FRESH_S`, so a client started before
the first partition was created comes to route to it.

Must not import: rcq.client.transport (the transport builds on this), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from rcq.errors import PartitionNotFound, RouteNotFound
from rcq.names import P0

LONE_LISTING_FRESH_S = 30.0  # a listing of p0 alone is asked again after this
PLACEMENTS_REMEMBERED_MAX = 10_000  # queues whose partition is kept; past it the table starts again


class Routes:
    """``ask(path)``: ``GET path`` from p0 (any node of the cluster), its answer."""

    def __init__(self, ask: Callable[[str], Awaitable[dict[str, Any]]]) -> None:
        self._ask = ask
        self._rows: dict[str, dict[str, Any]] | None = None  # partition -> its listing row
        self._listed_at = 0.0
        self._placed: dict[str, str] = {}  # queue -> its partition
        self._listing_task: asyncio.Task[dict[str, dict[str, Any]]] | None = None

    # ------------------------------------------------------------- partitions
    def known_partitions(self) -> dict[str, dict[str, Any]] | None:
        """The listing as last fetched, None if never."""
        return self._rows

    def single(self) -> bool | None:
        """Whether the cluster has p0 alone (None: not known yet, or the listing is stale)."""
        if self._rows is None or self._stale():
            return None
        return len(self._rows) == 1

    async def partitions(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        """The cluster's partitions by name (p0 first); fetched when missing, stale or ``refresh``."""
        if self._rows is not None and not refresh and not self._stale():
            return self._rows
        task = self._listing_task
        if task is None or task.done():  # one fetch at a time, shared by every caller
            task = self._listing_task = asyncio.ensure_future(self._fetch())
        return await asyncio.shield(task)

    async def row(self, partition: str) -> dict[str, Any]:
        """``partition``'s listing row, fetched again once if it is not known;
        PartitionNotFound if the cluster has no such partition."""
        rows = await self.partitions()
        if partition not in rows:
            rows = await self.partitions(refresh=True)
        if partition not in rows:
            raise PartitionNotFound(f"the cluster has no partition {partition}", details={"partition": partition})
        return rows[partition]

    async def _fetch(self) -> dict[str, dict[str, Any]]:
        try:
            answer = await self._ask("/v1/cluster/partitions")
            rows = {row["name"]: row for row in answer["partitions"]}
        except RouteNotFound:  # a node from before partitions: p0 is the whole cluster
            rows = {P0: {"name": P0, "number": 0, "members": [], "urls": [], "leader_url": None}}
        self._rows, self._listed_at = rows, asyncio.get_running_loop().time()
        return rows

    def _stale(self) -> bool:
        return (self._rows is not None and len(self._rows) == 1
                and asyncio.get_running_loop().time() - self._listed_at > LONE_LISTING_FRESH_S)

    # ------------------------------------------------------------------ queues
    def placed(self, queue: str) -> str | None:
        """``queue``'s partition if it is known without asking (p0 in a cluster of p0 alone)."""
        known = self._placed.get(queue)
        if known is not None:
            return known
        return P0 if self.single() else None

    async def partition_of(self, queue: str) -> str:
        """``queue``'s partition: known, or asked of p0 once."""
        known = self.placed(queue)
        if known is not None:
            return known
        if len(await self.partitions()) == 1:
            return P0
        answer = await self._ask(f"/v1/queues/{queue}/placement")
        partition = str((answer.get("partitions") or [P0])[0])
        self.learn(queue, partition)
        return partition

    def learn(self, queue: str, partition: str) -> None:
        if len(self._placed) >= PLACEMENTS_REMEMBERED_MAX:
            self._placed.clear()
        self._placed[queue] = partition

    def forget(self, queue: str) -> None:
        self._placed.pop(queue, None)
