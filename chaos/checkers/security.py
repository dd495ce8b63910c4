"""The security checker: a principal never gets what its token does not grant, nor into another's transaction.

The workload's intruder (chaos.intruder.Intruder) holds a token that may produce and consume
``guest*`` only, and keeps trying, while the faults run, what it must not do. Each attempt is an
op of the intruder's process, and the answer it must get is fixed by docs/security.md:

* ``intrude-enqueue`` / ``intrude-dequeue`` / ``intrude-manage`` (purge, configure, delete) on a
  workload queue: ``forbidden`` (the permission is checked before anything changes);
* ``intrude-hijack`` — commit, abort, extend, dequeue or enqueue in a transaction a worker had
  open: ``transaction_not_found``, as for an id that never existed (its enqueues and dequeues
  are on the guest queue, which the intruder may use, so only ownership can refuse them);
* ``intrude-unread`` — a session channel flooded with requests whose answers are never read:
  ``not_read``, the leader stopped taking frames (``session_unsent_bytes_max``, docs/limits.md);
  allowed (``ok``) when it kept taking them for the whole flood, as a node that keeps every
  answer does.

**Invalid** when an attempt was allowed (``ok``), or refused with any other code while the
cluster answered. No answer is fine — transport errors, ``unavailable``, ``no_leader``,
``not_leader``, timeouts, an unknown outcome (``info``) — faults are running; so is an attempt
never sent (the intruder's own transaction could not begin: ``step`` ``begin``).

**One documented exception.** Owners are not replicated: a leader that did not begin a
transaction (a later one: the leader that began it answers ``transaction_not_found`` while it
leads) answers a verb on it as it would for anyone — its outcome (``transaction_committed``,
a duplicate commit, ``commit_conflict``), ``leader_changed``, ``transaction_aborted``,
``transaction_expired`` or ``outcome_expired``. Such an answer changes nothing. It is counted
apart (``not_held``) and accepted only when the history shows a leader change could explain it:
the code is ``leader_changed``, or a leader of a later term than the transaction's (an id is
``"<term in hex>.<random>"``) was sampled by the time the answer came (plus the sampling's
slack). From the leader that began the transaction the same answer would be a leak: invalid.
Likewise an ``intrude-unread`` flood that ran to its end (``ok``) while a leader of a later term
than the one leading at its start was sampled: its node stopped serving and closed the channel,
and while aiohttp waits for the client's close frame it reads and drops what comes (bounded in
time, nothing kept), so the flood is taken to its end. Counted ``not_held``, not allowed.

Counts, per kind: attempts, refused as expected, no answer, not sent, not held, allowed,
unexpected. Hijacks are also counted by whether they targeted a transaction still open — the
worker's op with that transaction id was running when the hijack was invoked (``on_open``), or
until its answer (``open_throughout``): a run without any tested nothing of ownership, and the
result says so, as the limits checker does for refusals. The intruder's ``guest-enqueue`` and
``guest-dequeue`` show its token works at all; a guest op refused ``forbidden`` /
``unauthorized`` means its grant does not: invalid.

The intruder's values are ``"intruder-<n>"``, which no worker produces, and its ops are none of
the queue model's, so the queue checkers see them only if they got through: one in a workload
queue is *unexpected*, a workload value an allowed intrusion took is *lost*. The guest queue is
left out of them (never drained, never modelled). Without an ``intruder`` checker input (a
history from before the intruder, or a target that cannot issue tokens: ``skipped``) the
checker says ``checked: false`` and stays valid.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel
from chaos.history import CHECKER_INPUT_PROCESS, PairedOp

INTRUSION_FS = ("intrude-enqueue", "intrude-dequeue", "intrude-manage", "intrude-hijack", "intrude-unread")
GUEST_FS = ("guest-enqueue", "guest-dequeue")
SECURITY_FS = INTRUSION_FS + GUEST_FS
EXPECTED_CODE = {"intrude-enqueue": "forbidden", "intrude-dequeue": "forbidden", "intrude-manage": "forbidden",
                 "intrude-hijack": "transaction_not_found", "intrude-unread": "not_read"}
# No answer to the attempt (the cluster could not serve it now, or the client gave up).
NO_ANSWER_CODES = frozenset({"unavailable", "no_leader", "not_ready", "too_many_connections", "not_leader",
                             "commit_outcome_unknown", "request_timeout", "TimeoutError", "no completion recorded"})
# What a leader that does not hold a transaction answers for it (see the module docstring).
NOT_HELD_CODES = frozenset({"leader_changed", "transaction_aborted", "transaction_expired", "commit_conflict",
                            "transaction_committed", "outcome_expired"})
AUTH_REFUSALS = frozenset({"forbidden", "unauthorized", "token_expired"})
# Leaders are sampled every 0.25 s, more slowly when nodes are paused or cut off.
LEADER_SAMPLE_SLACK_S = 3.0
OUTCOMES = ("refused", "info", "not_sent", "not_held", "allowed", "unexpected")


def is_security_op(f: str) -> bool:
    """An op of the intruder: not the workload's (left out of availability and the timeline)."""
    return f in SECURITY_FS


