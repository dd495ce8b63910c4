"""The run's verdict for people and for machines: a text summary and a results JSON.

``summary_text`` turns ``chaos.checkers.check``'s result into a few lines:
VALID or INVALID, the seed that reproduces the run, and one line per
checker with its counts and first offenders. ``write_results`` stores the
whole result with the run's parameters as JSON. The PNG timeline is
chaos.timeline's; this module is text only.

Pure Python: imports nothing from rcq. Imported by the checkers' command and the runner, never by a
checker (it shows their results).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.checkers.features import summary_line as features_summary_line
from chaos.checkers.headers import summary_line as headers_summary_line

SAMPLES_SHOWN_MAX = 5


def _verdict(result: dict[str, Any]) -> str:
    return "ok     " if result.get("valid") else "INVALID"


def _sample(values: list[Any]) -> str:
    shown = [value.get("value", value) if isinstance(value, dict) else value for value in values[:SAMPLES_SHOWN_MAX]]
    return "" if not shown else " e.g. " + ", ".join(str(value) for value in shown)


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}s"


def _share(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"


def _total_queue_line(r: dict[str, Any]) -> str:
    line = (
        f"acknowledged {r['acknowledged_count']}, dequeued {r['dequeued_count']}, lost {r['lost_count']}, "
        f"unexpected {r['unexpected_count']}, duplicated {r['duplicated_count']}, misplaced {r['misplaced_count']}; "
        f"recovered {r['recovered_count']}, refused queue_full {r.get('refused_full_count', 0)}, "
        f"duplicated-with-unknown {r['duplicated_with_unknown_count']}, "
        f"maybe-removed {r['maybe_removed_count']}, unknown-enqueue-absent {r['unknown_enqueue_absent_count']}"
    )
    for key in ("lost", "unexpected", "duplicated", "misplaced"):
        if r[f"{key}_count"]:
            line += f"\n      {key}:{_sample(r[key])}"
    return line


def _atomicity_line(r: dict[str, Any]) -> str:
    line = (
        f"{r['enqueue_transactions_count']} enqueue transactions ({r['multi_queue_enqueue_transactions_count']} "
        f"multi-queue), {r['committed_moves_count']}/{r['moves_count']} moves committed; "
        f"incomplete ok enqueues {r['incomplete_ok_enqueues_count']}, partial info enqueues "
        f"{r['partial_info_enqueues_count']}, moves in both queues {r['moves_in_both_queues_count']}, "
        f"moves missing from target {r['moves_not_in_target_count']}"
    )
    for key in ("incomplete_ok_enqueues", "partial_info_enqueues"):
        for tx in r[key][:SAMPLES_SHOWN_MAX]:
            line += f"\n      {key}: op {tx['invoke_index']} missing {tx['missing'][:SAMPLES_SHOWN_MAX]}"
    for key in ("moves_in_both_queues", "moves_not_in_target"):
        if r[f"{key}_count"]:
            line += f"\n      {key}:{_sample(r[key])}"
    return line


def _aborted_line(r: dict[str, Any]) -> str:
    handed_out = sum(r["handed_out_count"].values())
    returned = sum(r["returned_count"].values())
    times = r["time_to_return_s"]
    ranks = r["head_rank"] if r["head_rank"].get("count") else r["observed_rank"]
    line = (
        f"{returned}/{handed_out} aborted/vanished/peeked values came back, not returned {r['not_returned_count']}; "
        f"return time median {_seconds(times.get('median'))} max {_seconds(times.get('max'))}; "
        f"rank near head median {ranks.get('median', '-')} max {ranks.get('max', '-')}"
    )
    if r["not_returned_count"]:
        line += f"\n      not returned:{_sample(r['not_returned'])}"
    return line


def _convergence_line(r: dict[str, Any]) -> str:
    if not r.get("checked"):
        return "not checked (no digests recorded)"
    line = f"{r['nodes_count']} nodes, {r['distinct_count']} distinct state(s)"
    if r["missing"]:
        line += f", no digest from {', '.join(r['missing'])}"
    for partition, verdict in (r.get("partitions") or {}).items():
        line += (f"; {partition}: {verdict['members_count']} members, {verdict['distinct_count']} distinct state(s)"
                 + (f", no digest from {', '.join(verdict['missing'])}" if verdict["missing"] else ""))
    if r["distinct_count"] > 1:
        for digest, nodes in r["groups"].items():
            line += f"\n      {digest}: {', '.join(nodes)}"
    return line


def _membership_line(r: dict[str, Any]) -> str:
    final = r["final"]
    if not final.get("checked") and not r["removals_count"] and not r["refused_count"]:
        return "not checked (no membership changes, no final member list)"
    readds = r["readds"]
    refused = ", ".join(f"{reason} {count}" for reason, count in r["refused_by_reason"].items())
    times = ", ".join(f"{kind} median {_seconds(t['median'])} max {_seconds(t['max'])} ({t['count']})"
                      for kind, t in r["catch_up_s"].items() if t["count"])
    line = (
        f"{r['removals_count']} removals ({r['removals_of_leader_count']} of the leader, {r['handed_over_count']} "
        f"handed over), {r['refused_count']} refused" + (f" ({refused})" if refused else "")
        + f", {r['failed_removals_count']} failed; re-added {readds.get('kept', 0)} with data kept, "
        f"{readds.get('wiped', 0)} wiped ({r.get('readds_from_snapshot', {}).get('wiped', 0)} from a snapshot), "
        f"{readds.get('heal', 0)} at the final heal, "
        f"{r['readd_failures_count']} re-adds failed; catch-up {times or '-'}"
    )
    if final.get("checked"):
        line += (f"; at the end {final['members_count']}/{final['nodes_count']} voting members in "
                 f"{final.get('leader')}'s view, digests {'equal' if final['digests_equal'] else 'NOT equal'}")
    for problem in final["problems"]:
        line += f"\n      {problem}"
    for failure in r["readd_failures"][:SAMPLES_SHOWN_MAX]:
        line += "\n      re-add failed: " + ", ".join(f"{k} {v}" for k, v in failure.items() if v is not None)
    if final.get("not_member_in_own_view"):
        line += f"\n      note: not a member in its own view: {', '.join(final['not_member_in_own_view'])}"
    return line


def _liveness_line(r: dict[str, Any]) -> str:
    stuck = r["stuck_transactions"]
    stuck_text = "not checked" if not stuck.get("checked") else f"{stuck['count']} (oldest {_seconds(stuck['oldest_age_s'])})"
    line = (
        f"{r['faults_count']} fault windows, max time to new leader {_seconds(r['max_time_to_new_leader_s'])}; "
        f"availability overall {_share(r['overall']['availability'])}, outside faults "
        f"{_share(r['outside_faults']['availability'])}; stuck transactions {stuck_text}"
    )
    stops = r.get("graceful_stops")
    if stops and stops["count"]:
        killed = stops["killed"]
        line += (f"; graceful stops {stops['count']} ({stops['current_code']} of the code under test, "
                 f"{stops['leaders']} leaders), killed after SIGTERM {len(killed)}"
                 + _sample([f"{k['node']} exit {k['exit']}" for k in killed]))
    for fault, s in r["by_fault"].items():
        line += (
            f"\n      {fault}: {s['windows']} window(s), availability {_share(s['availability'])} of {s['ops']} ops, "
            f"new leader in {_seconds(s['max_time_to_new_leader_s'])} (max), "
            f"leader after stop {_seconds(s['max_time_to_leader_after_stop_s'])} (max)"
        )
    return line


def _ordering_line(r: dict[str, Any]) -> str:
    return (
        f"{r['inversions_count']} inversions over {r['ordered_values_count']} values "
        f"({r['producers_with_inversions_count']} producers with any) — a metric, not a verdict"
    )


def _backups_line(r: dict[str, Any]) -> str:
    if not r.get("backups_taken") and not r.get("backups_failed"):
        return "no backup taken (the backup nemesis was not asked for)"
    sets = f", {r['sets_taken']} of them sets of every partition" if r.get("sets_taken") else ""
    healed = f", {r['taken_after_heal']} after the heal (none checked under the faults)" \
        if r.get("taken_after_heal") else ""
    failures = f" [{'; '.join(r['failure_samples'])}]" if r.get("failure_samples") else ""
    return (f"{r['backups_taken']} backups taken{sets}{healed} ({r['backups_failed']} failed under faults"
            f"{failures}), "
            f"{r['restores_checked']} restored and checked ({r['probe_items_checked']} probe items), "
            f"{len(r['invalid_restores'])} not as the history says, "
            f"{len(r.get('behind', []))} behind a commit acknowledged before it was asked for"
            + "".join(f"\n      not as the history says: {_restore_offenders(v)}" for v in r["invalid_restores"]))


OFFENDER_KINDS = ("missing", "from_after", "reappeared", "unknown_items", "duplicated", "duplicated_values", "error")


def _restore_offenders(verdict: dict[str, Any]) -> str:
    """What a restore held against its history: each kind of offender with a few samples."""
    where = [("", verdict)] + [(f"{name} ", v) for name, v in (verdict.get("partitions") or {}).items()]
    found = [f"{prefix}{kind} {v[kind] if kind == 'error' else v[kind][:SAMPLES_SHOWN_MAX]}"
             for prefix, v in where for kind in OFFENDER_KINDS if v.get(kind)]
    if verdict.get("identity_new") is False:
        found.append("the restored cluster kept the backed-up cluster's identity")
    return f"backup {verdict.get('number')} at index {verdict.get('index')}: " + ("; ".join(found) or "no offender named")


def _limits_line(r: dict[str, Any]) -> str:
    by_queue = ", ".join(f"{queue} {n}" for queue, n in (r.get("queue_full_refusals_by_queue") or {}).items())
    line = (f"{r['limited_reads']} reads of a limited queue, {r['over_limit_count']} over its max_items; "
            f"{r.get('fragment_reads', 0)} reads of a spread queue's fragment, {r.get('over_share_count', 0)} over "
            f"its share; {r.get('wrong_limit_count', 0)} limits or shares not as configured; "
            f"{r['queue_full_refusals']} enqueues/moves refused queue_full" + (f" ({by_queue})" if by_queue else ""))
    for key, label in (("over_limit", "over the limit"), ("over_share", "over its share"), ("wrong_limit", "wrong limit")):
        if r.get(f"{key}_count"):
            line += f"\n      {label}: " + "; ".join(str(sample) for sample in r[key][:SAMPLES_SHOWN_MAX])
    return line


def _security_line(r: dict[str, Any]) -> str:
    if not r.get("checked"):
        return f"not checked ({r.get('skipped')})"
    guest = r["guest"]
    line = (
        f"{r['attempts_count']} intrusion attempts by {r.get('principal')!r}: {r['refused_count']} refused as expected, "
        f"{r['info_count']} no answer, {r['not_sent_count']} not sent, {r['not_held_count']} answered by a leader "
        f"that did not hold the transaction, {r['allowed_count']} allowed, {r['unexpected_count']} unexpected; "
        f"{r['hijacks_on_open_count']}/{r['hijacks_count']} hijacks on an open transaction "
        f"({r['hijacks_open_throughout_count']} open throughout); guest ops ok {guest['ok']}, fail {guest['fail']}, "
        f"info {guest['info']}, refused {guest['refused']}"
    )
    for f, kind in r["by_kind"].items():
        counts = ", ".join(f"{outcome} {count}" for outcome, count in kind.items() if outcome != "attempts" and count)
        line += f"\n      {f}: {kind['attempts']} attempts" + (f" ({counts})" if counts else "")
    for key in ("allowed", "unexpected", "not_held"):
        for sample in r[key][:SAMPLES_SHOWN_MAX]:
            line += f"\n      {key}: " + ", ".join(f"{k} {v}" for k, v in sample.items())
    for note in r["notes"]:
        line += f"\n      note: {note}"
    return line


def _partitions_line(r: dict[str, Any]) -> str:
    if not r.get("checked"):
        return "not checked (a run without partitions)"
    attempts = ", ".join(f"{outcome} {count}" for outcome, count in r["cross_partition"].items()) or "none"
    by_partition = ", ".join(f"{p} {n}" for p, n in r["acknowledged_by_partition"].items())
    line = (f"cross-partition attempts: {attempts}; {r['spanning_count']} committed across two partitions, "
            f"{r['wrongly_refused_count']} refused within one; acknowledged values by partition: {by_partition}; "
            f"{r['partition_processes_killed']} partition processes killed, {r['partition_processes_restarted']} "
            f"seen restarted, {len(r['not_restarted'])} not")
    for key in ("spanning", "wrongly_refused", "not_restarted"):
        for sample in r[key][:SAMPLES_SHOWN_MAX]:
            line += f"\n      {key}: {sample}"
    spread = r.get("spread") or {}
    if spread.get("checked"):
        line += "\n      " + _spread_line(spread)
    return line


def _spread_line(r: dict[str, Any]) -> str:
    """The spread queues' part of the partitions line (chaos.checkers.spread)."""
    acknowledged = "; ".join(f"{q} " + ", ".join(f"{p} {n}" for p, n in by.items())
                             for q, by in r["acknowledged_by_fragment"].items() if by)
    refused = "; ".join(f"{q} " + ", ".join(f"{p} {n}" for p, n in by.items())
                        for q, by in (r.get("refused_full_by_fragment") or {}).items() if by)
    line = (f"spread queues: acknowledged by fragment: {acknowledged or 'none'}"
            + (f"; refused queue_full by fragment: {refused}" if refused else "") + f"; lost {r['lost_count']}, "
            f"duplicated {r['duplicated_count']} ({r['duplicated_across_fragments_count']} across fragments), "
            f"phantom {r['phantom_count']}, out of a wrong fragment {r['wrong_fragment_count']}")
    starvation = r["starvation"]
    if not starvation.get("checked"):
        line += f"; starvation not checked ({starvation.get('why', 'no round filled')})"
    for judged in starvation.get("rounds") or []:
        line += (f"\n      starvation {judged['mode']}: took {sum(judged['taken'].values())} of "
                 f"{sum(judged['filled'].values())} (by fragment {judged['taken']}) within the bound of "
                 f"{judged['bound_s']:g} s, in {judged['elapsed_s']} s, {judged['takes']} takes"
                 + (f"; STARVED {judged['starved']}" if judged["starved"] else "")
                 + (f"; unknown {judged['unknown']} (unanswered takes)" if judged["unknown"] else ""))
    for key in ("lost", "duplicated", "phantom", "wrong_fragment"):
        for sample in r[key][:SAMPLES_SHOWN_MAX]:
            line += f"\n      spread {key}: {sample}"
    return line


