"""Keep freed memory at the top of a node's heap instead of giving it back to the kernel at once.

glibc's malloc returns the top of the heap to the kernel whenever more than ``M_TRIM_THRESHOLD``
(128 KiB by default) is free there, and takes it back with new, zero-filled pages on the next
allocation. ``zlib.compress`` allocates about 270 KiB of tables for every call and frees them at
once, and pysyncobj compresses every Raft message: each message then paid for a trim and ~64 page
faults. On the development machine that was 57 µs for compressing a 320-byte message, 10 µs with
the top of the heap kept; a Raft entry costs the leader two such messages and each follower one:
a fixed cost of every entry, small beside the rest in a running node (docs/performance.md,
"The leader's path and the Raft messages").

:func:`keep_heap_top` raises the threshold to :data:`HEAP_TOP_KEPT_BYTES` for the node's process
(the node calls it once, at start). The cost: up to that much freed memory stays in the process.
Nothing happens where the C library is not glibc (musl's ``mallopt`` does nothing) or on
platforms without one.

Must not import: anything of rcq's.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
HEAP_TOP_KEPT_BYTES = 8 << 20


def keep_heap_top(kept_bytes: int = HEAP_TOP_KEPT_BYTES) -> bool:
    """Keep up to ``kept_bytes`` freed at the heap's top; True when the C library took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    taken = bool(mallopt(M_TRIM_THRESHOLD, kept_bytes) == 1)
    logger.debug("heap top kept up to %d bytes: %s", kept_bytes, taken)
    return taken
