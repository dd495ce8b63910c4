"""The queue-features checker: poison, dead letters, delays, time to live, priorities.

docs/queue-features.md, as a history can hold a cluster to it. The workload (chaos.generator, chaos.executor) gives
queues dead-letter queues, ``max_deliveries`` and ``max_priority`` (``configure`` ops); writes
priorities, delays, ttls and poison values (ending ``-poison``: consumers abort or reject them,
never commit them out of a workload queue); records each dequeued item's id, delivery count
(``dc``), enqueue time (``at``, the server's ms), priority (``p``) and dead-letter record (``dl``:
reason, source queue, delivery count); consumes and redrives the dead-letter queues; and, after
the drain, the queues' replicated counters (a ``queue-stats`` checker input).

Violations (each fails the run; counts and samples):

* **poison_consumed** — a poison value taken out of a workload queue by a commit (ok or unknown);
* **poison_not_dead** — a poison value known to be in the system never seen in a dead-letter
  queue, and not dropped by rule (``model.may_vanish``);
* **poison_bad_reason** — poison dead for another reason than ``max_deliveries`` or ``rejected``;
* **bad_dead_letter** — a dead-letter record outside a dead-letter queue, an item of a dead-letter
  queue without one, a source queue that does not send its dead there or where the value never
  was, an unknown reason;
* **dead_too_early** — reason ``max_deliveries`` with a delivery count under the source's limit
  (or a source without one);
* **expired_early** / **expired_without_ttl** — reason ``expired`` seen before the value's
  enqueue was invoked + its ttl (less the clock margin), or for a value written with no ttl;
* **rejected_without_reject** — reason ``rejected`` for a value no reject of that queue named;
* **delivered_early** — a delayed value handed out before its enqueue was invoked + its delay,
  by more than the clock margin (the op's completion is the latest the delivery can have been);
* **delivered_after_expiry** — an item handed out by an op invoked after the expiry the server
  gave it (``exp``, wall ms) + the clock margin: a leader never hands out an item past its
  expiry. The op's wall time is its history time + the history's wall offset, estimated from the
  acknowledged enqueues (``ack_ms`` against the completion's time: a lower bound, so the estimate
  never makes an op later than it was);
* **wrong_expiry** — an item whose expiry is none its enqueue time (``at``) + a ttl could give: a
  ttl one of its writes into that queue asked for, or the queue's ``default_ttl_s`` (moves,
  redrives and dead letters get the target's default);
* **over_delivered** — on a queue with ``max_deliveries``, an item handed out with a delivery
  count at the limit, or more times than the limit;
* **delivery_count_decreased** — on a queue with ``max_deliveries`` (counts replicated), one item
  (same id) handed out later with a lower count than before;
* **wrong_priority** — an item's priority is none its enqueues (or a move: 0) gave it;
* **consumed_and_dead** — a value committed out of a workload queue and out of a dead-letter
  queue, more often than it was enqueued;
* **seen_after_consumed** — a value handed out by an op invoked after a commit that took it out
  for good had been acknowledged (enqueued once only);
* **counter_mismatch** — more distinct deaths seen (by source and reason), values vanished by
  rule, or items redriven, than the replicated counters say happened.

Statistics, never verdicts: dead by reason, expired, delayed items and the largest early margin,
priorities (latency by priority, in-batch priority inversions), delivery counts on queues that
count in the leader's memory (they may fall after a leader change).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable
from typing import Any

from chaos.checkers.model import (
    CLOCK_MARGIN_S,
    SAMPLE_SIZE_MAX,
    EnqueueTx,
    QueueModel,
    Sighting,
    build_model,
)
from chaos.history import CHECKER_INPUT_PROCESS

POISON_SUFFIX = "-poison"  # chaos.generator's marker (checkers import nothing of the workload)
DEAD_REASONS = ("max_deliveries", "expired", "rejected")
POISON_DEAD_REASONS = ("max_deliveries", "rejected")
VIOLATIONS = ("poison_consumed", "poison_not_dead", "poison_bad_reason", "bad_dead_letter", "dead_too_early",
              "expired_early", "expired_without_ttl", "rejected_without_reject", "delivered_early",
              "delivered_after_expiry", "wrong_expiry", "over_delivered", "delivery_count_decreased", "wrong_priority",
              "consumed_and_dead", "seen_after_consumed", "counter_mismatch")


def is_poison(value: Hashable) -> bool:
    return isinstance(value, str) and value.endswith(POISON_SUFFIX)


class _Findings:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.samples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, kind: str, **details: Any) -> None:
        self.counts[kind] += 1
        if len(self.samples[kind]) < SAMPLE_SIZE_MAX:
            self.samples[kind].append(details)


def _where(sighting: Sighting) -> dict[str, Any]:
    op = sighting.op
    return {"value": sighting.value, "queue": sighting.queue, "f": op.f, "type": op.type, "process": op.process,
            "invoke_index": op.invoke_index, "item": sighting.item}


def _done_s(sighting: Sighting, model: QueueModel) -> float:
    """The latest the sighting's delivery can have happened: its op's completion (or the end)."""
    done = sighting.op.complete_time_s
    return model.end_time_s if done is None else done


def _distribution(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)
    return {"count": len(ordered), "min": round(ordered[0], 3), "median": round(statistics.median(ordered), 3),
            "p90": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 3), "max": round(ordered[-1], 3)}


def _queue_stats(history: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    if not history:
        return None
    recorded = [op.get("value") for op in history
                if op.get("process") == CHECKER_INPUT_PROCESS and op.get("f") == "queue-stats"]
    return recorded[-1] if recorded and isinstance(recorded[-1], dict) else None


def check_features(history: Any, raw_history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``history``: a QueueModel (or what build_model takes); ``raw_history``: the history's lines,
    for the ``queue-stats`` checker input (without it the counters are not compared)."""
    if isinstance(history, QueueModel):
        model = history
    else:
        raw_history = list(history) if raw_history is None else raw_history
        model = build_model(raw_history)
    findings = _Findings()
    settings = model.settings
    dlqs = model.dead_letter_queues

    def max_deliveries_of(queue: str) -> int | None:
        value = settings.get(queue, {}).get("max_deliveries")
        return value if isinstance(value, int) else None

    # What each value was given: its writes (enqueue, queue, options) and the queues moves took it to.
    writes: dict[Hashable, list[tuple[EnqueueTx, str, dict[str, Any]]]] = defaultdict(list)
    for tx in model.enqueues:
        if tx.op.type == "fail":
            continue
        for position, (queue, values) in enumerate(tx.writes):
            for value in values:
                writes[value].append((tx, queue, tx.options_of(position)))
    moved_into: dict[Hashable, set[str]] = defaultdict(set)
    for move in model.moves:
        if move.op.type != "fail":
            for value in move.values:
                moved_into[value].add(move.target)
    rejects = {(s.value, s.queue) for s in model.sightings
               if s.rejected and s.op.value.get("reject_outcome") != "fail"}

    def possible_queues(value: Hashable) -> set[str]:
        return {queue for _, queue, _ in writes.get(value, ())} | moved_into.get(value, set())

    def possible_priorities(value: Hashable, queue: str) -> set[int]:
        ceiling = settings.get(queue, {}).get("max_priority") or 0
        allowed = {min(int(options.get("priority", 0)), ceiling) for _, q, options in writes.get(value, ()) if q == queue}
        if queue in moved_into.get(value, set()):
            allowed.add(0)
        return allowed

    def possible_ttls_ms(value: Hashable, queue: str) -> set[int]:
        """The ttls an item of ``value`` in ``queue`` may carry: its writes' into that queue, the queue's default."""
        ttls = {ttl_ms(options["ttl_s"]) for _, q, options in writes.get(value, ()) if q == queue and "ttl_s" in options}
        default = settings.get(queue, {}).get("default_ttl_s")
        if isinstance(default, int | float):
            ttls.add(ttl_ms(default))
        return ttls

    deaths: dict[tuple[str, Hashable], tuple[Hashable, str, str]] = {}  # (dlq, item id) -> value, reason, source
    delay_bounds: dict[Hashable, float] = {}
    for value, given in writes.items():
        delays = [tx.op.invoke_time_s + float(options["delay_s"]) for tx, _, options in given if "delay_s" in options]
        if delays and len(delays) == len(given):
            delay_bounds[value] = min(delays)
    earliest_done: dict[Hashable, float] = {}
    by_item: dict[tuple[str, Hashable], list[Sighting]] = defaultdict(list)
    memory_counts: dict[tuple[str, Hashable], list[Sighting]] = defaultdict(list)
    batches: dict[int, list[int]] = defaultdict(list)

    wall_offset_ms = _wall_offset_ms(model)
    for sighting in model.sightings:
        value, queue, item = sighting.value, sighting.queue, sighting.item
        dead = sighting.dead_letter
        _check_expiry(findings, sighting, wall_offset_ms, possible_ttls_ms(value, queue))
        if queue in dlqs:
            if item is not None and dead is None:
                findings.add("bad_dead_letter", why="no dead-letter record in a dead-letter queue", **_where(sighting))
            if dead is not None:
                _check_death(model, findings, sighting, dead, writes, rejects, possible_queues, max_deliveries_of)
                # one death per dead-letter item (a value redriven and dead again is a second one)
                item_id = item.get("id") if item is not None else None
                death = (queue, item_id) if item_id is not None else (queue, (value, dead[0], dead[1]))
                deaths[death] = (value, dead[0], dead[1])
                allowed = possible_priorities(value, dead[1])
                if allowed and item is not None and int(item.get("p", 0)) not in allowed:
                    findings.add("wrong_priority", allowed=sorted(allowed), **_where(sighting))
            continue
        if dead is not None:
            findings.add("bad_dead_letter", why="a dead-letter record outside a dead-letter queue", **_where(sighting))
        bound = delay_bounds.get(value)
        if bound is not None:
            done = _done_s(sighting, model)
            earliest_done[value] = min(earliest_done.get(value, done), done)
            if bound - done > CLOCK_MARGIN_S:
                findings.add("delivered_early", early_s=round(bound - done, 3), **_where(sighting))
        if item is None:
            continue
        allowed = possible_priorities(value, queue)
        if allowed and int(item.get("p", 0)) not in allowed:
            findings.add("wrong_priority", allowed=sorted(allowed), **_where(sighting))
        if not sighting.rejected and settings.get(queue, {}).get("max_priority"):
            batches[sighting.op.invoke_index].append(int(item.get("p", 0)))
        limit = max_deliveries_of(queue)
        if limit is not None and isinstance(item.get("dc"), int):
            if item["dc"] >= limit:
                findings.add("over_delivered", why=f"delivered with count {item['dc']}, limit {limit}",
                             **_where(sighting))
            by_item[(queue, item.get("id"))].append(sighting)
        elif isinstance(item.get("dc"), int):
            memory_counts[(queue, item.get("id"))].append(sighting)

    replicated_counts = _check_delivery_order(findings, by_item, max_deliveries_of)
    memory_stats = _delivery_order_stats(memory_counts)

    # Poison: never committed out of a workload queue; dead in the end (or dropped by rule).
    for removal in model.removals:
        if is_poison(removal.value) and removal.committed is not False and removal.queue not in dlqs:
            findings.add("poison_consumed", value=removal.value, queue=removal.queue, f=removal.op.f,
                         type=removal.op.type, invoke_index=removal.op.invoke_index)
    seen = model.seen_values()
    known_in = model.enqueued("ok") | (model.enqueued("info") & seen)
    poison_known = {value for value in known_in if is_poison(value)}
    poison_dead_reasons: Counter[str] = Counter()
    poison_dead: set[Hashable] = set()
    for value, reason, _ in deaths.values():
        if is_poison(value):
            poison_dead.add(value)
            poison_dead_reasons[reason] += 1
    for value in model.sample(poison_known - poison_dead - set(model.may_vanish)):
        findings.add("poison_not_dead", value=value, sightings=[_where(s) for s in model.sightings_by_value.get(value, ())][:5])
    findings.counts["poison_not_dead"] = len(poison_known - poison_dead - set(model.may_vanish))

    exits = _check_exits(model, findings, writes, dlqs)
    maybe_out = {r.value for r in model.removals if r.committed is None and r.op.f in ("dequeue", "drain")}
    vanished = {v: model.may_vanish[v] for v in known_in - exits["taken_out"] - maybe_out if v in model.may_vanish}
    counters = _check_counters(model, findings, _queue_stats(raw_history), deaths, vanished)

    violations = {kind: findings.counts[kind] for kind in VIOLATIONS}
    return {
        "valid": not any(violations.values()),
        "checked": bool(settings),
        "queues": settings,
        "violations": violations,
        "samples": {kind: findings.samples[kind] for kind in VIOLATIONS if findings.samples.get(kind)},
        "dead": _dead_stats(deaths, poison_known, poison_dead, poison_dead_reasons, vanished),
        "expired": _ttl_stats(writes, deaths, exits, vanished),
        "delayed": _delay_stats(delay_bounds, earliest_done, known_in),
        "priorities": _priority_stats(model, writes, batches),
        "delivery_counts": {"replicated": replicated_counts, "in_leader_memory": memory_stats},
        "rejects": _reject_stats(model),
        "redrives": _redrive_stats(model),
        "counters": counters,
    }


