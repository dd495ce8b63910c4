"""Durable file steps, written once: fsync a file or directory; replace a file by rename.

Used by the snapshot writer, the received-snapshot install and the start-up journal repair.

Must not import: anything of rcq.
"""

from __future__ import annotations

import os


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory (a directory's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(source: str, target: str) -> None:
    """Rename ``source`` over ``target`` and fsync the directory so the rename survives power loss."""
    os.rename(source, target)
    fsync_path(os.path.dirname(os.path.abspath(target)))
