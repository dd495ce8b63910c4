"""What a supervised child does first: die with the node that started it.

:func:`die_with_parent` asks the kernel to send this process SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, Linux), then checks that the parent is still the node that started it
(``$RCQ_PARENT_PID``, set by :mod:`rcq.server.partitions.supervisor`): a parent that died before
the request was made leaves the child with another parent, and no signal would ever come.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys

from rcq.server.partitions.supervisor import PARENT_PID_ENV

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ParentGone(RuntimeError):
    """The node that started this child is no longer its parent."""


def die_with_parent() -> int | None:
    """Arrange to be killed when the parent dies; the parent's pid (None: not started by a
    supervisor, nothing arranged). Raises :class:`ParentGone` if the parent is already gone."""
    expected = os.environ.pop(PARENT_PID_ENV, None)
    if expected is None:
        return None
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(expected):
        raise ParentGone(f"started by pid {expected}, whose child this process no longer is")
    return int(expected)
