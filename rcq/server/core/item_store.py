"""ItemStore: one queue's item values by id, packed into chunks instead of one object per item.

A dict of id -> bytes costs about 120 bytes per item besides the value: the bytes object's header
and allocator rounding, the int id, the dict slot, a deque slot for the order. At a million
100-byte items that is most of a node's memory. Here a queue's items live in chunks: each chunk
covers a run of ids (``first`` onwards, one slot per id, ids of other queues as empty dead slots
when the gap is small), its values concatenated in one ``bytearray`` with an ``array('I')`` of end
offsets and a ``bytearray`` of alive flags: about 5 bytes per item besides the value.

Ids only grow (they come from one counter at apply time), so appends go to the last chunk or a new
one, and a chunk's slots are in id order. A removal marks the slot dead; a chunk whose items are all
gone gives its memory back at once (the empty shell leaves when it reaches the head), and a chunk
mostly dead is repacked, so dead values never hold more than a few times the live ones.

Values come out as new ``bytes`` objects (copies): cheap next to the HTTP answer they go into.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator

SLOTS_MAX = 4096  # ids one chunk covers
BLOB_MAX = 256 * 1024  # bytes of values one chunk holds (a bigger value gets a chunk of its own)
GAP_MAX = 64  # ids of other queues a chunk may skip rather than start a new chunk
REPACK_MIN_BYTES = 64 * 1024  # a chunk this big whose live values are under a quarter of it is repacked


class _Chunk:
    __slots__ = ("alive", "blob", "dead_bytes", "ends", "first", "live")

    def __init__(self, first: int) -> None:
        self.first = first
        self.blob = bytearray()
        self.ends = array("I")  # ends[k]: end offset of slot k's value in blob
        self.alive = bytearray()  # 1: slot k holds an item
        self.live = 0
        self.dead_bytes = 0  # bytes of blob held by dead slots

    def span(self, slot: int) -> tuple[int, int]:
        return (self.ends[slot - 1] if slot else 0), self.ends[slot]

    def release(self) -> None:
        """Every item is gone: give the memory back (the shell stays until it reaches the head)."""
        self.blob = bytearray()
        self.ends = array("I")
        self.alive = bytearray()
        self.dead_bytes = 0

    def repack(self) -> None:
        """Drop the dead values' bytes; slot numbers (hence ids) stay."""
        blob, ends, alive = self.blob, self.ends, self.alive
        packed = bytearray()
        new_ends = array("I")
        start = 0
        for slot, end in enumerate(ends):
            if alive[slot]:
                packed += blob[start:end]
            start = end
            new_ends.append(len(packed))
        self.blob, self.ends, self.dead_bytes = packed, new_ends, 0


class ItemStore:
    """id -> value for increasing ids: ``len``, ``in``, ``get``, ``pop``, ``append``, iteration in id order."""

    __slots__ = ("_bytes", "_chunks", "_count", "_firsts", "_high", "_start")

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self._firsts = array("q")  # first id of each chunk, for bisection
        self._start = 0  # chunks before this one are gone
        self._count = 0
        self._bytes = 0
        self._high = 0  # the highest id ever appended

    def __len__(self) -> int:
        return self._count

    @property
    def value_bytes(self) -> int:
        return self._bytes

    # ---------------------------------------------------------------- writes
    def append(self, item_id: int, value: bytes) -> None:
        """Add an item whose id is above every id this store has held."""
        if item_id <= self._high:
            raise ValueError(f"item id {item_id} is not above {self._high}")
        self._high = item_id
        chunk = self._chunks[-1] if len(self._chunks) > self._start else None
        gap = 0
        if chunk is not None:
            gap = item_id - (chunk.first + len(chunk.ends))
            if (not chunk.live or gap > GAP_MAX or len(chunk.ends) + gap >= SLOTS_MAX
                    or len(chunk.blob) + len(value) > BLOB_MAX):
                chunk = None  # released, too far, or full: a new chunk
        if chunk is None:
            chunk = _Chunk(item_id)
            self._chunks.append(chunk)
            self._firsts.append(item_id)
            gap = 0
        end = len(chunk.blob)
        for _ in range(gap):
            chunk.ends.append(end)
            chunk.alive.append(0)
        chunk.blob += value
        chunk.ends.append(len(chunk.blob))
        chunk.alive.append(1)
        chunk.live += 1
        self._count += 1
        self._bytes += len(value)

    def pop(self, item_id: int) -> bytes:
        """Remove an item and return its value; KeyError when it is not here."""
        position, chunk, slot = self._find(item_id)
        if chunk is None:
            raise KeyError(item_id)
        start, end = chunk.span(slot)
        value = bytes(chunk.blob[start:end])
        chunk.alive[slot] = 0
        chunk.live -= 1
        chunk.dead_bytes += end - start
        self._count -= 1
        self._bytes -= end - start
        if chunk.live == 0:
            chunk.release()
            if position == self._start:
                self._drop_dead_head()
        elif chunk.dead_bytes >= REPACK_MIN_BYTES and chunk.dead_bytes * 4 >= len(chunk.blob) * 3:
            chunk.repack()
        return value

    def clear(self) -> None:
        """Remove every item (ids keep growing: ``_high`` stays)."""
        self._chunks, self._firsts, self._start = [], array("q"), 0
        self._count = self._bytes = 0

    def _drop_dead_head(self) -> None:
        chunks, start = self._chunks, self._start
        while start < len(chunks) and chunks[start].live == 0:
            chunks[start] = _DEAD
            start += 1
        if start >= 1024 and start * 2 >= len(chunks):
            del chunks[:start]
            del self._firsts[:start]
            start = 0
        self._start = start

    # ----------------------------------------------------------------- reads
    def _find(self, item_id: int) -> tuple[int, _Chunk | None, int]:
        position = bisect_right(self._firsts, item_id, lo=self._start) - 1
        if position < self._start:
            return position, None, 0
        chunk = self._chunks[position]
        slot = item_id - chunk.first
        if slot >= len(chunk.alive) or not chunk.alive[slot]:
            return position, None, 0
        return position, chunk, slot

    def __contains__(self, item_id: object) -> bool:
        return isinstance(item_id, int) and self._find(item_id)[1] is not None

    def get(self, item_id: int) -> bytes | None:
        _, chunk, slot = self._find(item_id)
        if chunk is None:
            return None
        start, end = chunk.span(slot)
        return bytes(chunk.blob[start:end])

    def first_id(self) -> int | None:
        """The lowest id held (None when empty). Dead chunks leave the head as they die, so this
        looks at one chunk, unless dead shells sit behind a live head that just died."""
        chunks = self._chunks
        for position in range(self._start, len(chunks)):
            chunk = chunks[position]
            if chunk.live:
                return chunk.first + chunk.alive.index(1)
        return None

    def ids(self) -> Iterator[int]:
        """Every id held, in increasing order."""
        for chunk in self._chunks[self._start:]:
            if not chunk.live:
                continue
            first, alive = chunk.first, chunk.alive
            for slot in range(len(alive)):
                if alive[slot]:
                    yield first + slot

    def items(self) -> Iterator[tuple[int, bytes]]:
        """Every (id, value), in id order."""
        for chunk in self._chunks[self._start:]:
            if not chunk.live:
                continue
            first, alive, ends, blob = chunk.first, chunk.alive, chunk.ends, chunk.blob
            start = 0
            for slot in range(len(alive)):
                end = ends[slot]
                if alive[slot]:
                    yield first + slot, bytes(blob[start:end])
                start = end


_DEAD = _Chunk(0)  # what a dropped head chunk is replaced by until the list is trimmed (live == 0)
