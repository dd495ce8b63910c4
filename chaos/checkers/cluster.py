"""Cluster-level checkers: replica convergence and liveness.

* convergence — after heal and quiet the runtime records every node's state
  digest as ``"<digest>@<applied_index>"`` (a ``checker-input`` ``digests``
  line), and in a run with partitions each partition's members' (``partition_digests``).
  Valid when every node answered and all strings are equal, and so in each partition. With no
  such line the checker says ``checked: false`` and stays valid: the
  history cannot show a divergence it never measured.
* liveness — metrics around each fault window (nemesis ``start``/``stop``
  lines of one fault name, paired in order): time from the fault's start
  to a leader of a higher term (from sampled ``leaders`` observations), time
  from its stop to the next observed leader, and availability (share of
  ok among completed client ops invoked in the window; the final drain and
  a consumer's own aborts on poison are left out). The one verdict: no transaction stuck open after its deadline
  (an ``open-transactions`` line with a positive count).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from chaos.history import CHECKER_INPUT_PROCESS, NEMESIS_PROCESS, PairedOp, pair_ops

WINDOWS_REPORTED_MAX = 200


def _inputs(history: Iterable[dict[str, Any]], f: str) -> list[Any]:
    return [op.get("value") for op in history if op.get("process") == CHECKER_INPUT_PROCESS and op.get("f") == f]


def check_convergence(history: list[dict[str, Any]]) -> dict[str, Any]:
    recorded = _inputs(history, "digests")
    if not recorded:
        return {"valid": True, "checked": False, "nodes_count": 0}
    digests = recorded[-1] if isinstance(recorded[-1], dict) else {}
    groups: dict[str, list[str]] = {}
    missing: list[str] = []
    applied_index: dict[str, int | None] = {}
    for node in sorted(digests):
        digest = digests[node]
        if not isinstance(digest, str) or not digest:
            missing.append(node)
            continue
        groups.setdefault(digest, []).append(node)
        _, separator, index = digest.rpartition("@")
        applied_index[node] = int(index) if separator and index.isdigit() else None
    partitions = _partitions_converged(_inputs(history, "partition_digests"))
    return {
        "valid": bool(digests) and not missing and len(groups) == 1 and all(p["valid"] for p in partitions.values()),
        "checked": True,
        "nodes_count": len(digests),
        "distinct_count": len(groups),
        "groups": groups,
        "missing": missing,
        "applied_index": applied_index,
        **({"partitions": partitions} if partitions else {}),
    }


def _partitions_converged(recorded: list[Any]) -> dict[str, dict[str, Any]]:
    """Per partition but p0 (a run with partitions): its members' digests, valid when every member
    answered and all are one."""
    last = recorded[-1] if recorded and isinstance(recorded[-1], dict) else {}
    verdicts: dict[str, dict[str, Any]] = {}
    for partition, members in sorted(last.items()):
        members = members if isinstance(members, dict) else {}
        states = {digest for digest in members.values() if isinstance(digest, str) and digest}
        missing = sorted(node for node, digest in members.items() if not isinstance(digest, str) or not digest)
        verdicts[partition] = {"valid": bool(members) and not missing and len(states) == 1,
                               "members_count": len(members), "distinct_count": len(states), "missing": missing}
    return verdicts


def _end_s(history: list[dict[str, Any]]) -> float:
    return max((float(op.get("time_s", 0.0)) for op in history), default=0.0)


def _nemesis_starts(history: list[dict[str, Any]]) -> list[tuple[float, str, dict[str, Any]]]:
    """(time, fault, details) of every fault the nemesis started, in history order."""
    return [(float(op["time_s"]), str(op.get("f")), value) for op in history
            if op.get("process") == NEMESIS_PROCESS and isinstance(value := op.get("value"), dict)
            and value.get("phase") == "start"]


def fault_windows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nemesis start/stop pairs, in start order; a fault never stopped runs to the history's end."""
    end_s = _end_s(history)
    open_by_fault: dict[str, list[dict[str, Any]]] = {}
    windows: list[dict[str, Any]] = []
    for op in history:
        if op.get("process") != NEMESIS_PROCESS:
            continue
        raw_value = op.get("value")
        value: dict[str, Any] = raw_value if isinstance(raw_value, dict) else {}
        fault = str(op.get("f"))
        if value.get("phase") == "start":
            window = {"f": fault, "start_s": float(op["time_s"]), "stop_s": end_s, "stopped": False,
                      "nodes": value.get("nodes", [])}
            windows.append(window)
            open_by_fault.setdefault(fault, []).append(window)
        elif value.get("phase") == "stop" and open_by_fault.get(fault):
            window = open_by_fault[fault].pop(0)
            window["stop_s"] = float(op["time_s"])
            window["stopped"] = True
    return windows


