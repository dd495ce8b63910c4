"""The spread checker: a spread queue's fragments together hand out every acknowledged item exactly
once, each from the fragment it was put into, and one consumer alone drains them all
(docs/partitions.md, "Spread queues"). Part of the partitions checker (chaos.checkers.partitions).

A spread queue (a ``configure`` op whose ``partitions`` names several; its dead-letter queue is
spread over the same ones) has a fragment in each of them. Every op of a run with spread queues
that ran a transaction records the partition it ran in (``partition``, chaos.executor), and each
item dequeued from a spread queue in a transaction its fragment (``pt``). A one-request enqueue
does not say which fragment it went to: its fragment is unknown.

**Invalid** when, on a spread queue (or its dead-letter queue):

* ``lost``: a value put into a spread queue that the total-queue checker finds lost (named with
  the queue and fragment it was last put into);
* ``duplicated``: taken out of a spread queue by more committed transactions than could have put
  it there (with the fragments it was taken from: ``across_fragments`` when there are several);
* ``phantom``: seen coming out of a spread queue though no enqueue attempted it;
* ``wrong_fragment``: seen coming out of a fragment it was never put into, when every insertion
  into that queue ran in a known partition (a dead letter: into its source's);
* ``starved``: a round of the starvation probe (chaos.starvation) whose lone consumer had not taken
  every value committed into a fragment within the round's bound (``bound_s``, stated with each
  round). A round with an unanswered take (``info``: it may have taken the missing values) says
  ``unknown`` instead; a round whose fill committed nothing is not checked.

Counts: per spread queue, the values acknowledged into each fragment (``unknown``: one-request
enqueues), the values taken out of each (committed dequeues, drains and moves), and the values
of enqueues and moves into it refused ``queue_full`` by each (``refused_full_by_fragment``: a
limited spread queue's fragment at its share). A refusal is a definite failure, as on any limited
queue: its values were never put in, so they are neither acknowledged nor lost.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel
from chaos.checkers.queue import duplicates, lost_values
from chaos.history import CHECKER_INPUT_PROCESS, PairedOp

UNKNOWN = "unknown"  # the fragment of a one-request enqueue: the client does not say
QUEUE_FULL = "queue_full"


def ran_in(op: PairedOp) -> str | None:
    """The partition ``op``'s transaction ran in, as it recorded (None: not recorded)."""
    value = op.value if isinstance(op.value, dict) else {}
    partition = value.get("partition")
    return str(partition) if isinstance(partition, str) else None