def _check_death(model: QueueModel, findings: _Findings, sighting: Sighting, dead: tuple[str, str, int],
                 writes: dict[Hashable, list[tuple[EnqueueTx, str, dict[str, Any]]]],
                 rejects: set[tuple[Hashable, str]], possible_queues: Any, max_deliveries_of: Any) -> None:
    reason, source, count = dead
    value = sighting.value
    if model.dead_letter_queue_of(source) != sighting.queue:
        findings.add("bad_dead_letter", why=f"source {source!r} does not send its dead to {sighting.queue!r}",
                     **_where(sighting))
    elif source not in possible_queues(value):
        findings.add("bad_dead_letter", why=f"the value was never in its source {source!r}", **_where(sighting))
    if reason not in DEAD_REASONS:
        findings.add("bad_dead_letter", why=f"unknown reason {reason!r}", **_where(sighting))
    if is_poison(value) and reason not in POISON_DEAD_REASONS:
        findings.add("poison_bad_reason", **_where(sighting))
    if reason == "max_deliveries":
        limit = max_deliveries_of(source)
        if limit is None or count < limit:
            findings.add("dead_too_early", limit=limit, **_where(sighting))
    elif reason == "expired":
        default_ttl = model.settings.get(source, {}).get("default_ttl_s")
        ttls = [tx.op.invoke_time_s + float(ttl) for tx, queue, options in writes.get(value, ())
                if queue == source and isinstance(ttl := options.get("ttl_s", default_ttl), int | float)]
        if not ttls and isinstance(default_ttl, int | float) and source in model_moved_into(model, value):
            return  # moved (or redriven) into a queue with a default ttl: no enqueue time to hold it to
        if not ttls:
            findings.add("expired_without_ttl", **_where(sighting))
        elif min(ttls) - _done_s(sighting, model) > CLOCK_MARGIN_S:
            findings.add("expired_early", early_s=round(min(ttls) - _done_s(sighting, model), 3), **_where(sighting))
    elif reason == "rejected" and (value, source) not in rejects:
        findings.add("rejected_without_reject", **_where(sighting))