def _leader_observations(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    observations = [
        sample
        for recorded in _inputs(history, "leaders")
        if isinstance(recorded, list)
        for sample in recorded
        if isinstance(sample, dict) and sample.get("node") is not None and "time_s" in sample
    ]
    return sorted(observations, key=lambda sample: float(sample["time_s"]))


def _leader_times(window: dict[str, Any], observations: list[dict[str, Any]]) -> dict[str, Any]:
    start_s, stop_s = window["start_s"], window["stop_s"]
    before = [sample for sample in observations if float(sample["time_s"]) <= start_s]
    leader_before = before[-1] if before else None
    term_before = int(leader_before.get("term", -1)) if leader_before else -1
    # Only a change seen while the fault lasts is its doing; a later one belongs to a later fault
    # (a follower's pause that deposes nobody must not report the next fault's election).
    new_leader = next(
        (s for s in observations
         if start_s < float(s["time_s"]) <= stop_s and int(s.get("term", -1)) > term_before), None
    )
    after_stop = next((s for s in observations if float(s["time_s"]) >= stop_s), None)
    return {
        "leader_before": None if leader_before is None else leader_before["node"],
        "new_leader": None if new_leader is None else new_leader["node"],
        "new_term": None if new_leader is None else new_leader.get("term"),
        "time_to_new_leader_s": None if new_leader is None else round(float(new_leader["time_s"]) - start_s, 6),
        "time_to_leader_after_stop_s": None if after_stop is None else round(float(after_stop["time_s"]) - stop_s, 6),
    }


def _availability(ops: Iterable[PairedOp]) -> dict[str, Any]:
    counts = {"ok": 0, "fail": 0, "info": 0}
    for op in ops:
        counts[op.type] = counts.get(op.type, 0) + 1
    completed = sum(counts.values())
    return {"ops": completed, **counts, "availability": None if completed == 0 else round(counts["ok"] / completed, 4)}


def check_liveness(history: list[dict[str, Any]]) -> dict[str, Any]:
    # A consumer that aborts on poison (error poison_abort) chose to: the cluster served it.
    ops = [op for op in pair_ops(history)
           if op.completion is not None and op.f != "drain" and op.error != "poison_abort"]
    windows = fault_windows(history)
    observations = _leader_observations(history)
    in_any_window: set[int] = set()
    by_fault: dict[str, list[dict[str, Any]]] = {}
    invoke_times_s = [op.invoke_time_s for op in ops]  # sorted: ops come in invoke order
    for window in windows:
        first = bisect.bisect_left(invoke_times_s, window["start_s"])
        inside = ops[first : bisect.bisect_right(invoke_times_s, window["stop_s"])]
        in_any_window.update(op.invoke_index for op in inside)
        window.update(_leader_times(window, observations))
        window.update(_availability(inside))
        by_fault.setdefault(window["f"], []).append(window)
    stuck = _stuck_transactions(history)
    stops = _graceful_stops(history)
    leader_times = [w["time_to_new_leader_s"] for w in windows if w["time_to_new_leader_s"] is not None]
    return {
        "valid": not stuck["stuck"] and not stops["killed"],
        "faults_count": len(windows),
        "leader_observations_count": len(observations),
        "max_time_to_new_leader_s": max(leader_times, default=None),
        "overall": _availability(ops),
        "outside_faults": _availability(op for op in ops if op.invoke_index not in in_any_window),
        "by_fault": {fault: _fault_summary(group) for fault, group in sorted(by_fault.items())},
        "windows": windows[:WINDOWS_REPORTED_MAX],
        "stuck_transactions": stuck,
        "graceful_stops": stops,
    }


def _graceful_stops(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes the nemesis stopped with SIGTERM (a graceful upgrade or downgrade): each running the
    code under test must exit by itself (0), a leader after handing over. A previous release may not
    (older nodes could wait on a busy session channel until killed): counted, not judged."""
    stops = [value for _, _, value in _nemesis_starts(history)
             if value.get("how") == "graceful" and "stop_exit" in value]
    current = [s for s in stops if s.get("from") == "current"]
    killed = [{"node": s.get("node"), "variant": s.get("variant"), "exit": s.get("stop_exit")}
              for s in current if s.get("stop_exit") != 0]
    return {"count": len(stops), "current_code": len(current),
            "leaders": sum(1 for s in current if s.get("variant") == "leader"), "killed": killed}


def _fault_summary(windows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = sum(w["ok"] for w in windows)
    completed = sum(w["ops"] for w in windows)
    leader_times = [w["time_to_new_leader_s"] for w in windows if w["time_to_new_leader_s"] is not None]
    recovery_times = [w["time_to_leader_after_stop_s"] for w in windows if w["time_to_leader_after_stop_s"] is not None]
    return {
        "windows": len(windows),
        "ops": completed,
        "ok": ok,
        "availability": None if completed == 0 else round(ok / completed, 4),
        "new_leader_count": len(leader_times),
        "max_time_to_new_leader_s": max(leader_times, default=None),
        "max_time_to_leader_after_stop_s": max(recovery_times, default=None),
    }


def _stuck_transactions(history: list[dict[str, Any]]) -> dict[str, Any]:
    recorded = [value for value in _inputs(history, "open-transactions") if isinstance(value, dict)]
    if not recorded:
        return {"checked": False, "stuck": False}
    last = recorded[-1]
    count = int(last.get("count") or 0)
    oldest_age_s = last.get("oldest_age_s")
    deadline_s = last.get("deadline_s")
    # With a deadline given, a transaction younger than it is open, not stuck.
    stuck = count > 0 and (deadline_s is None or oldest_age_s is None or float(oldest_age_s) > float(deadline_s))
    return {"checked": True, "stuck": stuck, "count": count, "oldest_age_s": oldest_age_s, "deadline_s": deadline_s}


def check_releases(history: list[dict[str, Any]], lost_acknowledged_at_s: dict[Any, float]) -> dict[str, Any]:
    """Which release led, and when, in a run whose ``upgrade`` nemesis restarted nodes into another
    release (a metric, not a verdict: the total-queue checker judges losses). Each node runs the code
    under test (``current``) until an upgrade or downgrade names what it runs next; the leader
    observations say who led. ``lost_acknowledged_at_s``: each lost value and when its enqueue was
    acknowledged. A value lost after a node of another release led may have been lost by that release
    (it runs that release's faults, fixed since or not); one lost while only the code under test led
    cannot have been."""
    restarts = sorted((time_s, str(value.get("node")), str(value.get("to")))
                      for time_s, fault, value in _nemesis_starts(history)
                      if fault in ("upgrade", "downgrade") and value.get("to"))
    if not restarts:
        return {"checked": False}
    observations = _leader_observations(history)
    end_s = _end_s(history)

    def release_of(node: str, at_s: float) -> str:
        release = "current"
        for time_s, restarted, to in restarts:
            if time_s > at_s:
                break
            if restarted == node:
                release = to
        return release

    led_s: dict[str, float] = {}
    other_last_led_s = float("-inf")  # the last observation of a node of another release leading
    for k, sample in enumerate(observations):
        at_s = float(sample["time_s"])
        until_s = float(observations[k + 1]["time_s"]) if k + 1 < len(observations) else end_s
        release = release_of(str(sample["node"]), at_s)
        led_s[release] = led_s.get(release, 0.0) + max(0.0, until_s - at_s)
        if release != "current":
            other_last_led_s = at_s
    after_other = sorted(str(value) for value, acked_s in lost_acknowledged_at_s.items()
                         if other_last_led_s >= acked_s)
    return {
        "checked": True,
        "led_s": {release: round(seconds, 1) for release, seconds in sorted(led_s.items())},
        "lost_after_another_release_led": len(after_other),
        "lost_with_only_the_code_under_test_leading": len(lost_acknowledged_at_s) - len(after_other),
        "lost_after_another_release_led_sample": after_other[:WINDOWS_REPORTED_MAX],
    }
