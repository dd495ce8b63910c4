"""Stopping a node that meets data of a feature level it cannot read (docs/upgrades.md).

A ``level`` entry above this node's ``LEVEL_MAX``, an entry of a newer format, or a snapshot of
a higher level: applying around it would skip what the other replicas apply, and diverge. The
node logs what it met and which versions are involved, at CRITICAL, and exits at once with
``UNREADABLE_EXIT_CODE`` (from the tick thread, before pysyncobj applies anything after it). A
restart with the same code meets the same data and stops again; a newer release reads it.

Must not import: aiohttp, lmdb.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import NoReturn

from rcq.server.core.features import unreadable_level_message
from rcq.version import rcq_version

logger = logging.getLogger(__name__)

UNREADABLE_EXIT_CODE = 78  # EX_CONFIG: this code cannot run this cluster's data; another release can


def stop_unreadable(node_id: str, message: str) -> NoReturn:
    logger.critical("node %s stops: %s", node_id, message)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(UNREADABLE_EXIT_CODE)


def entry_message(index: int, details: dict[str, object]) -> str:
    """The message for an unreadable log entry (``ApplyFailed.details`` of the state machine)."""
    level, level_max = details.get("level"), details.get("level_max")
    if isinstance(level, int) and isinstance(level_max, int):
        writer = details.get("writer_version")
        return unreadable_level_message(level, writer if isinstance(writer, str) else None, rcq_version(),
                                        f"log entry {index}", level_max)
    return (f"log entry {index} is of a newer format ({details.get('error')}); this node runs rcq "
            f"{rcq_version()}. Start it with the release that wrote it (docs/upgrades.md).")
