"""The leader's clock: the time it stamps on entries and judges delays and expiries by.

Time in the replicated state never goes back (docs/queue-features.md). The clock is the later of

* the wall clock (plus an offset that exists for tests of clock skew only), and
* the latest entry time applied here, moved on by the time elapsed since it was applied:

so a leader whose wall clock is behind its predecessor's carries on from the predecessor's time at
the normal pace (it neither hides items that were visible nor keeps items that expired, and a
1 s delay still takes about 1 s), and after a leader whose clock ran ahead, time goes on from
there instead of standing still until the wall clock catches up.

``applied_ms`` is the latest entry time applied: what the replicated state itself has reached.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import time


class LeaderClock:
    __slots__ = ("_applied_at", "applied_ms", "offset_ms")

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms
        self.applied_ms = 0  # the largest entry time applied
        self._applied_at = 0.0  # monotonic time it was applied here

    def observe(self, entry_now_ms: int) -> None:
        if entry_now_ms > self.applied_ms:
            self.applied_ms = entry_now_ms
            self._applied_at = time.monotonic()

    def now_ms(self) -> int:
        wall = int(time.time() * 1000) + self.offset_ms
        if not self.applied_ms:
            return wall
        carried = self.applied_ms + int((time.monotonic() - self._applied_at) * 1000)
        return wall if wall > carried else carried
