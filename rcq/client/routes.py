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
from collections.abc import Awaitable, Callable, Sequence
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
        self._spread: dict[str, tuple[str, ...]] = {}  # a spread queue -> its partitions, in placement order
        self._turns: dict[str, int] = {}  # a spread queue -> the fragment its next transaction starts at
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

    def remember(self, rows: list[dict[str, Any]]) -> None:
        """A listing fetched elsewhere (``RcqClient.partitions``): routed by from now on."""
        if rows:
            self._rows = {str(row["name"]): row for row in rows}
            self._listed_at = asyncio.get_running_loop().time()

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
        """``queue``'s partition if it is known without asking (p0 in a cluster of p0 alone). None
        for a spread queue too: its one-request verbs go to a node's own port, which shares them
        out over the fragments (docs/partitions.md, "Spread queues")."""
        known = self._placed.get(queue)
        if known is not None:
            return known
        return P0 if self.single() and queue not in self._spread else None

    def spread(self, queue: str) -> tuple[str, ...] | None:
        """The partitions of ``queue`` when it is known to be spread over several."""
        return self._spread.get(queue)

    async def placement_of(self, queue: str) -> tuple[str, ...]:
        """``queue``'s partitions (several for a spread queue): known, or asked of p0 once."""
        spread = self._spread.get(queue)
        if spread is not None:
            return spread
        known = self.placed(queue)
        if known is not None:
            return (known,)
        if len(await self.partitions()) == 1:
            return (P0,)
        answer = await self._ask(f"/v1/queues/{queue}/placement")
        partitions = tuple(str(p) for p in answer.get("partitions") or [P0])
        self.learn_placement(queue, partitions)
        return partitions

    async def partition_of(self, queue: str) -> str:
        """``queue``'s partition (a spread queue's first): known, or asked of p0 once."""
        return (await self.placement_of(queue))[0]

    def next_fragment(self, queue: str, partitions: tuple[str, ...]) -> str:
        """The fragment of spread ``queue`` a transaction with no partition key goes to: each in turn."""
        turn = self._turns.get(queue, 0)
        if len(self._turns) >= PLACEMENTS_REMEMBERED_MAX:
            self._turns.clear()
        self._turns[queue] = turn + 1
        return partitions[turn % len(partitions)]

    def took_turn(self, queue: str, partitions: tuple[str, ...], partition: str) -> None:
        """A transaction used ``partition``'s fragment of ``queue`` out of turn: the next one follows it."""
        if partition in partitions:
            self._turns[queue] = partitions.index(partition) + 1

    def learn_placement(self, queue: str, partitions: Sequence[str]) -> None:
        """Where ``queue`` lives: one partition, or several (spread)."""
        if len(partitions) > 1:
            self._placed.pop(queue, None)
            if len(self._spread) >= PLACEMENTS_REMEMBERED_MAX:
                self._spread.clear()
            self._spread[queue] = tuple(partitions)
        elif partitions:
            self.learn(queue, partitions[0])

    def learn(self, queue: str, partition: str) -> None:
        self._spread.pop(queue, None)
        if len(self._placed) >= PLACEMENTS_REMEMBERED_MAX:
            self._placed.clear()
        self._placed[queue] = partition

    def forget(self, queue: str) -> None:
        self._placed.pop(queue, None)
        self._spread.pop(queue, None)
