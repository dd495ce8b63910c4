"""The backups checker: every backup the ``backup`` nemesis restored held what its history says.

The nemesis (chaos.backups) does the restoring and the comparing while the run goes on, because
only it knows at which Raft index each of its probe commits was acknowledged; it writes one
``backup-restore`` line per restored backup with ``valid`` and the offenders. This checker reads
those lines: the run is invalid when one of them is. Backups that could not be taken under
faults (``backup`` lines of phase ``failed``) are counted, not held against the run (a few of
their errors are sampled); one taken after the heal, because none was checked under the faults,
is counted apart (``taken_after_heal``). A backup
taken at an index before a probe commit acknowledged before it was asked for (``taken`` lines:
``index`` below ``acknowledged_before``) is behind what ``rcq backup`` promises: the run is
invalid too; for a backup set (a cluster with partitions), each part against its own partition's
probe (the ``parts`` of the line).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from typing import Any

from chaos.history import NEMESIS_PROCESS

SAMPLES_MAX = 20


def check_backups(history: list[dict[str, Any]]) -> dict[str, Any]:
    lines: list[tuple[str, dict[str, Any]]] = [
        (str(op.get("f")), op["value"]) for op in history if op.get("process") == NEMESIS_PROCESS
        and op.get("f") in ("backup", "backup-restore") and isinstance(op.get("value"), dict)]
    taken = [v for f, v in lines if f == "backup" and v.get("phase") == "taken"]
    failed = [v for f, v in lines if f == "backup" and v.get("phase") == "failed"]
    checked = [v for f, v in lines if f == "backup-restore" and v.get("phase") == "checked"]
    invalid = [v for v in checked if not v.get("valid")]
    # A set (a cluster with partitions): each part against its own partition's probe.
    behind = [{**v, **part} for v in taken for part in (v.get("parts") or [v])
              if int(part.get("index", 0)) < int(part.get("acknowledged_before", 0))]
    return {
        "valid": not invalid and not behind,
        "backups_taken": len(taken),
        "backups_failed": len(failed),
        "restores_checked": len(checked),
        "probe_items_checked": sum(int(v.get("probe_checked", 0)) for v in checked),
        "indexes": [v.get("index") for v in taken],
        "invalid_restores": invalid[:SAMPLES_MAX],
        "sets_taken": sum(1 for v in taken if v.get("parts")),
        "taken_after_heal": sum(1 for v in taken if v.get("after_heal")),
        "failure_samples": sorted({str(v.get("error", ""))[:120] for v in failed})[:3],
        "behind": [{key: v.get(key) for key in ("number", "partition", "index", "acknowledged_before", "node_id")
                    if key in v} for v in behind[:SAMPLES_MAX]],
    }
