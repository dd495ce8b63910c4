"""Which partition's verbs may touch a queue (docs/partitions.md, "Queues and transactions").

A transaction lives in one partition. In p0 (the node's own process) a verb on a queue the
directory places in another partition is refused with ``409 cross_partition_transaction``; nothing
changes and the transaction stays usable. In a partition process a queue exists only once that
partition's log created it (``PUT /v1/queues/{q}`` with ``{"partitions": [...]}``, through p0): an
enqueue into a queue it does not hold is refused with ``404 queue_not_found`` rather than creating
it, so no partition ever holds items of a queue the directory places elsewhere. The PUT that
creates a queue in a partition process must carry :data:`PLACEMENT_HEADER`, which p0's leader
signs with the cluster secret once the directory has placed the queue there
(:func:`placement_token`): a client cannot create a queue in a partition behind p0's back.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import hashlib
import hmac

from rcq.errors import CrossPartitionTransaction, QueueNotFound
from rcq.names import P0
from rcq.server.config import NodeConfig
from rcq.server.raft.protocol import Replicator


class Placement:
    def __init__(self, config: NodeConfig, replicator: Replicator) -> None:
        self._partition = config.partition_name or P0
        self._replicator = replicator

    def check(self, queue: str, creates: bool) -> None:
        """Raise unless a verb of this partition may touch ``queue`` (``creates``: an enqueue)."""
        if self._partition == P0:
            placed = self._replicator.read(lambda sm: sm.directory.placement.get(queue))
            if placed is not None and P0 not in placed:
                raise CrossPartitionTransaction(
                    f"queue {queue!r} lives in partition {', '.join(placed)}; this transaction lives in p0. A "
                    f"transaction touches the queues of one partition: open it in {placed[0]} (docs/partitions.md)",
                    details={"queue": queue, "queue_partitions": list(placed), "transaction_partition": P0})
        elif creates and not self._replicator.read(lambda sm: sm.queue_stats(queue) is not None):
            raise QueueNotFound(
                f"queue {queue!r} is not in partition {self._partition}: a partition holds only the queues placed "
                f"in it (PUT /v1/queues/{queue} with {{\"partitions\": [\"{self._partition}\"]}})",
                details={"queue": queue, "partition": self._partition})


PLACEMENT_HEADER = "X-Rcq-Placement"


def placement_token(config: NodeConfig, partition: str, queue: str) -> str:
    """What p0's leader sends with the PUT that creates ``queue`` in ``partition`` (an HMAC of both
    under the cluster secret; without a secret, insecure mode, anyone can make it)."""
    return _sign(config.cluster_secret or "", partition, queue)


def _sign(secret: str, partition: str, queue: str) -> str:
    return hmac.new(secret.encode(), f"place\0{partition}\0{queue}".encode(), hashlib.sha256).hexdigest()


def placement_allowed(config: NodeConfig, queue: str, token: str | None) -> bool:
    """Whether ``token`` was made for ``queue`` in this partition under the cluster secret or one
    of ``cluster_secrets_previous``: during a rotation p0's leader may seal with the other one
    (docs/security.md)."""
    if token is None or config.partition_name is None:
        return False
    secrets = [config.cluster_secret or "", *config.cluster_secrets_previous]
    return any(hmac.compare_digest(token, _sign(secret, config.partition_name, queue)) for secret in secrets)
