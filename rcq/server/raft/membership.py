"""Fixes to pysyncobj's dynamic membership (docs/raft-hazards.md, H11 and H16..H18), and the
address a node dials a peer at.

pysyncobj changes the cluster one node at a time with special log entries (``add``/``rem``), and,
as Raft requires, a node uses a change as soon as the entry is in its log, committed or not, and
undoes it when the entry is truncated. Three places do not hold that promise:

* H16: the leader is meant to refuse a second change while the first is not committed, but the
  marker it checks (``__changeClusterIDx``) is never set: two changes can be in flight, and two
  single-node changes in flight can elect two leaders. :func:`_one_change_at_a_time` sets it.
* H17: a follower handling ``append_entries`` undoes the changes of *every* entry after the
  message's ``prevLogIdx``, then re-applies those of the message's entries. With rcq's fix H5
  (keep matching entries instead of deleting them), entries beyond the message stay in the log
  while their changes stay undone; a heartbeat does that to a follower holding more than the
  leader knew. :func:`reapply_log_changes` after each such message re-applies the changes of
  the entries beyond what it verified.
* H18: a restarted node takes its peers from its configuration, then from its snapshot, and
  applies the changes of later entries only once they are committed; Raft uses the latest
  configuration in the log. The replicator calls :func:`reapply_log_changes` once, at the
  first tick (after the snapshot is loaded), for every entry after the last applied one.

Re-applying is safe to repeat: a change only makes a node present (``add``) or absent
(``rem``), so replaying a run of entries leaves each node as the last entry naming it says,
whatever the view before; an add of a present node or a removal of an absent one does nothing.

Must not import: anything of rcq's but rcq.server.raft.internals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj

from rcq.server.raft.internals import (
    Replaced,
    apply_membership_change,
    current_log_index,
    log_entries_after,
    membership_request,
    replace_method,
    set_pending_change_index,
)

logger = logging.getLogger(__name__)

# What install() replaced: pysyncobj's own method, for the tests that show its behaviour.
REPLACED: list[Replaced] = []


def _one_change_at_a_time(original: Callable[..., Any]) -> Callable[..., Any]:
    """H16: pysyncobj calls ``__changeCluster`` right before appending the change at the next
    index; when it accepts, mark that index pending (pysyncobj clears it once applied)."""

    def change_cluster(self: SyncObj, request: Any) -> bool:
        accepted = bool(original(self, request))
        if accepted:
            set_pending_change_index(self, current_log_index(self) + 1)
        return accepted

    return change_cluster


def reapply_log_changes(sync_obj: SyncObj, after_index: int) -> int:
    """Re-apply, in log order, the membership changes of the journal's entries after
    ``after_index`` (tick thread); returns how many entries named a change."""
    if not sync_obj.conf.dynamicMembershipChange:
        return 0
    changes = 0
    for command, index, _term in log_entries_after(sync_obj, after_index):
        try:
            request = membership_request(command)
        except Exception:  # never end a tick with an exception (H2)
            logger.exception("unreadable membership entry %d", index)
            continue
        if request is not None:
            changes += 1
            apply_membership_change(sync_obj, request)
    return changes


def after_append_entries(sync_obj: SyncObj, verified: int | None) -> None:
    """H17: called after pysyncobj handled an ``append_entries`` message, with the last index the
    message covered (rcq.server.raft.patches._verified_index; None when pysyncobj undid nothing:
    a large entry's first parts, a snapshot chunk)."""
    if verified is not None and sync_obj.conf.dynamicMembershipChange and current_log_index(sync_obj) > verified:
        reapply_log_changes(sync_obj, verified)


def install() -> None:
    """Patch SyncObj's membership once (rcq.server.raft.patches.install calls it)."""
    if getattr(SyncObj, "_rcq_membership_fixes_installed", False):
        return
    REPLACED.append(replace_method("SyncObj", "changeCluster", _one_change_at_a_time))
    SyncObj._rcq_membership_fixes_installed = True
