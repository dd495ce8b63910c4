"""The features checks of time: delays (no hand-out before the delay), time to live (no
hand-out past the expiry, no expiry a ttl could not give, no expiry too early), and their
statistics.

Pure Python: imports nothing from rcq, nothing of the workload.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from chaos.checkers.features.given import Deaths, Findings, Given, distribution, done_s, model_moved_into, where
from chaos.checkers.model import CLOCK_MARGIN_S, QueueModel, Sighting


def check_expiries(model: QueueModel, given: Given, findings: Findings) -> None:
    """Every sighting against its item's expiry (``wrong_expiry``, ``delivered_after_expiry``)."""
    wall_offset_ms = _wall_offset_ms(model)
    for sighting in model.sightings:
        _check_expiry(findings, sighting, wall_offset_ms, given.possible_ttls_ms(sighting.value, sighting.queue))


def _wall_offset_ms(model: QueueModel) -> float | None:
    """Wall ms at history time 0, as a lower bound: each acknowledged enqueue read the wall clock
    (``ack_ms``) before its completion line took its history time. None: no enqueue says."""
    offsets = [op.value["ack_ms"] - op.complete_time_s * 1000 for op in (tx.op for tx in model.enqueues)
               if op.type == "ok" and op.complete_time_s is not None and isinstance(op.value, dict)
               and isinstance(op.value.get("ack_ms"), int)]
    return max(offsets) if offsets else None


def _check_expiry(findings: Findings, sighting: Sighting, wall_offset_ms: float | None, ttls_ms: set[int]) -> None:
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
        findings.add("wrong_expiry", ttl_ms=expires_ms - at_ms, possible_ms=sorted(ttls_ms), **where(sighting))
    if wall_offset_ms is not None:
        late_s = (wall_offset_ms + sighting.op.invoke_time_s * 1000 - expires_ms) / 1000
        if late_s > CLOCK_MARGIN_S:
            findings.add("delivered_after_expiry", late_s=round(late_s, 3), **where(sighting))


def check_delays(model: QueueModel, given: Given, findings: Findings) -> dict[str, dict[Hashable, float]]:
    """No value written only with delays handed out of a workload queue before its enqueue was
    invoked + the shortest of them, by more than the clock margin (``delivered_early``). Returns
    each such value's bound and its earliest delivery seen (for the statistics)."""
    bounds: dict[Hashable, float] = {}
    for value, writes in given.writes.items():
        delays = [tx.op.invoke_time_s + float(options["delay_s"]) for tx, _, options in writes if "delay_s" in options]
        if delays and len(delays) == len(writes):
            bounds[value] = min(delays)
    earliest_done: dict[Hashable, float] = {}
    for sighting in model.sightings:
        bound = bounds.get(sighting.value)
        if sighting.queue in given.dead_letter_queues or bound is None:
            continue
        done = done_s(sighting, model)
        earliest_done[sighting.value] = min(earliest_done.get(sighting.value, done), done)
        if bound - done > CLOCK_MARGIN_S:
            findings.add("delivered_early", early_s=round(bound - done, 3), **where(sighting))
    return {"bounds": bounds, "earliest_done": earliest_done}


def check_ttl_death(model: QueueModel, given: Given, findings: Findings, sighting: Sighting, source: str) -> None:
    """A death for ``expired`` out of ``source``: a ttl the value had there, and not too early."""
    value = sighting.value
    default_ttl = model.settings.get(source, {}).get("default_ttl_s")
    ttls = [tx.op.invoke_time_s + float(ttl) for tx, queue, options in given.writes.get(value, ())
            if queue == source and isinstance(ttl := options.get("ttl_s", default_ttl), int | float)]
    if not ttls and isinstance(default_ttl, int | float) and source in model_moved_into(model, value):
        return  # moved (or redriven) into a queue with a default ttl: no enqueue time to hold it to
    if not ttls:
        findings.add("expired_without_ttl", **where(sighting))
    elif min(ttls) - done_s(sighting, model) > CLOCK_MARGIN_S:
        findings.add("expired_early", early_s=round(min(ttls) - done_s(sighting, model), 3), **where(sighting))


def ttl_stats(given: Given, deaths: Deaths, taken_out: set[Hashable], vanished: dict[Hashable, str]) -> dict[str, Any]:
    with_ttl = {value for value, writes in given.writes.items() for tx, _, options in writes
                if "ttl_s" in options and tx.op.type == "ok"}
    expired = {value for value, reason, _ in deaths.values() if reason == "expired"}
    return {"values_with_ttl": len(with_ttl), "expired_to_dead_letters": len(expired & with_ttl),
            "expired_by_rule": sum(1 for v, reason in vanished.items() if reason == "expired" and v in with_ttl),
            "vanished_from_dropping_queues": sum(1 for v, reason in vanished.items() if reason == "dropped" and v in with_ttl),
            "consumed": len(with_ttl & (taken_out - expired))}


def delay_stats(delays: dict[str, dict[Hashable, float]], known_in: set[Hashable]) -> dict[str, Any]:
    bounds, earliest_done = delays["bounds"], delays["earliest_done"]
    early = [bounds[v] - earliest_done[v] for v in earliest_done]
    return {"values_with_delay": len(set(bounds) & known_in), "seen": len(earliest_done),
            # > 0: seen that long before invoke + delay (within the margin); < 0: that long after
            "max_early_s": round(max(early), 3) if early else None,
            "first_seen_after_visible_s": distribution([-e for e in early])}