def check_spread(model: QueueModel, history: list[dict[str, Any]], placed: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    spread = {queue: partitions for queue, partitions in placed.items() if len(partitions) > 1}
    if not spread:
        return {"valid": True, "checked": False}
    into = _insertions(model, spread)
    wrong = _wrong_fragments(model, spread, into)
    ever_in = {value for value, _ in into}
    lost = sorted((v for v in lost_values(model) if v in ever_in), key=lambda v: model.first_index.get(v, -1))
    duplicated = _duplicated(model, spread)
    phantom = _phantom(model, spread)
    starvation = check_starvation(model, history)
    return {
        "valid": not (lost or duplicated or phantom or wrong) and starvation["valid"],
        "checked": True,
        "queues": {queue: list(partitions) for queue, partitions in sorted(spread.items())},
        "acknowledged_by_fragment": _acknowledged(model, spread),
        "taken_by_fragment": _taken(model, spread),
        "refused_full_by_fragment": _refused_full(model, spread),
        "lost_count": len(lost),
        "lost": [{"value": v, "last_put_into": _last_put(model, spread, v)} for v in lost[:SAMPLE_SIZE_MAX]],
        "duplicated_count": len(duplicated),
        "duplicated_across_fragments_count": sum(1 for d in duplicated if len(d["fragments"]) > 1),
        "duplicated": duplicated[:SAMPLE_SIZE_MAX],
        "phantom_count": len(phantom),
        "phantom": phantom[:SAMPLE_SIZE_MAX],
        "wrong_fragment_count": len(wrong),
        "wrong_fragment": wrong[:SAMPLE_SIZE_MAX],
        "starvation": starvation,
    }


def _insertions(model: QueueModel, spread: dict[str, tuple[str, ...]]) -> dict[tuple[Hashable, str], set[str | None]]:
    """(value, spread queue) -> the fragments any enqueue or move (not failed) may have put it into
    (None: one whose partition is not known)."""
    into: dict[tuple[Hashable, str], set[str | None]] = defaultdict(set)
    for tx in model.enqueues:
        if tx.op.type != "fail":
            for queue, values in tx.writes:
                if queue in spread:
                    for value in values:
                        into[(value, queue)].add(ran_in(tx.op))
    for move in model.moves:
        if move.op.type != "fail" and move.target in spread:
            for value in move.values:
                into[(value, move.target)].add(ran_in(move.op))
    return into


def _wrong_fragments(model: QueueModel, spread: dict[str, tuple[str, ...]],
                     into: dict[tuple[Hashable, str], set[str | None]]) -> list[dict[str, Any]]:
    wrong: list[dict[str, Any]] = []
    for sighting in model.sightings:
        if sighting.queue not in spread:
            continue
        item = sighting.item or {}
        came_from = item.get("pt") if isinstance(item.get("pt"), str) else ran_in(sighting.op)
        if came_from is None:
            continue
        allowed = set(into.get((sighting.value, sighting.queue), set()))
        dead = sighting.dead_letter
        if dead is not None:  # a dead letter moved inside its fragment's transaction
            allowed |= into.get((sighting.value, dead[1]), set())
        if allowed and None not in allowed and came_from not in allowed:
            wrong.append({"value": sighting.value, "queue": sighting.queue, "from_fragment": came_from,
                          "put_into": sorted(str(p) for p in allowed), "f": sighting.op.f,
                          "invoke_index": sighting.op.invoke_index})
    return wrong


def _duplicated(model: QueueModel, spread: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    found, _ = duplicates(model)
    out: list[dict[str, Any]] = []
    for value in model.sample(v for v, d in found.items() if d["queue"] in spread):
        details = found[value]
        fragments = sorted({ran_in(r.op) or UNKNOWN for r in model.removals
                            if r.value == value and r.queue == details["queue"] and r.committed})
        out.append({**details, "fragments": fragments})
    return out


def _phantom(model: QueueModel, spread: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    attempted = model.enqueued("ok") | model.enqueued("info")
    phantom: dict[Hashable, dict[str, Any]] = {}
    for sighting in model.sightings:
        if sighting.queue in spread and sighting.value not in attempted and sighting.value not in phantom:
            phantom[sighting.value] = {"value": sighting.value, "queue": sighting.queue,
                                       "from_fragment": (sighting.item or {}).get("pt") or ran_in(sighting.op),
                                       "f": sighting.op.f, "invoke_index": sighting.op.invoke_index}
    return list(phantom.values())


def _last_put(model: QueueModel, spread: dict[str, tuple[str, ...]], value: Hashable) -> dict[str, Any] | None:
    last: dict[str, Any] | None = None
    for tx in model.enqueues:
        if tx.op.type != "fail" and any(value in values for queue, values in tx.writes if queue in spread):
            queue = next(q for q, values in tx.writes if value in values)
            last = {"queue": queue, "fragment": ran_in(tx.op) or UNKNOWN, "by": tx.op.f, "type": tx.op.type}
    for move in model.moves:
        if move.op.type != "fail" and move.target in spread and value in move.values:
            last = {"queue": move.target, "fragment": ran_in(move.op) or UNKNOWN, "by": "move", "type": move.op.type}
    return last


def _acknowledged(model: QueueModel, spread: dict[str, tuple[str, ...]]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {queue: Counter() for queue in sorted(spread)}
    for tx in model.enqueues:
        if tx.op.type == "ok":
            for queue, values in tx.writes:
                if queue in spread:
                    counts[queue][ran_in(tx.op) or UNKNOWN] += len(values)
    return {queue: dict(sorted(c.items())) for queue, c in counts.items()}


def _taken(model: QueueModel, spread: dict[str, tuple[str, ...]]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {queue: Counter() for queue in sorted(spread)}
    for removal in model.removals:
        if removal.committed and removal.queue in spread:
            counts[removal.queue][ran_in(removal.op) or UNKNOWN] += 1
    return {queue: dict(sorted(c.items())) for queue, c in counts.items()}


def _refused_full(model: QueueModel, spread: dict[str, tuple[str, ...]]) -> dict[str, dict[str, int]]:
    """The values of enqueues and moves into each spread queue refused queue_full, by the fragment
    the transaction ran in; a refusal that named another queue as the full one is not its."""
    counts: dict[str, Counter[str]] = {queue: Counter() for queue in sorted(spread)}

    def refused(op: PairedOp, queue: str) -> bool:
        full = op.value.get("full") if isinstance(op.value, dict) else None
        named = full.get("queue") if isinstance(full, dict) else None
        return op.type == "fail" and op.error == QUEUE_FULL and queue in spread and named in (None, queue)

    for tx in model.enqueues:
        for queue, values in tx.writes:
            if refused(tx.op, queue):
                counts[queue][ran_in(tx.op) or UNKNOWN] += len(values)
    for move in model.moves:
        if refused(move.op, move.target):
            counts[move.target][ran_in(move.op) or UNKNOWN] += len(move.values)
    return {queue: dict(sorted(c.items())) for queue, c in counts.items()}


# --------------------------------------------------------------- starvation
def check_starvation(model: QueueModel, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Each round of the starvation probe: the values committed into each fragment, those its lone
    consumer took within the bound, and the fragments it left values in (``starved``)."""
    rounds = [line.get("value") or {} for line in history
              if line.get("process") == CHECKER_INPUT_PROCESS and line.get("f") == "starvation"]
    if not rounds:
        return {"valid": True, "checked": False, "why": "no starvation probe ran"}
    judged = [_round(model, r) for r in rounds]
    starved = [{"mode": r["mode"], "fragments": r["starved"]} for r in judged if r["starved"]]
    return {"valid": not starved, "checked": any(r["checked"] for r in judged), "rounds": judged,
            "starved_fragments": starved}


def _round(model: QueueModel, summary: dict[str, Any]) -> dict[str, Any]:
    mode, queue = summary.get("mode"), summary.get("queue")
    bound_s = float(summary.get("bound_s") or 0.0)
    ends_s = float(summary.get("started_s") or 0.0) + bound_s
    of_round = [op for op in model.ops if (op.invoke.get("value") or {}).get("starvation") == mode]
    fills = {op.invoke_index for op in of_round if op.f == "enqueue"}
    filled: dict[Hashable, str] = {}
    for tx in model.enqueues:
        if tx.op.invoke_index in fills and tx.op.type == "ok":
            fragment = ran_in(tx.op) or str(tx.op.value.get("fragment") or UNKNOWN)
            filled.update({value: fragment for q, values in tx.writes if q == queue for value in values})
    takes = sorted((op for op in of_round if op.f == "dequeue"), key=lambda op: op.invoke_index)
    taken: list[Hashable] = [value for op in takes if op.type == "ok" and op.invoke_time_s <= ends_s
                             for value in op.value.get("values") or []]
    unanswered = sum(1 for op in takes if op.type == "info")
    left: Counter[str] = Counter(fragment for value, fragment in filled.items() if value not in set(taken))
    result: dict[str, Any] = {
        "mode": mode, "queue": queue, "checked": bool(filled), "bound_s": bound_s,
        "elapsed_s": summary.get("elapsed_s"), "takes": len(takes), "unanswered_takes": unanswered,
        "filled": dict(sorted(Counter(filled.values()).items())),
        "taken": dict(sorted(Counter(filled[v] for v in set(taken) if v in filled).items())),
        # which fragments the first takes reached, in order (a metric: fairness, not a rule)
        "first_fragments": [filled.get(v, UNKNOWN) for v in taken[:max(1, len(set(filled.values())))]],
        "starved": {}, "unknown": {},
    }
    if left:
        result["unknown" if unanswered else "starved"] = dict(sorted(left.items()))
    return result