def model_moved_into(model: QueueModel, value: Hashable) -> set[str]:
    return {move.target for move in model.moves if move.op.type != "fail" and value in move.values}


def ttl_ms(ttl_s: Any) -> int:
    """A ttl in ms as the server rounds it."""
    return max(1, round(float(ttl_s) * 1000))


def _wall_offset_ms(model: QueueModel) -> float | None:
    """Wall ms at history time 0, as a lower bound: each acknowledged enqueue read the wall clock
    (``ack_ms``) before its completion line took its history time. None: no enqueue says."""
    offsets = [op.value["ack_ms"] - op.complete_time_s * 1000 for op in (tx.op for tx in model.enqueues)
               if op.type == "ok" and op.complete_time_s is not None and isinstance(op.value, dict)
               and isinstance(op.value.get("ack_ms"), int)]
    return max(offsets) if offsets else None


def _check_expiry(findings: _Findings, sighting: Sighting, wall_offset_ms: float | None, ttls_ms: set[int]) -> None:
    """No hand-out past the item's expiry (``exp``, which the server reports with the item), and no
    expiry but one a ttl of the value in that queue gives. An item without ``exp`` (a server that
    does not report it) is not judged."""
    item = sighting.item
    if item is None or "exp" not in item:
        return
    expires_ms, at_ms = item["exp"], item.get("at")
    if not isinstance(expires_ms, int):
        return
    if isinstance(at_ms, int) and expires_ms - at_ms not in ttls_ms:
        findings.add("wrong_expiry", ttl_ms=expires_ms - at_ms, possible_ms=sorted(ttls_ms), **_where(sighting))
    if wall_offset_ms is not None:
        late_s = (wall_offset_ms + sighting.op.invoke_time_s * 1000 - expires_ms) / 1000
        if late_s > CLOCK_MARGIN_S:
            findings.add("delivered_after_expiry", late_s=round(late_s, 3), **_where(sighting))


