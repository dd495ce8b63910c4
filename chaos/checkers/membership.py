"""The membership checker: what the ``membership`` nemesis did, and whether every node ended a
voting member of one converged cluster.

Inputs (chaos.nemesis, chaos.membership, chaos.runner):

* nemesis lines whose ``f`` starts with ``membership``: a ``start`` is a removal made (its
  ``remove`` outcome, ``was_leader``, ``readd``: kept or wiped); a ``refused`` line a removal
  the cluster did not make (``result`` refused, gave_up or error; ``reason``); a ``stop`` the
  re-add (``added``, ``catch_up_s``, ``add``: its attempts); a ``membership-heal`` ``readd`` line
  one re-add by the final heal;
* the ``checker-input`` ``members`` line: the leader's view of the voting members after the drain
  (``leader``, ``members``, ``nodes``, each node's ``own_view``; ``error`` when no leader
  answered), and the ``digests`` line (as the convergence checker reads it).

Counts: removals (of the leader, handed over), refusals by reason, re-adds by kind (kept data,
wiped, at the final heal) and those that failed, how many had installed a snapshot once caught
up (a wiped node catches up from one when the leader's log is compacted), the catch-up times per
kind. A re-add that
failed during the run is a count, not a verdict: the final heal re-adds the node, and the verdict
is about the end.

**Verdict.** Checked when the ``members`` line is there: valid when the leader answered, every
node is a voting member in its view, and every node answered the same digest at the same applied
index. Without that line (a target that cannot change membership) it is ``checked: false``, and
valid unless the membership nemesis acted (then the end was not measured: invalid).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from chaos.history import CHECKER_INPUT_PROCESS, NEMESIS_PROCESS

SAMPLES_MAX = 20
READD_KINDS = ("kept", "wiped", "heal")


def _inputs(history: Iterable[dict[str, Any]], f: str) -> list[Any]:
    return [op.get("value") for op in history if op.get("process") == CHECKER_INPUT_PROCESS and op.get("f") == f]


def _times(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "median": None, "max": None}
    return {"count": len(values), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def check_membership(history: list[dict[str, Any]]) -> dict[str, Any]:
    lines = [op for op in history if op.get("process") == NEMESIS_PROCESS
             and str(op.get("f", "")).startswith("membership") and isinstance(op.get("value"), dict)]
    removals = [op["value"] for op in lines if op["value"].get("phase") == "start"]
    refusals = [op["value"] for op in lines if op["value"].get("phase") == "refused"]
    readds = [op["value"] for op in lines if op["value"].get("phase") in ("stop", "readd")]
    refused_by_reason = Counter(str(r.get("reason")) for r in refusals if r.get("result") == "refused")
    failed_removals = [r for r in refusals if r.get("result") != "refused"]

    readd_counts = dict.fromkeys(READD_KINDS, 0)
    from_snapshot = dict.fromkeys(READD_KINDS, 0)  # re-added nodes that had installed a snapshot when caught up
    catch_up: dict[str, list[float]] = {kind: [] for kind in READD_KINDS}
    readd_failures: list[dict[str, Any]] = []
    not_caught_up: list[dict[str, Any]] = []
    for value in readds:
        kind = str(value.get("readd", "kept"))
        add_found = value.get("add")
        add: dict[str, Any] = add_found if isinstance(add_found, dict) else {}
        added = bool(value.get("added", add.get("added")))
        node = add.get("node") or (value.get("nodes") or [None])[0]
        if not added:
            readd_failures.append({"node": node, "readd": kind, "result": add.get("result"),
                                   "answers": add.get("answers"), "error": value.get("error")})
            continue
        readd_counts[kind] = readd_counts.get(kind, 0) + 1
        if add.get("snapshots_received"):
            from_snapshot[kind] = from_snapshot.get(kind, 0) + 1
        seconds = value.get("catch_up_s", add.get("catch_up_s"))
        if seconds is None:
            not_caught_up.append({"node": node, "readd": kind, "why": add.get("catch_up")})
        else:
            catch_up.setdefault(kind, []).append(float(seconds))

    final = _final(history)
    acted = bool(removals or refusals or readds)
    if final["checked"]:
        valid = not final["problems"]
    else:
        valid = not acted
        if acted:
            final["problems"].append("the membership nemesis acted, but the final membership was not recorded")
    return {
        "valid": valid,
        "checked": final["checked"],
        "removals_count": len(removals),
        "removals_of_leader_count": sum(1 for r in removals if r.get("was_leader")),
        "handed_over_count": sum(1 for r in removals if (r.get("remove") or {}).get("handed_over")),
        "refused_count": sum(refused_by_reason.values()),
        "refused_by_reason": dict(sorted(refused_by_reason.items())),
        "failed_removals_count": len(failed_removals),
        "failed_removals": failed_removals[:SAMPLES_MAX],
        "readds": readd_counts,
        "readds_from_snapshot": from_snapshot,
        "readd_failures_count": len(readd_failures),
        "readd_failures": readd_failures[:SAMPLES_MAX],
        "catch_up_s": {kind: _times(values) for kind, values in catch_up.items()},
        "not_caught_up": not_caught_up[:SAMPLES_MAX],
        "final": final,
    }


def _final(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The end: every node a voting member in the leader's view, every digest equal."""
    recorded = [v for v in _inputs(history, "members") if isinstance(v, dict)]
    if not recorded:
        return {"checked": False, "problems": []}
    view = recorded[-1]
    problems: list[str] = []
    nodes = [str(n) for n in view.get("nodes") or []]
    members = [str(m) for m in view.get("members") or []]
    if not nodes:
        problems.append("no nodes recorded")
    if view.get("error"):
        problems.append(f"the leader's member list was not read: {view['error']}")
    missing = [n for n in nodes if n not in members] if not view.get("error") else nodes
    if missing and not view.get("error"):
        problems.append(f"not voting members in {view.get('leader')}'s view: {', '.join(missing)}")
    strangers = [m for m in members if m not in nodes]
    if strangers:
        problems.append(f"members that are no node of the cluster: {', '.join(strangers)}")
    own_found = view.get("own_view")
    own: dict[str, Any] = own_found if isinstance(own_found, dict) else {}
    not_member_own = sorted(n for n, v in own.items() if v is False)

    digests_recorded = [v for v in _inputs(history, "digests") if isinstance(v, dict)]
    digests: dict[str, Any] = digests_recorded[-1] if digests_recorded else {}
    no_digest = [n for n in nodes if not isinstance(digests.get(n), str) or not digests.get(n)]
    distinct = sorted({str(digests[n]) for n in nodes if n not in no_digest})
    if not digests_recorded:
        problems.append("no digests recorded")
    elif no_digest:
        problems.append(f"no digest from {', '.join(no_digest)}")
    if len(distinct) > 1:
        problems.append(f"{len(distinct)} distinct states among the nodes")
    return {
        "checked": True,
        "leader": view.get("leader"),
        "nodes_count": len(nodes),
        "members_count": len(members),
        "missing": missing,
        "not_member_in_own_view": not_member_own,  # a metric: a node's own view may lag
        "digests_equal": bool(digests_recorded) and not no_digest and len(distinct) == 1,
        "problems": problems,
    }
