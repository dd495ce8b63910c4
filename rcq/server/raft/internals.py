"""Every read or write of pysyncobj's private (name-mangled) state, in one place.

pysyncobj 0.3.17 exposes no API for what rcq's workarounds need (docs/raft-hazards.md): the
journal (to msync it, size it and read an entry's term), the commit index (to bound it, H6),
the proposals waiting for their entry (to answer those a snapshot skipped, H7), and its
message handler and follower delete (patched, H5 and H6). Reaching in anywhere else is a bug;
a pysyncobj upgrade is checked here first.

Must not import: anything of rcq.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj


def journal_of(sync_obj: SyncObj) -> Any:
    """The FileJournal. Its ``flush()`` msyncs it (pysyncobj never does, H8). Use it from the
    tick thread only, which owns the journal."""
    return sync_obj._SyncObj__raftLog


def journal_bytes(journal: Any) -> int:
    """Bytes written to the mmap'd journal: pysyncobj compacts by entry count only, and this is
    what bounds the memory the log takes."""
    return int(getattr(journal, "_FileJournal__currentOffset", 0))


def entry_term(sync_obj: SyncObj, index: int) -> int | None:
    """The term of log entry ``index``, None when the journal does not hold it."""
    journal = journal_of(sync_obj)
    if not len(journal):
        return None
    position = index - int(journal[0][1])
    if not 0 <= position < len(journal):
        return None
    return int(journal[position][2])


def set_commit_index(sync_obj: SyncObj, index: int) -> None:
    sync_obj._SyncObj__raftCommitIndex = index
    journal_of(sync_obj).setRaftCommitIndex(index)


def proposals_waiting(sync_obj: SyncObj) -> dict[int, list[tuple[int, Callable[[Any, int], None]]]]:
    """index -> [(term, callback)] of proposals made here, waiting for their entry to apply."""
    return sync_obj._SyncObj__commandsWaitingCommit


def syncobj_method(name: str) -> Callable[..., Any]:
    """SyncObj's private method ``__<name>``, as the class holds it."""
    return getattr(SyncObj, f"_SyncObj__{name}")


def replace_syncobj_method(name: str, method: Callable[..., Any]) -> None:
    """Replace SyncObj's private method ``__<name>`` for every instance built afterwards."""
    setattr(SyncObj, f"_SyncObj__{name}", method)
