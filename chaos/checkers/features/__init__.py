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

Each violation is found by one check of its feature: ``dead_letters`` (records, poison, the
counters), ``timing`` (delays, expiries), ``deliveries`` (priorities, delivery counts, values
taken out for good), over what ``given`` reads once from the model: each value's writes, moves
and rejects.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from typing import Any

from chaos.checkers.features.dead_letters import (
    check_counters,
    check_dead_letters,
    check_poison,
    dead_stats,
    redrive_stats,
    reject_stats,
)
from chaos.checkers.features.deliveries import check_delivery_counts, check_exits, check_priorities, priority_stats
from chaos.checkers.features.given import Findings, Given, queue_stats
from chaos.checkers.features.timing import check_delays, check_expiries, delay_stats, ttl_stats
from chaos.checkers.model import QueueModel, build_model

VIOLATIONS = ("poison_consumed", "poison_not_dead", "poison_bad_reason", "bad_dead_letter", "dead_too_early",
              "expired_early", "expired_without_ttl", "rejected_without_reject", "delivered_early",
              "delivered_after_expiry", "wrong_expiry", "over_delivered", "delivery_count_decreased", "wrong_priority",
              "consumed_and_dead", "seen_after_consumed", "counter_mismatch")


def check_features(history: Any, raw_history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``history``: a QueueModel (or what build_model takes); ``raw_history``: the history's lines,
    for the ``queue-stats`` checker input (without it the counters are not compared)."""
    if isinstance(history, QueueModel):
        model = history
    else:
        raw_history = list(history) if raw_history is None else raw_history
        model = build_model(raw_history)
    findings = Findings()
    given = Given(model)
    check_expiries(model, given, findings)
    deaths = check_dead_letters(model, given, findings)
    delays = check_delays(model, given, findings)
    batches = check_priorities(model, given, findings)
    delivery_counts = check_delivery_counts(model, given, findings)
    known_in = model.enqueued("ok") | (model.enqueued("info") & model.seen_values())
    poison = check_poison(model, given, findings, deaths, known_in)
    exits = check_exits(model, given, findings)
    maybe_out = {r.value for r in model.removals if r.committed is None and r.op.f in ("dequeue", "drain")}
    vanished = {v: model.may_vanish[v] for v in known_in - exits["taken_out"] - maybe_out if v in model.may_vanish}
    counters = check_counters(model, findings, queue_stats(raw_history), deaths, vanished)

    violations = {kind: findings.counts[kind] for kind in VIOLATIONS}
    return {
        "valid": not any(violations.values()),
        "checked": bool(model.settings),
        "queues": model.settings,
        "violations": violations,
        "samples": {kind: findings.samples[kind] for kind in VIOLATIONS if findings.samples.get(kind)},
        "dead": dead_stats(deaths, poison, vanished),
        "expired": ttl_stats(given, deaths, exits["taken_out"], vanished),
        "delayed": delay_stats(delays, known_in),
        "priorities": priority_stats(model, given, batches),
        "delivery_counts": delivery_counts,
        "rejects": reject_stats(model),
        "redrives": redrive_stats(model),
        "counters": counters,
    }


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
