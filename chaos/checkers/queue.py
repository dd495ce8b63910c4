"""The total-queue and atomicity checkers (Jepsen's total-queue, made transactional).

total-queue, over the whole run and the final drain:

* **lost** — a value known to be in the system (an ok enqueue, or a value of
  an info enqueue that was seen) that no committed dequeue or drain took out
  and no info dequeue maybe took out. Moves never take a value out: a moved
  value must still leave from its new queue.
* **unexpected** — a value seen coming out that no enqueue attempted, or
  that only a failed enqueue attempted.
* **duplicated** — a value taken out of one queue by more committed
  transactions than could have put it there. rcq is transactional, so
  unlike Jepsen's default this fails the run. Where the excess is explained
  by an op of unknown outcome — an info dequeue or move that did not commit
  after all, or an info enqueue (a retry of the value) that did — it is
  ``duplicated_with_unknown``: reported, not a failure.
* **misplaced** — a value seen in a queue it was never enqueued or moved to.
* **recovered** (info enqueues later dequeued) and **maybe_removed** (values
  whose only way out was an info dequeue) are counts, not failures.
* **refused_full**: values of enqueues refused ``queue_full`` (a limited
  queue, or a limited spread queue's fragment, at its limit): definite
  failures like any ``fail``, never in a queue, so never lost (and
  *unexpected* if seen); a count.
* Dead letters: a value that died is seen in its queue's dead-letter queue
  and leaves from there (not misplaced); a value the rules let vanish
  (``model.may_vanish``: expired or dropped where there is no dead-letter
  queue) is **vanished_by_rule**, a count, not lost. The features checker
  holds those to the queues' counters and every other rule of dead letters.

atomicity: an ok enqueue's values all appear; an info enqueue's values all
appear or none do; a committed move's values all reach ``to`` and are never
also taken from ``from`` beyond what was put there.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel, Removal, build_model


@dataclass(frozen=True, slots=True)
class _Accounting:
    """Where every value the history names went, as the total-queue checker counts it."""

    acknowledged: set[Hashable]
    unknown: set[Hashable]
    failed: set[Hashable]
    seen: set[Hashable]
    taken_out: set[Hashable]
    maybe_taken_out: set[Hashable]
    vanished: set[Hashable]
    lost: set[Hashable]


def _accounting(model: QueueModel) -> _Accounting:
    acknowledged, unknown, seen = model.enqueued("ok"), model.enqueued("info"), model.seen_values()
    taken_out = {r.value for r in model.removals if r.committed and r.op.f in ("dequeue", "drain")}
    maybe_taken_out = {r.value for r in model.removals if r.committed is None and r.op.f in ("dequeue", "drain")}
    known_in = acknowledged | (unknown & seen)
    vanished = (known_in - taken_out - maybe_taken_out) & set(model.may_vanish)
    return _Accounting(acknowledged, unknown, model.enqueued("fail"), seen, taken_out, maybe_taken_out, vanished,
                       lost=known_in - taken_out - maybe_taken_out - vanished)


def lost_values(model: QueueModel) -> set[Hashable]:
    """Values acknowledged (or seen after an unknown enqueue) that nobody took out and no rule removed."""
    return _accounting(model).lost


def check_total_queue(history: Any) -> dict[str, Any]:
    model = history if isinstance(history, QueueModel) else build_model(history)
    counted = _accounting(model)
    acknowledged, unknown, failed, seen = counted.acknowledged, counted.unknown, counted.failed, counted.seen
    lost, taken_out, maybe_taken_out, vanished = counted.lost, counted.taken_out, counted.maybe_taken_out, counted.vanished
    never_enqueued = seen - acknowledged - unknown - failed
    from_failed = (seen & failed) - acknowledged - unknown
    unexpected = never_enqueued | from_failed
    duplicated, duplicated_with_unknown = _duplicates(model)
    misplaced = _misplaced(model)
    valid = not (lost or unexpected or duplicated or misplaced)
    return {
        "valid": valid,
        "attempted_count": len(acknowledged | unknown | failed),
        "acknowledged_count": len(acknowledged),
        "unknown_enqueue_count": len(unknown),
        "failed_enqueue_count": len(failed),
        "refused_full_count": len(_refused_full(model) - acknowledged - unknown),
        "dequeued_count": len(taken_out),
        "lost_count": len(lost),
        "lost": model.sample(lost),
        "unexpected_count": len(unexpected),
        "unexpected": model.sample(unexpected),
        "unexpected_from_failed_enqueue_count": len(from_failed),
        "duplicated_count": len(duplicated),
        "duplicated": _sample_details(model, duplicated),
        "duplicated_with_unknown_count": len(duplicated_with_unknown),
        "duplicated_with_unknown": _sample_details(model, duplicated_with_unknown),
        "misplaced_count": len(misplaced),
        "misplaced": _sample_details(model, misplaced),
        "recovered_count": len(unknown & taken_out),
        "recovered": model.sample(unknown & taken_out),
        "unknown_enqueue_absent_count": len(unknown - seen),
        "maybe_removed_count": len(maybe_taken_out - taken_out),
        "maybe_removed": model.sample(maybe_taken_out - taken_out),
        "vanished_by_rule_count": len(vanished),
        "vanished_by_rule": model.sample(vanished),
    }


def _refused_full(model: QueueModel) -> set[Hashable]:
    """The values of enqueues refused queue_full: definite failures, never put in."""
    return {value for tx in model.enqueues if tx.op.type == "fail" and tx.op.error == "queue_full" for value in tx.values}


def _insertions(model: QueueModel) -> tuple[Counter[tuple[Hashable, str]], Counter[tuple[Hashable, str]]]:
    """How many times each value surely, and at most, was put into each queue.

    Surely: ok enqueues and committed moves (ok, or info and seen in the
    target). At most: those plus info enqueues and unresolved info moves.
    """
    sure: Counter[tuple[Hashable, str]] = Counter()
    at_most: Counter[tuple[Hashable, str]] = Counter()
    for tx in model.enqueues:
        if tx.op.type != "fail":
            for queue, values in tx.writes:
                at_most.update((value, queue) for value in values)
                if tx.op.type == "ok":
                    sure.update((value, queue) for value in values)
    for move in model.moves:
        if move.op.type != "fail":
            at_most.update((value, move.target) for value in move.values)
            if move.committed:
                sure.update((value, move.target) for value in move.values)
    return sure, at_most


def duplicates(model: QueueModel) -> tuple[dict[Hashable, dict[str, Any]], dict[Hashable, dict[str, Any]]]:
    """The values duplicated (taken out of a queue more often than anything could have put them
    there), and those whose excess an op of unknown outcome explains: value -> its details."""
    return _duplicates(model)


def _duplicates(model: QueueModel) -> tuple[dict[Hashable, dict[str, Any]], dict[Hashable, dict[str, Any]]]:
    inserted_surely, inserted_at_most = _insertions(model)
    committed: Counter[tuple[Hashable, str]] = Counter()
    unknown: Counter[tuple[Hashable, str]] = Counter()
    removals_by_key: dict[tuple[Hashable, str], list[Removal]] = {}
    for removal in model.removals:
        key = (removal.value, removal.queue)
        removals_by_key.setdefault(key, []).append(removal)
        if removal.committed:
            committed[key] += 1
        elif removal.committed is None:
            unknown[key] += 1
    duplicated: dict[Hashable, dict[str, Any]] = {}
    duplicated_with_unknown: dict[Hashable, dict[str, Any]] = {}
    for key in committed.keys() | unknown.keys():
        value, queue = key
        # A value never put anywhere can still be taken out once: that is "unexpected", not a duplicate.
        capacity_sure = max(inserted_surely[key], 1)
        capacity_max = max(inserted_at_most[key], 1)
        if committed[key] + unknown[key] <= capacity_sure:
            continue
        details = {
            "value": value,
            "queue": queue,
            "by": [
                {"f": r.op.f, "type": r.op.type, "process": r.op.process, "invoke_index": r.op.invoke_index}
                for r in removals_by_key[key]
                if r.committed is not False
            ],
        }
        if committed[key] > capacity_max:
            duplicated[value] = details
        else:
            duplicated_with_unknown[value] = details
    return duplicated, duplicated_with_unknown


def _misplaced(model: QueueModel) -> dict[Hashable, dict[str, Any]]:
    possible: dict[Hashable, set[str]] = {}
    for tx in model.enqueues:
        for queue, values in tx.writes:
            for value in values:
                possible.setdefault(value, set()).add(queue)
    for move in model.moves:
        if move.op.type != "fail":
            for value in move.values:
                possible.setdefault(value, set()).add(move.target)
    for queues in possible.values():  # a value may die into the dead-letter queue of a queue it was in
        queues.update({dlq for queue in list(queues) if (dlq := model.dead_letter_queue_of(queue)) is not None})
    misplaced: dict[Hashable, dict[str, Any]] = {}
    for sighting in model.sightings:
        allowed = possible.get(sighting.value)
        # A value no enqueue attempted is "unexpected" already.
        if allowed is not None and sighting.queue not in allowed and sighting.value not in misplaced:
            misplaced[sighting.value] = {
                "value": sighting.value,
                "queue": sighting.queue,
                "expected_queues": sorted(allowed),
                "by": [{"f": sighting.op.f, "type": sighting.op.type, "invoke_index": sighting.op.invoke_index}],
            }
    return misplaced


def _sample_details(model: QueueModel, details: dict[Hashable, dict[str, Any]]) -> list[dict[str, Any]]:
    return [details[value] for value in model.sample(details)][:SAMPLE_SIZE_MAX]


def check_atomicity(history: Any) -> dict[str, Any]:
    model = history if isinstance(history, QueueModel) else build_model(history)
    seen = model.seen_values()
    incomplete_ok: list[dict[str, Any]] = []
    partial_info: list[dict[str, Any]] = []
    for tx in model.enqueues:
        values = tx.values
        appeared = [value for value in values if value in seen]
        missing = [value for value in values if value not in seen and value not in model.may_vanish]
        if tx.op.type == "ok" and missing:
            incomplete_ok.append(_tx_details(tx.op, appeared, missing))
        elif tx.op.type == "info" and appeared and missing:
            partial_info.append(_tx_details(tx.op, appeared, missing))
    moves_in_both, moves_not_in_target = _move_violations(model)
    valid = not (incomplete_ok or partial_info or moves_in_both or moves_not_in_target)
    return {
        "valid": valid,
        "enqueue_transactions_count": len(model.enqueues),
        "multi_queue_enqueue_transactions_count": sum(1 for tx in model.enqueues if len({q for q, _ in tx.writes}) > 1),
        "incomplete_ok_enqueues_count": len(incomplete_ok),
        "incomplete_ok_enqueues": incomplete_ok[:SAMPLE_SIZE_MAX],
        "partial_info_enqueues_count": len(partial_info),
        "partial_info_enqueues": partial_info[:SAMPLE_SIZE_MAX],
        "moves_count": len(model.moves),
        "committed_moves_count": sum(1 for move in model.moves if move.committed),
        "moves_in_both_queues_count": len(moves_in_both),
        "moves_in_both_queues": moves_in_both[:SAMPLE_SIZE_MAX],
        "moves_not_in_target_count": len(moves_not_in_target),
        "moves_not_in_target": moves_not_in_target[:SAMPLE_SIZE_MAX],
    }


def _tx_details(op: Any, appeared: list[Hashable], missing: list[Hashable]) -> dict[str, Any]:
    return {
        "invoke_index": op.invoke_index,
        "process": op.process,
        "type": op.type,
        "appeared": appeared[:SAMPLE_SIZE_MAX],
        "missing": missing[:SAMPLE_SIZE_MAX],
    }


def _move_violations(model: QueueModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    _, inserted_at_most = _insertions(model)
    taken: Counter[tuple[Hashable, str]] = Counter(
        (removal.value, removal.queue) for removal in model.removals if removal.committed
    )
    in_both: list[dict[str, Any]] = []
    not_in_target: list[dict[str, Any]] = []
    for move in model.moves:
        if not move.committed:
            continue
        for value in move.values:
            details = {"value": value, "from": move.source, "to": move.target, "type": move.op.type,
                       "invoke_index": move.op.invoke_index}
            if taken[(value, move.source)] > max(inserted_at_most[(value, move.source)], 1):
                in_both.append(details)
            arrived_in = {move.target, model.dead_letter_queue_of(move.target)}  # dead there: it arrived
            arrived = value in model.may_vanish or any(
                s.queue in arrived_in and s.op is not move.op and s.order_index > move.op.invoke_index
                for s in model.sightings_by_value.get(value, ())
            )
            if not arrived:
                not_in_target.append(details)
    return in_both, not_in_target
