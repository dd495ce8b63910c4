"""Queue names: the one rule, shared by the server, the client, the CLI and the Spark options.

A queue name is 1 to 128 characters of ``[A-Za-z0-9._-]``, and not ``.`` or ``..``
(they match the pattern but are path segments in ``/v1/queues/{queue}``).

Must not import: anything of rcq but rcq.errors (the client installs without the server).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

from rcq.errors import InvalidQueueName, InvalidRequest

QUEUE_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
DOT_SEGMENTS = (".", "..")
_QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)


def check_queue_name(name: str) -> str:
    """``name`` if it is a queue name; :class:`InvalidQueueName` otherwise."""
    if not isinstance(name, str) or not _QUEUE_NAME_RE.match(name) or name in DOT_SEGMENTS:
        raise InvalidQueueName(f"bad queue name {name!r}: use 1 to 128 characters of [A-Za-z0-9._-], not . or ..")
    return name


# ---------------------------------------------------------------- transaction ids
# A transaction id is ``<term hex>.<24 random hex>`` in p0 (as before partitions) and
# ``<partition>.<term hex>.<24 random hex>`` in any other partition (docs/partitions.md,
# "Transactions"): a partition name has no dot, so the count of dots tells them apart, and any
# node can tell from an id alone which partition's leader holds the transaction.
P0 = "p0"
PARTITION_NAME = r"[a-z][a-z0-9_-]{0,31}"  # safe in a path, a metric label, a transaction id and a URL
TRANSACTION_ID_PATTERN = rf"^(?:{PARTITION_NAME}\.)?[0-9a-f]{{1,16}}\.[0-9a-f]{{24}}$"


def transaction_partition(transaction_id: str) -> str:
    """The partition a transaction id names (p0 for an id without a partition)."""
    head, dot, rest = transaction_id.partition(".")
    return head if dot and "." in rest else P0


def transaction_term(transaction_id: str) -> int | None:
    """The term encoded in a transaction id, None if it has none."""
    parts = transaction_id.split(".")
    try:
        return int(parts[-2], 16) if len(parts) in (2, 3) else None
    except ValueError:
        return None


def new_transaction_id(partition: str, term: int, random_hex: str) -> str:
    """The id of a transaction opened in ``partition`` at ``term``."""
    return f"{term:x}.{random_hex}" if partition == P0 else f"{partition}.{term:x}.{random_hex}"


PARTITION_KEY_CHARS_MAX = 200  # a spread queue's partition key (docs/partitions.md)


def check_partition_key(partition_key: str) -> str:
    """``partition_key`` if it is one (1 to PARTITION_KEY_CHARS_MAX characters); InvalidRequest otherwise."""
    if not isinstance(partition_key, str) or not 1 <= len(partition_key) <= PARTITION_KEY_CHARS_MAX:
        raise InvalidRequest(f"bad partition_key {partition_key!r}: use 1 to {PARTITION_KEY_CHARS_MAX} characters")
    return partition_key


def fragment_for(partition_key: str, partitions: Sequence[str]) -> str:
    """The partition of a spread queue (over ``partitions``, in placement order) that holds the
    items of ``partition_key``: the same for the same key on every node and client (CRC-32, not
    Python's salted hash), so a key's items keep their relative order in one fragment."""
    return partitions[zlib.crc32(partition_key.encode()) % len(partitions)]
