"""Feature levels: which formats a node can read, and which the cluster may write.

Two versions of rcq share a cluster during a rolling upgrade. What they share has formats: the
Raft log's commands (``commands.COMMAND_VERSION`` and the shape of each kind), the snapshots
(``snapshot_format.SNAPSHOT_FORMAT``), and through them what the leader may write. A **feature
level** names one set of those formats. Each node reads every level up to its ``LEVEL_MAX``; the
cluster's **active level** is replicated state, raised only by a leader, by a ``level`` entry,
and only once every member reads the new level. Nothing is written in a format of a level above
the active one, so every member can read everything in the log and the snapshots.

A node that meets a level it cannot read (a ``level`` entry, or a snapshot, above its
``LEVEL_MAX``) stops: continuing would skip entries its peers apply, and diverge.

Adding a format change (docs/upgrades.md): append a :class:`Level` to ``LEVELS``, write the new
format only where ``active >= that level``, keep reading the old one, and record the new formats'
fingerprint (``tests/unit/test_feature_levels.py`` fails when a format changes without it).

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from rcq.immutable import immutable


@immutable
class Level:
    number: int
    name: str
    summary: str
    since: str  # the first rcq release that reads (and can write) it


LEVELS: tuple[Level, ...] = (
    Level(1, "base", "the formats of rcq 0.1: commands version 1, snapshot format 3", "0.1.0"),
    Level(2, "levels-and-headers", "the active level is replicated ('level' entries) and kept in snapshots "
          "(snapshot format 4); items may carry headers (a fifth field of a commit's transaction, a ninth "
          "of an item's snapshot metadata); the cluster has an identity ('identity' entries, set once, "
          "kept in the snapshot's meta as cluster_id)", "0.2.0"),
    Level(3, "retry-keys", "idempotency keys beginning with 'rcq-retry:' (the client library's own) are kept 10 "
          "minutes (at least 2) in a table of their own, the snapshot's retry_keys, instead of a day (at least "
          "15 minutes)", "0.2.0"),
    Level(4, "partitions", "the partition directory (docs/partitions.md): 'partition', 'node_ports' and "
          "'placement' entries, kept in the snapshot's meta as directory", "0.3.0"),
)
# What each level writes, hashed (tests/unit/test_feature_levels.py: a sample entry of every kind,
# and the snapshot of their state). A released level's fingerprint never changes; level 1's is
# rcq 0.1's own (computed with that release's code).
FORMAT_FINGERPRINTS: dict[int, str] = {
    1: "da4356bbe87287b9781b42f6d2081063a530a2a41072a1857249e2b2318909c3",
    2: "0f7151842fd2beabf1123cf79e89d03f7d476cbd9b1420d30fae5e218e544357",
    3: "0e47cbe59bb9f0ffb546709ef1255660bf42d397368968b68a0f0dd2c6c2893c",
    4: "dc6e2ea872f97752908f44f9198ab7c1e832a03c39d8f223145db0000ffb93ee",
}
LEVEL_BASE = 1  # a cluster that never raised its level (every rcq 0.1 cluster) runs at this one
LEVEL_MAX = LEVELS[-1].number  # the highest level this code reads and writes
LEVEL_OF_SNAPSHOT_FORMAT_4 = 2
LEVEL_OF_CLUSTER_IDENTITY = 2  # a leader gives the cluster its identity once the cluster runs at it
LEVEL_OF_ITEM_HEADERS = 2  # an enqueue with headers is refused below it (rcq.server.leader.open_transactions)
LEVEL_OF_RETRY_KEYS = 3  # retry keys have their own table from it on (rcq.server.core.outcomes)
LEVEL_OF_PARTITIONS = 4  # the partition directory's entries apply from it on (rcq.server.core.directory)


def level_max_read(held_at: int | None) -> int:
    """The highest level a node reads: LEVEL_MAX, or lower where a test holds it lower
    (``NodeConfig.test_feature_level_max``), as a node of an older release would read."""
    return LEVEL_MAX if held_at is None else min(LEVEL_MAX, held_at)


def level(number: int) -> Level | None:
    """The level ``number`` as this code knows it; None for one above LEVEL_MAX."""
    return LEVELS[number - 1] if 1 <= number <= LEVEL_MAX else None


def describe(number: int) -> str:
    known = level(number)
    return f"level {number} ({known.name}, rcq {known.since})" if known is not None else f"level {number}"


class UnreadableLevel(RuntimeError):
    """This node meets data of a feature level above the ones it reads: it must stop."""

    def __init__(self, active: int, writer_version: str | None, where: str, level_max: int = LEVEL_MAX) -> None:
        super().__init__(f"{where} is at feature level {active}, above {level_max}")
        self.active = active
        self.writer_version = writer_version
        self.where = where
        self.level_max = level_max

    def explain(self, own_version: str) -> str:
        """What an operator reads: both versions, and what to do."""
        return unreadable_level_message(self.active, self.writer_version, own_version, self.where, self.level_max)


def unreadable_level_message(active: int, writer_version: str | None, own_version: str, where: str,
                             level_max: int = LEVEL_MAX) -> str:
    writer = f"rcq {writer_version}" if writer_version else "a newer rcq"
    return (f"{where}: the cluster runs at feature level {active} (raised by {writer}); this node runs rcq "
            f"{own_version}, which reads feature levels up to {level_max}. Start it with a release that "
            f"reads level {active} (docs/upgrades.md): a cluster's feature level never goes down.")
