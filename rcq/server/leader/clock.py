"""The leader's clock: the time it stamps on entries and judges delays and expiries by.

``max(wall clock + offset, the state machine's time)``: a leader whose clock is behind its
predecessor's still moves time forward, so it neither hides items that were visible nor keeps
items that expired (docs/queue-features.md). The offset exists for tests of clock skew only.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import time


class LeaderClock:
    __slots__ = ("_floor_ms", "offset_ms")

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms
        self._floor_ms = 0  # the largest entry time applied: time never goes back below it

    def observe(self, entry_now_ms: int) -> None:
        if entry_now_ms > self._floor_ms:
            self._floor_ms = entry_now_ms

    def now_ms(self) -> int:
        wall = int(time.time() * 1000) + self.offset_ms
        return wall if wall > self._floor_ms else self._floor_ms