def _check_delivery_order(findings: _Findings, by_item: dict[tuple[str, Hashable], list[Sighting]],
                          max_deliveries_of: Any) -> dict[str, Any]:
    """Deliveries of one item (same id) on a queue with max_deliveries, in real-time order (one op
    completed before the other began): the count never falls; an equal count is a statistic."""
    deliveries = repeats = 0
    highest = 0
    for (queue, item_id), sightings in by_item.items():
        deliveries += len(sightings)
        limit = max_deliveries_of(queue)
        ops = {s.op.invoke_index for s in sightings}
        if item_id is not None and limit is not None and len(ops) > limit:
            findings.add("over_delivered", why=f"item {item_id} handed out {len(ops)} times, limit {limit}",
                         **_where(sightings[-1]))
        ordered = sorted(sightings, key=lambda s: s.op.invoke_index)
        for s in ordered:
            highest = max(highest, int(s.item["dc"]))  # type: ignore[index]
        if item_id is None:
            continue
        for i, earlier in enumerate(ordered):
            for later in ordered[i + 1:]:
                if earlier.op.complete_index is None or earlier.op.complete_index > later.op.invoke_index:
                    continue  # overlapping ops: no order known
                before, after = int(earlier.item["dc"]), int(later.item["dc"])  # type: ignore[index]
                if after < before:
                    findings.add("delivery_count_decreased", before=before, after=after, earlier=_where(earlier),
                                 **_where(later))
                elif after == before:
                    repeats += 1
    return {"items": len(by_item), "deliveries": deliveries, "max_delivery_count": highest,
            "repeated_counts": repeats}