def check_security(model: QueueModel, history: list[dict[str, Any]]) -> dict[str, Any]:
    intruder = _intruder_input(history)
    ops = [op for op in model.ops if op.f in SECURITY_FS]
    if intruder is None and not ops:
        return {"valid": True, "checked": False, "skipped": "no intruder in this history"}
    if intruder is not None and intruder.get("skipped"):
        return {"valid": True, "checked": False, "skipped": str(intruder["skipped"])}
    later_leader, term_at = _later_leader_seen(history), _term_seen_at(history)
    victims = {str(op.value["transaction_id"]): op for op in model.ops
               if op.f not in SECURITY_FS and isinstance(op.value, dict) and op.value.get("transaction_id")}
    by_kind = {f: dict.fromkeys(("attempts", *OUTCOMES), 0) for f in INTRUSION_FS}
    samples: dict[str, list[dict[str, Any]]] = {"allowed": [], "unexpected": [], "not_held": []}
    hijack_verbs: dict[str, int] = {}
    on_open = open_throughout = 0
    guest = dict.fromkeys(("ok", "fail", "info", "refused"), 0)
    for op in ops:
        value = op.value if isinstance(op.value, dict) else {}
        if op.f in GUEST_FS:
            guest[op.type] = guest.get(op.type, 0) + 1
            if op.type == "fail" and op.error in AUTH_REFUSALS:
                guest["refused"] += 1
                samples["unexpected"].append(_sample(op, value))
            continue
        outcome = _judge(op, value, later_leader, term_at)
        by_kind[op.f]["attempts"] += 1
        by_kind[op.f][outcome] += 1
        if outcome in samples:
            samples[outcome].append(_sample(op, value))
        if op.f == "intrude-hijack":
            verb = str(value.get("verb"))
            hijack_verbs[verb] = hijack_verbs.get(verb, 0) + 1
            victim = victims.get(str(value.get("transaction_id")))
            if victim is not None and _running_at(victim, op.invoke_index):
                on_open += 1
                if op.complete_index is not None and _running_at(victim, op.complete_index):
                    open_throughout += 1
    totals = {outcome: sum(kind[outcome] for kind in by_kind.values()) for outcome in ("attempts", *OUTCOMES)}
    hijacks = by_kind["intrude-hijack"]["attempts"]
    notes = []
    if not totals["attempts"]:
        notes.append("the intruder made no attempt: nothing was tested")
    elif not on_open:
        notes.append("no hijack targeted a transaction then open: ownership was not tested")
    if not guest["ok"]:
        notes.append("no guest op succeeded: the intruder's token never showed it works")
    return {
        "valid": not (totals["allowed"] or totals["unexpected"] or guest["refused"]),
        "checked": True,
        "principal": (intruder or {}).get("principal"),
        **{f"{outcome}_count": count for outcome, count in totals.items()},
        "by_kind": by_kind,
        "hijacks_count": hijacks,
        "hijack_verbs": dict(sorted(hijack_verbs.items())),
        "hijacks_on_open_count": on_open,
        "hijacks_open_throughout_count": open_throughout,
        "guest": guest,
        "allowed": samples["allowed"][:SAMPLE_SIZE_MAX],
        "unexpected": samples["unexpected"][:SAMPLE_SIZE_MAX],
        "not_held": samples["not_held"][:SAMPLE_SIZE_MAX],
        "notes": notes,
    }


