"""The features checks of dead letters: each dead-letter record where it belongs and for a reason
the rules give, poison never consumed and dead in the end, the replicated counters at least what
the history saw, and their statistics (deaths, rejects, redrives).

Pure Python: imports nothing from rcq, nothing of the workload.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from chaos.checkers.features.given import Deaths, Findings, Given, is_poison, item_key, where
from chaos.checkers.features.timing import check_ttl_death
from chaos.checkers.model import QueueModel, Sighting

DEAD_REASONS = ("max_deliveries", "expired", "rejected")
POISON_DEAD_REASONS = ("max_deliveries", "rejected")


def check_dead_letters(model: QueueModel, given: Given, findings: Findings) -> Deaths:
    """Every dead-letter record seen (``bad_dead_letter``, ``poison_bad_reason``, ``dead_too_early``,
    ``expired_*``, ``rejected_without_reject``); returns the deaths seen, one per dead-letter item
    (a value redriven and dead again is a second one)."""
    deaths: Deaths = {}
    for sighting in model.sightings:
        value, queue, item, dead = sighting.value, sighting.queue, sighting.item, sighting.dead_letter
        if queue not in given.dead_letter_queues:
            if dead is not None:
                findings.add("bad_dead_letter", why="a dead-letter record outside a dead-letter queue", **where(sighting))
            continue
        if item is not None and dead is None:
            findings.add("bad_dead_letter", why="no dead-letter record in a dead-letter queue", **where(sighting))
        if dead is not None:
            _check_death(model, given, findings, sighting, dead)
            item_id = item_key(item) if item is not None else None
            death = (queue, item_id) if item_id is not None else (queue, (value, dead[0], dead[1]))
            deaths[death] = (value, dead[0], dead[1])
    return deaths


def _check_death(model: QueueModel, given: Given, findings: Findings, sighting: Sighting,
                 dead: tuple[str, str, int]) -> None:
    reason, source, count = dead
    value = sighting.value
    if model.dead_letter_queue_of(source) != sighting.queue:
        findings.add("bad_dead_letter", why=f"source {source!r} does not send its dead to {sighting.queue!r}",
                     **where(sighting))
    elif source not in given.possible_queues(value):
        findings.add("bad_dead_letter", why=f"the value was never in its source {source!r}", **where(sighting))
    if reason not in DEAD_REASONS:
        findings.add("bad_dead_letter", why=f"unknown reason {reason!r}", **where(sighting))
    if is_poison(value) and reason not in POISON_DEAD_REASONS:
        findings.add("poison_bad_reason", **where(sighting))
    if reason == "max_deliveries":
        limit = given.max_deliveries_of(source)
        if limit is None or count < limit:
            findings.add("dead_too_early", limit=limit, **where(sighting))
    elif reason == "expired":
        check_ttl_death(model, given, findings, sighting, source)
    elif reason == "rejected" and (value, source) not in given.rejects:
        findings.add("rejected_without_reject", **where(sighting))


def check_poison(model: QueueModel, given: Given, findings: Findings, deaths: Deaths,
                 known_in: set[Hashable]) -> dict[str, Any]:
    """Poison never committed out of a workload queue (``poison_consumed``); every poison value
    known to be in the system dead in the end, or dropped by rule (``poison_not_dead``). Returns
    the poison known, the poison dead and its deaths by reason."""
    for removal in model.removals:
        if is_poison(removal.value) and removal.committed is not False and removal.queue not in given.dead_letter_queues:
            findings.add("poison_consumed", value=removal.value, queue=removal.queue, f=removal.op.f,
                         type=removal.op.type, invoke_index=removal.op.invoke_index)
    known = {value for value in known_in if is_poison(value)}
    reasons: Counter[str] = Counter()
    dead: set[Hashable] = set()
    for value, reason, _ in deaths.values():
        if is_poison(value):
            dead.add(value)
            reasons[reason] += 1
    for value in model.sample(known - dead - set(model.may_vanish)):
        findings.add("poison_not_dead", value=value,
                     sightings=[where(s) for s in model.sightings_by_value.get(value, ())][:5])
    findings.counts["poison_not_dead"] = len(known - dead - set(model.may_vanish))
    return {"known": known, "dead": dead, "reasons": reasons}


def check_counters(model: QueueModel, findings: Findings, stats: dict[str, dict[str, Any]] | None, deaths: Deaths,
                   vanished: dict[Hashable, str]) -> dict[str, Any]:
    """The replicated counters (``queue-stats``) at least what the history saw: deaths by source and
    reason, values vanished by rule, items redriven (``counter_mismatch``)."""
    if stats is None:
        return {"checked": False}
    if any(not isinstance(v, dict) or "error" in v for v in stats.values()):
        return {"checked": False, "errors": {q: v.get("error") for q, v in stats.items() if isinstance(v, dict)}}

    def total(queue: str, name: str) -> int:
        return int(stats.get(queue, {}).get(name) or 0)

    seen: Counter[tuple[str, str]] = Counter((source, reason) for _, reason, source in deaths.values())
    by_source: Counter[str] = Counter(source for _, _, source in deaths.values())
    counter_of = {"max_deliveries": "max_deliveries_total", "expired": "expired_total", "rejected": "rejected_total"}
    for (source, reason), count in seen.items():
        name = counter_of.get(reason)
        if name is not None and source in stats and count > total(source, name):
            findings.add("counter_mismatch", queue=source, counter=name, seen=count, total=total(source, name))
    for source, count in by_source.items():
        if source in stats and count > total(source, "dead_lettered_total"):
            findings.add("counter_mismatch", queue=source, counter="dead_lettered_total", seen=count,
                         total=total(source, "dead_lettered_total"))
    dropping = [q for q in model.settings if model.dead_letter_queue_of(q) is None and q not in model.dead_letter_queues]
    dropped_total = sum(total(q, "dropped_total") for q in dropping if q in stats)
    if len(vanished) > dropped_total:
        findings.add("counter_mismatch", queue=",".join(dropping), counter="dropped_total", seen=len(vanished),
                     total=dropped_total)
    redriven_ok = sum(int(op.value.get("redriven") or 0) for op in model.ops
                      if op.f == "redrive" and op.type == "ok" and isinstance(op.value, dict))
    redriven_total = sum(total(q, "redriven_total") for q in model.dead_letter_queues)
    if redriven_ok > redriven_total:
        findings.add("counter_mismatch", queue=",".join(sorted(model.dead_letter_queues)), counter="redriven_total",
                     seen=redriven_ok, total=redriven_total)
    return {"checked": True, "vanished_by_rule": len(vanished), "dropped_total": dropped_total,
            "redriven_acknowledged": redriven_ok, "redriven_total": redriven_total,
            "totals": {q: {k: v for k, v in s.items() if v} for q, s in sorted(stats.items())}}


def dead_stats(deaths: Deaths, poison: dict[str, Any], vanished: dict[Hashable, str]) -> dict[str, Any]:
    poison_known, poison_dead, poison_reasons = poison["known"], poison["dead"], poison["reasons"]
    by_reason = Counter(reason for _, reason, _ in deaths.values())
    by_source = Counter(source for _, _, source in deaths.values())
    values = {value for value, _, _ in deaths.values()}
    return {"deaths": len(deaths), "values": len(values), "by_reason": dict(sorted(by_reason.items())),
            "by_source": dict(sorted(by_source.items())),
            "dropped_by_rule": sum(1 for reason in vanished.values() if reason == "dropped"),
            "poison": {"known": len(poison_known), "dead": len(poison_dead & poison_known),
                       "dropped_by_rule": sum(1 for v in vanished if is_poison(v)),
                       "died_more_than_once": sum(1 for v in poison_dead
                                                  if sum(1 for d in deaths.values() if d[0] == v) > 1),
                       "deaths_by_reason": dict(sorted(poison_reasons.items()))}}


def reject_stats(model: QueueModel) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    values = 0
    for op in model.ops:
        if isinstance(op.value, dict) and op.value.get("rejected"):
            outcomes[str(op.value.get("reject_outcome"))] += 1
            values += len(op.value["rejected"])
    aborted = sum(1 for op in model.ops if isinstance(op.value, dict) and op.value.get("poison"))
    return {"reject_ops": dict(outcomes), "values_rejected": values, "poison_aborts": aborted}


def redrive_stats(model: QueueModel) -> dict[str, Any]:
    ops = [op for op in model.ops if op.f == "redrive"]
    return {"ops": dict(Counter(op.type for op in ops)),
            "redriven_acknowledged": sum(int(op.value.get("redriven") or 0) for op in ops
                                         if op.type == "ok" and isinstance(op.value, dict))}