def _delivery_order_stats(by_item: dict[tuple[str, Hashable], list[Sighting]]) -> dict[str, Any]:
    decreases = highest = 0
    for sightings in by_item.values():
        ordered = sorted(sightings, key=lambda s: s.op.invoke_index)
        for earlier, later in itertools.pairwise(ordered):
            if int(later.item["dc"]) < int(earlier.item["dc"]):  # type: ignore[index]
                decreases += 1
        highest = max([highest, *(int(s.item["dc"]) for s in sightings)])  # type: ignore[index]
    return {"items": len(by_item), "deliveries": sum(len(s) for s in by_item.values()),
            "max_delivery_count": highest, "decreases": decreases}


def _check_exits(model: QueueModel, findings: _Findings,
                 writes: dict[Hashable, list[tuple[EnqueueTx, str, dict[str, Any]]]], dlqs: set[str]) -> dict[str, Any]:
    """Commits that took a value out for good (ok dequeue or drain), from workload queues and from
    dead-letter queues: together never more than the value's enqueues, and nothing handed out after."""
    by_value: dict[Hashable, list[Any]] = defaultdict(list)
    for removal in model.removals:
        if removal.committed and removal.op.f in ("dequeue", "drain"):
            by_value[removal.value].append(removal)
    consumed = dead_consumed = 0
    for value, removals in by_value.items():
        from_dlq = [r for r in removals if r.queue in dlqs]
        consumed += len(removals) - len(from_dlq)
        dead_consumed += len(from_dlq)
        capacity = max(len(writes.get(value, ())), 1)
        if from_dlq and len(from_dlq) < len(removals) and len(removals) > capacity:
            findings.add("consumed_and_dead", value=value,
                         by=[{"queue": r.queue, "f": r.op.f, "invoke_index": r.op.invoke_index} for r in removals])
        if capacity > 1:
            continue
        first = min((r.op.complete_index for r in removals if r.op.complete_index is not None), default=None)
        if first is None:
            continue
        for sighting in model.sightings_by_value.get(value, ()):
            if sighting.op.invoke_index > first:
                findings.add("seen_after_consumed", consumed_at_index=first, **_where(sighting))
    return {"consumed_values": consumed, "dead_consumed_values": dead_consumed,
            "taken_out": set(by_value)}