def _judge(op: PairedOp, value: dict[str, Any], later_leader: Callable[[int, float], bool],
           term_at: Callable[[float], int | None] = lambda _: None) -> str:
    """One of OUTCOMES for an intrusion attempt."""
    if op.type == "ok":
        duplicate_commit = value.get("verb") == "commit" and value.get("duplicate") is True
        if op.f == "intrude-hijack" and duplicate_commit and _explained(op, value, later_leader):
            return "not_held"
        if op.f == "intrude-unread" and _leadership_changed_during(op, later_leader, term_at):
            return "not_held"
        return "allowed"
    if value.get("step") == "begin":
        return "not_sent"
    code = op.error
    if op.type == "info" or code in NO_ANSWER_CODES:
        return "info"
    if code == EXPECTED_CODE[op.f]:
        return "refused"
    if op.f == "intrude-hijack" and code in NOT_HELD_CODES and (
            code == "leader_changed" or _explained(op, value, later_leader)):
        return "not_held"
    return "unexpected"


def _leadership_changed_during(op: PairedOp, later_leader: Callable[[int, float], bool],
                               term_at: Callable[[float], int | None]) -> bool:
    """Whether a leader of a later term than the one leading at the flood's start was seen by its
    end: the channel's node stopped serving meanwhile, and closed the channel; while aiohttp waits
    for the client's close frame it reads and drops what comes (bounded in time, nothing kept)."""
    start = term_at(op.invoke_time_s)
    ended_s = op.complete_time_s if op.complete_time_s is not None else op.invoke_time_s
    return start is not None and later_leader(start, ended_s + LEADER_SAMPLE_SLACK_S)


def _explained(op: PairedOp, value: dict[str, Any], later_leader: Callable[[int, float], bool]) -> bool:
    """Whether a leader of a later term than the hijacked transaction's was seen by the answer's time."""
    term = _term_of(value.get("transaction_id"))
    answered_s = op.complete_time_s if op.complete_time_s is not None else op.invoke_time_s
    return term is not None and later_leader(term, answered_s + LEADER_SAMPLE_SLACK_S)


def _term_of(transaction_id: Any) -> int | None:
    prefix, separator, _ = str(transaction_id).partition(".")
    try:
        return int(prefix, 16) if separator else None
    except ValueError:
        return None


def _leader_terms(history: list[dict[str, Any]]) -> dict[int, float]:
    """term -> when a leader of it was first sampled."""
    first_seen_s: dict[int, float] = {}
    for op in history:
        if op.get("process") != CHECKER_INPUT_PROCESS or op.get("f") != "leaders" or not isinstance(op.get("value"), list):
            continue
        for sample in op["value"]:
            if isinstance(sample, dict) and "time_s" in sample and sample.get("term") is not None:
                term, time_s = int(sample["term"]), float(sample["time_s"])
                first_seen_s[term] = min(time_s, first_seen_s.get(term, time_s))
    return first_seen_s


def _later_leader_seen(history: list[dict[str, Any]]) -> Callable[[int, float], bool]:
    """``seen(term, by_s)``: was a leader of a term above ``term`` sampled at or before ``by_s``?"""
    first_seen_s = _leader_terms(history)

    def seen(term: int, by_s: float) -> bool:
        return any(later > term and time_s <= by_s for later, time_s in first_seen_s.items())

    return seen


def _term_seen_at(history: list[dict[str, Any]]) -> Callable[[float], int | None]:
    """``at(time_s)``: the highest term whose leader had been sampled by then (None: none yet)."""
    first_seen_s = _leader_terms(history)
    return lambda time_s: max((term for term, seen_s in first_seen_s.items() if seen_s <= time_s), default=None)


def _running_at(op: PairedOp, index: int) -> bool:
    """Whether ``op`` had been invoked and not yet completed at history line ``index``."""
    return op.invoke_index < index and (op.complete_index is None or index < op.complete_index)


def _intruder_input(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    recorded = [op.get("value") for op in history
                if op.get("process") == CHECKER_INPUT_PROCESS and op.get("f") == "intruder"]
    return recorded[-1] if recorded and isinstance(recorded[-1], dict) else None


def _sample(op: PairedOp, value: dict[str, Any]) -> dict[str, Any]:
    sample = {"f": op.f, "type": op.type, "error": op.error, "invoke_index": op.invoke_index}
    for key in ("verb", "via", "queue", "transaction_id", "victim_f", "duplicate", "step"):
        if key in value:
            sample[key] = value[key]
    return sample
