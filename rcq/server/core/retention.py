"""Tables the state machine keeps for a while, by time, then forgets: outcomes and idempotency keys.

A retried commit must get the answer of the first attempt, so the state machine remembers each
transaction's outcome and each idempotency key. Remembering for ever grows without bound;
forgetting by count alone (the first version kept the last 200k outcomes) lets a busy cluster
forget an outcome within a minute, while a client may still be retrying. Both tables here keep
an entry for a *time*, with a guaranteed minimum:

* an entry is kept ``retention_ms`` after it was written (entry time, the leader's clock carried
  in the log, so every replica forgets the same entries at the same entry);
* under pressure (``entries_max`` reached) entries older than ``retention_min_ms`` are forgotten
  early to make room; when even that frees no room, :meth:`TimedTable.make_room` says no and the
  state machine refuses the new unit (``outcomes_full`` / ``idempotency_keys_full``, 429) rather
  than forget an entry younger than the minimum.

Entries are forgotten in the order they were written, which is time order (entry times never go
back), so forgetting is popping from the front of that order: O(1) per entry. The order is a
deque of keys beside the dict, not the dict's own order: deleting a dict's first keys leaves
holes that every later ``next(iter(dict))`` walks over until the dict happens to resize, so a
table forgetting from its front costs more per entry the longer it runs (``python -m
bench.retention``: 16 µs per forget at first, 173 µs after 120,000 in a table of 500,000; with
the deque 1.5 µs throughout). A key written again
gets a new place at the back; its earlier places are skipped (``_repeats`` counts them).

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class _Timed(Protocol):
    @property
    def at_ms(self) -> int: ...


V = TypeVar("V", bound=_Timed)


class TimedTable(Generic[V]):
    """key -> value (with ``at_ms``), forgotten by age; see the module docstring."""

    __slots__ = ("_entries", "_on_forget", "_order", "_repeats", "entries_max", "retention_min_ms", "retention_ms")

    def __init__(self, retention_ms: int, retention_min_ms: int, entries_max: int,
                 on_forget: Callable[[str], None] | None = None) -> None:
        self.retention_ms = retention_ms
        self.retention_min_ms = retention_min_ms
        self.entries_max = entries_max
        self._entries: dict[str, V] = {}
        self._order: deque[str] = deque()  # every put's key, oldest first
        self._repeats: dict[str, int] = {}  # key -> how many of its places in _order are not its last
        self._on_forget = on_forget

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> V | None:
        return self._entries.get(key)

    def items(self) -> Iterator[tuple[str, V]]:
        """The entries, oldest first."""
        entries = self._entries
        return ((key, entries[key]) for key in self._live_keys())

    def put(self, key: str, value: V) -> None:
        """Remember ``value`` (a key written again moves to the end: it is the newest)."""
        if key in self._entries:
            self._repeats[key] = self._repeats.get(key, 0) + 1
        self._entries[key] = value
        self._order.append(key)

    def expire(self, now_ms: int) -> None:
        """Forget every entry older than the retention."""
        self._forget_older_than(now_ms - self.retention_ms, len(self._entries))

    def make_room(self, count: int, now_ms: int) -> bool:
        """True when ``count`` new entries fit, after forgetting entries past the minimum retention."""
        excess = len(self._entries) + count - self.entries_max
        if excess > 0:
            self._forget_older_than(now_ms - self.retention_min_ms, excess)
        return len(self._entries) + count <= self.entries_max

    def has_room(self, count: int, now_ms: int) -> bool:
        """What :meth:`make_room` would answer, without forgetting anything (the oldest ``excess``
        entries are checked: they are the ones it would forget)."""
        excess = len(self._entries) + count - self.entries_max
        if excess <= 0:
            return True
        if excess > len(self._entries):
            return False
        horizon_ms = now_ms - self.retention_min_ms
        entries = self._entries
        for position, key in enumerate(self._live_keys()):
            if position >= excess:
                return True
            if entries[key].at_ms >= horizon_ms:
                return False
        return True

    def _live_keys(self) -> Iterator[str]:
        """The keys in ``_order`` at their last place, oldest first."""
        repeats = self._repeats
        if not repeats:
            yield from self._order
            return
        skipped: dict[str, int] = {}
        for key in self._order:
            earlier = repeats.get(key)
            if earlier is not None and skipped.get(key, 0) < earlier:
                skipped[key] = skipped.get(key, 0) + 1
                continue
            yield key

    def _forget_older_than(self, horizon_ms: int, count_max: int) -> None:
        entries, order, repeats = self._entries, self._order, self._repeats
        forgotten = 0
        while order and forgotten < count_max:
            key = order[0]
            earlier = repeats.get(key)
            if earlier is not None:  # not this key's last place: the entry lives further back
                order.popleft()
                if earlier == 1:
                    del repeats[key]
                else:
                    repeats[key] = earlier - 1
                continue
            if entries[key].at_ms >= horizon_ms:
                break
            order.popleft()
            del entries[key]
            forgotten += 1
            if self._on_forget is not None:
                self._on_forget(key)

    def replace_all(self, entries: Iterator[tuple[str, V]]) -> None:
        """Load entries (oldest first), as a snapshot restore does."""
        self._entries = dict(entries)
        self._order = deque(self._entries)
        self._repeats = {}