def _check_counters(model: QueueModel, findings: _Findings, stats: dict[str, dict[str, Any]] | None,
                    deaths: dict[tuple[str, Hashable], tuple[Hashable, str, str]],
                    vanished: dict[Hashable, str]) -> dict[str, Any]:
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


def _dead_stats(deaths: dict[tuple[str, Hashable], tuple[Hashable, str, str]], poison_known: set[Hashable],
                poison_dead: set[Hashable], poison_reasons: Counter[str], vanished: dict[Hashable, str]
                ) -> dict[str, Any]:
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


def _ttl_stats(writes: dict[Hashable, list[tuple[EnqueueTx, str, dict[str, Any]]]],
               deaths: dict[tuple[str, Hashable], tuple[Hashable, str, str]], exits: dict[str, Any],
               vanished: dict[Hashable, str]) -> dict[str, Any]:
    with_ttl = {value for value, given in writes.items() for tx, _, options in given
                if "ttl_s" in options and tx.op.type == "ok"}
    expired = {value for value, reason, _ in deaths.values() if reason == "expired"}
    return {"values_with_ttl": len(with_ttl), "expired_to_dead_letters": len(expired & with_ttl),
            "expired_by_rule": sum(1 for v, reason in vanished.items() if reason == "expired" and v in with_ttl),
            "vanished_from_dropping_queues": sum(1 for v, reason in vanished.items() if reason == "dropped" and v in with_ttl),
            "consumed": len(with_ttl & (exits["taken_out"] - expired))}


def _delay_stats(bounds: dict[Hashable, float], earliest_done: dict[Hashable, float],
                 known_in: set[Hashable]) -> dict[str, Any]:
    early = [bounds[v] - earliest_done[v] for v in earliest_done]
    return {"values_with_delay": len(set(bounds) & known_in), "seen": len(earliest_done),
            # > 0: seen that long before invoke + delay (within the margin); < 0: that long after
            "max_early_s": round(max(early), 3) if early else None,
            "first_seen_after_visible_s": _distribution([-e for e in early])}


