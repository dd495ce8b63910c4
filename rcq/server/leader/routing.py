"""Which partition serves a request (docs/partitions.md, "Routing").

A transaction lives in one partition, and its id names it (rcq.names). A request is run only by
the process of the partition it belongs to; another process refuses it with ``421
wrong_partition`` naming the right one, before anything runs (HTTP to a node's own port then
forwards it there, rcq.server.http.partition_routes). What belongs where:

* a verb on a transaction: the partition its id names;
* ``POST /v1/transactions``: the ``partition`` it asks for (when absent, the process asked:
  p0 at a node's own port);
* a one-request transaction (a queue's enqueue, dequeue or receive, ``/v1/execute``): the
  partition of its queues. Queues of two partitions in one request: ``409
  cross_partition_transaction``, nothing run;
* ``/v1/commit``: the partition of its transactions; ids of two partitions: ``409
  cross_partition_transaction``, nothing committed;
* a queue's reads and administration: the queue's partition.

Only p0 has the directory, so only p0 knows where a queue is placed. A partition process takes
queue requests as its own and answers ``404 queue_not_found`` for a queue it does not hold.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rcq.errors import CrossPartitionTransaction, WrongPartition
from rcq.names import P0, transaction_partition
from rcq.server.config import NodeConfig
from rcq.server.raft.protocol import Replicator


class Routing:
    def __init__(self, config: NodeConfig, replicator: Replicator) -> None:
        self.own = config.partition_name or P0
        self._replicator = replicator

    def placed(self, queue: str) -> tuple[str, ...]:
        """The partitions ``queue`` lives in, as far as this process knows."""
        if self.own != P0:
            return (self.own,)
        return self._replicator.read(lambda sm: sm.directory.placed(queue))

    def transaction(self, transaction_id: str) -> None:
        """Raise unless ``transaction_id`` belongs to this partition."""
        partition = transaction_partition(transaction_id)
        if partition != self.own:
            raise WrongPartition(f"transaction {transaction_id} lives in partition {partition}, not in "
                                 f"{self.own}", details={"partition": partition, "transaction_id": transaction_id})

    def transactions(self, transaction_ids: Sequence[str]) -> None:
        """Raise unless every one of ``transaction_ids`` belongs to this partition (one commit)."""
        partitions = sorted({transaction_partition(t) for t in transaction_ids})
        if len(partitions) > 1:
            raise CrossPartitionTransaction(
                f"these transactions live in partitions {', '.join(partitions)}: one commit covers the "
                "transactions of one partition (docs/partitions.md); nothing was committed",
                details={"transaction_partitions": partitions})
        if transaction_ids:
            self.transaction(transaction_ids[0])

    def begin(self, partition: str | None) -> None:
        """Raise unless a transaction asked for in ``partition`` (None: this one) opens here."""
        wanted = partition or self.own
        if wanted != self.own:
            raise WrongPartition(f"partition {wanted} opens its own transactions, not {self.own}",
                                 details={"partition": wanted})

    def one_request(self, queues: Iterable[str]) -> None:
        """Raise unless a one-request transaction on ``queues`` runs here: in the one partition
        they all live in. A spread queue lives in each of its partitions (its fragment there):
        p0 runs it when it holds a fragment of every queue, else the first partition that does
        (which fragment a node's own port gives a one-request verb: rcq.server.http.spread_queues)."""
        if self.own != P0:
            return
        first: tuple[str, tuple[str, ...]] | None = None
        common: list[str] = []
        for queue in queues:
            placed = self.placed(queue)
            if first is None:
                first, common = (queue, placed), list(placed)
                continue
            common = [p for p in common if p in placed]
            if not common:
                raise CrossPartitionTransaction(
                    f"queue {queue!r} lives in partition {', '.join(placed)} and queue {first[0]!r} in "
                    f"{', '.join(first[1])}: a transaction touches the queues of one partition "
                    "(docs/partitions.md); nothing was run",
                    details={"queue": queue, "queue_partitions": list(placed), "transaction_partition": first[1][0]})
        if first is not None and P0 not in common:
            raise lives_elsewhere(first[0], common[0], first[1])

    def queue(self, queue: str) -> None:
        """Raise unless ``queue``'s reads and administration are answered here (a spread queue's
        fragment in p0 among them)."""
        if self.own == P0:
            placed = self.placed(queue)
            if P0 not in placed:
                raise lives_elsewhere(queue, placed[0], placed)


def lives_elsewhere(queue: str, partition: str, placed: Sequence[str] = ()) -> WrongPartition:
    """The refusal of a request about ``queue``, which lives in ``partition`` (a spread queue: one
    of ``placed``, all named in ``queue_partitions`` so that a client learns it is spread)."""
    spread = {"queue_partitions": list(placed)} if len(placed) > 1 else {}
    return WrongPartition(f"queue {queue!r} lives in partition {partition}",
                          details={"partition": partition, "queue": queue, **spread})