_LINES = {
    "total_queue": _total_queue_line,
    "atomicity": _atomicity_line,
    "aborted_return": _aborted_line,
    "features": features_summary_line,
    "headers": headers_summary_line,
    "convergence": _convergence_line,
    "membership": _membership_line,
    "liveness": _liveness_line,
    "limits": _limits_line,
    "security": _security_line,
    "ordering": _ordering_line,
    "backups": _backups_line,
    "partitions": _partitions_line,
}


def summary_text(results: dict[str, Any], seed: int | str | None, **parameters: Any) -> str:
    """A human summary: verdict, seed and run parameters, one line per checker."""
    verdict = "VALID" if results.get("valid") else "INVALID"
    lines = [f"rcq chaos run: {verdict}  (seed {seed})"]
    if parameters:
        lines.append("  " + ", ".join(f"{key}={value}" for key, value in parameters.items()))
    stats = results.get("stats")
    if stats:
        lines.append(f"  {stats['client_ops']} client ops, {stats['nemesis_lines']} nemesis events")
        one_request = stats.get("one_request_enqueues_by_type")
        if one_request:
            lines.append("  one-request enqueues: " + ", ".join(f"{n} {t}" for t, n in one_request.items()))
    for name, describe in _LINES.items():
        if name in results:
            lines.append(f"  {_verdict(results[name])} {name}: {describe(results[name])}")
    releases = results.get("releases")
    if releases and releases.get("checked"):  # a metric: which release led (the upgrade nemesis)
        led = ", ".join(f"{release} {seconds:g} s" for release, seconds in releases["led_s"].items())
        lines.append(f"  metric  releases: led {led}; lost after another release led "
                     f"{releases['lost_after_another_release_led']}, lost while only the code under test led "
                     f"{releases['lost_with_only_the_code_under_test_leading']}")
    if not results.get("valid"):
        lines.append(f"  reproduce with --seed {seed}")
    return "\n".join(lines) + "\n"


def results_document(results: dict[str, Any], seed: int | str | None, **parameters: Any) -> dict[str, Any]:
    return {"valid": bool(results.get("valid")), "seed": seed, "parameters": parameters, "results": results}


def write_results(path: str | Path, results: dict[str, Any], seed: int | str | None, **parameters: Any) -> Path:
    """The results JSON: verdict, seed, run parameters and every checker's output."""
    target = Path(path)
    document = results_document(results, seed, **parameters)
    target.write_text(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    return target