def _priority_stats(model: QueueModel, writes: dict[Hashable, list[tuple[EnqueueTx, str, dict[str, Any]]]],
                    batches: dict[int, list[int]]) -> dict[str, Any]:
    first_out: dict[tuple[Hashable, str], float] = {}
    for removal in model.removals:
        if removal.committed and removal.op.complete_time_s is not None:
            key = (removal.value, removal.queue)
            first_out[key] = min(first_out.get(key, removal.op.complete_time_s), removal.op.complete_time_s)
    by_priority: dict[int, dict[str, Any]] = {}
    latencies: dict[int, list[float]] = defaultdict(list)
    for value, given in writes.items():
        for tx, queue, options in given:
            if tx.op.type != "ok" or not model.settings.get(queue, {}).get("max_priority"):
                continue
            priority = int(options.get("priority", 0))
            entry = by_priority.setdefault(priority, {"values": 0, "consumed": 0})
            entry["values"] += 1
            out = first_out.get((value, queue))
            if out is not None:
                entry["consumed"] += 1
                if "delay_s" not in options and tx.op.complete_time_s is not None:
                    latencies[priority].append(out - tx.op.complete_time_s)
    for priority, entry in by_priority.items():
        entry["time_to_consume_s"] = _distribution(latencies[priority])
    inversions = sum(1 for ps in batches.values() for a, b in itertools.pairwise(ps) if b > a)
    return {"by_priority": {str(p): by_priority[p] for p in sorted(by_priority)},
            "batches": sum(1 for ps in batches.values() if len(ps) > 1),
            "in_batch_inversions": inversions}


def _reject_stats(model: QueueModel) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    values = 0
    for op in model.ops:
        if isinstance(op.value, dict) and op.value.get("rejected"):
            outcomes[str(op.value.get("reject_outcome"))] += 1
            values += len(op.value["rejected"])
    aborted = sum(1 for op in model.ops if isinstance(op.value, dict) and op.value.get("poison"))
    return {"reject_ops": dict(outcomes), "values_rejected": values, "poison_aborts": aborted}


def _redrive_stats(model: QueueModel) -> dict[str, Any]:
    ops = [op for op in model.ops if op.f == "redrive"]
    return {"ops": dict(Counter(op.type for op in ops)),
            "redriven_acknowledged": sum(int(op.value.get("redriven") or 0) for op in ops
                                         if op.type == "ok" and isinstance(op.value, dict))}


def summary_line(r: dict[str, Any]) -> str:
    """One line (and offenders) for the run's summary."""
    if not r.get("checked"):
        return "not checked (no queue with features configured in this history)"
    dead, expired, delayed, prio = r["dead"], r["expired"], r["delayed"], r["priorities"]
    poison = dead["poison"]
    counters = r["counters"]
    line = (
        f"dead {dead['deaths']} ({', '.join(f'{k} {v}' for k, v in dead['by_reason'].items()) or 'none'}), "
        f"dropped by rule {dead['dropped_by_rule']}; poison {poison['dead']}/{poison['known']} dead "
        f"({', '.join(f'{k} {v}' for k, v in poison['deaths_by_reason'].items()) or 'none'}), "
        f"{poison['dropped_by_rule']} dropped; "
        f"ttl {expired['values_with_ttl']}: expired {expired['expired_to_dead_letters']} to dead letters, "
        f"{expired['expired_by_rule']} by rule, {expired['consumed']} consumed; "
        f"delayed {delayed['values_with_delay']} (max early {delayed['max_early_s']}s); "
        f"priorities " + ", ".join(f"p{p}: {e['values']}" for p, e in prio["by_priority"].items())
        + f" ({prio['in_batch_inversions']} in-batch inversions); "
        f"redriven {r['redrives']['redriven_acknowledged']}, rejected {r['rejects']['values_rejected']}; "
        f"max delivery count {r['delivery_counts']['replicated']['max_delivery_count']}; "
        f"counters {'checked' if counters.get('checked') else 'not checked'}"
    )
    for kind, count in r["violations"].items():
        if count:
            shown = [s.get("value", s) for s in r["samples"].get(kind, [])[:5]]
            line += f"\n      {kind}: {count} e.g. {', '.join(str(v) for v in shown)}"
    return line
