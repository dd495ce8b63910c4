"""The headers checker: every item comes back with exactly the headers it was enqueued with.

The workload (chaos.generator) marks the values it enqueues with headers (ending ``-h``) and gives
each such item the headers derived from its value, ``{"rcq-chaos": value}``; a mover re-enqueues
an item with the headers it came with, and dead letters and redrives keep them
(docs/queue-features.md). Consumers record each item's headers (``h`` in an op's ``items``, only
when it has some). So whoever sees an item can tell what it must carry, wherever it is seen: a
workload queue, a dead-letter queue, a drain, after any fault.

Violations (each fails the run; counts and samples):

* **headers_missing** — a marked value handed out without headers;
* **headers_wrong** — a marked value handed out with other headers than its own;
* **headers_unexpected** — a value not marked handed out with headers;
* **refused_without_headers** — an enqueue or a move refused with ``feature_level_required``
  although it carried no marked value: only headers need feature level 2 (a cluster held at
  level 1 by the upgrade nemesis, or not yet raised, refuses those, and the workload records that
  as a definite failure: nothing enqueued, which the queue checkers hold it to).

Statistics: marked values enqueued by outcome, enqueues refused for the level, items checked
and how many had headers. Items seen without their details (a peek, or a history from before
the workload recorded them) are not checked; a history where no item has details is "not checked".

Pure Python: imports nothing from rcq (hence the rule of chaos.generator.headers_of is repeated here;
a test holds the two to each other).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel, build_model

HEADERS_SUFFIX = "-h"
HEADER_KEY = "rcq-chaos"
LEVEL_REFUSAL = "feature_level_required"
VIOLATIONS = ("headers_missing", "headers_wrong", "headers_unexpected", "refused_without_headers")


def expected_headers(value: Hashable) -> dict[str, str]:
    """What an item of ``value`` must carry (the workload's ``headers_of``)."""
    return {HEADER_KEY: value} if isinstance(value, str) and value.endswith(HEADERS_SUFFIX) else {}


def check_headers(history: Any) -> dict[str, Any]:
    model = history if isinstance(history, QueueModel) else build_model(history)
    samples: dict[str, list[dict[str, Any]]] = {kind: [] for kind in VIOLATIONS}
    counts: Counter[str] = Counter()

    def offend(kind: str, sample: dict[str, Any]) -> None:
        counts[kind] += 1
        if len(samples[kind]) < SAMPLE_SIZE_MAX:
            samples[kind].append(sample)

    checked = with_headers = unchecked = 0
    for sighting in model.sightings:
        if sighting.item is None:
            unchecked += 1
            continue
        checked += 1
        expected = expected_headers(sighting.value)
        found = sighting.item.get("h") or {}
        with_headers += bool(found)
        if found == expected:
            continue
        kind = "headers_unexpected" if not expected else "headers_missing" if not found else "headers_wrong"
        offend(kind, {"value": sighting.value, "queue": sighting.queue, "f": sighting.op.f,
                      "index": sighting.op.invoke_index, "headers": found, "expected": expected})

    marked: Counter[str] = Counter()
    refused = 0
    for tx in model.enqueues:
        carried = [value for value in tx.values if expected_headers(value)]
        marked[tx.op.type] += len(carried)
        if tx.op.error == LEVEL_REFUSAL:
            refused += 1
            if not carried:
                offend("refused_without_headers", {"f": "enqueue", "index": tx.op.invoke_index,
                                                   "values": list(tx.values)[:5]})
    for move in model.moves:
        if move.op.error == LEVEL_REFUSAL:
            refused += 1
            if not any(expected_headers(value) for value in move.values):
                offend("refused_without_headers", {"f": "move", "index": move.op.invoke_index,
                                                   "values": list(move.values)[:5]})
    violations = {kind: counts[kind] for kind in VIOLATIONS}
    return {
        "valid": not any(violations.values()),
        "checked": checked > 0,
        "violations": violations,
        "samples": {kind: found for kind, found in samples.items() if found},
        "items_checked": checked,
        "items_with_headers": with_headers,
        "items_without_details": unchecked,
        "marked_values_enqueued": dict(sorted(marked.items())),
        "refused_for_level": refused,
    }


def summary_line(r: dict[str, Any]) -> str:
    """One line (and offenders) for the run's summary."""
    enqueued = ", ".join(f"{outcome} {count}" for outcome, count in r["marked_values_enqueued"].items()) or "none"
    if not r.get("checked"):
        line = f"not checked (no item details in this history); values with headers enqueued: {enqueued}"
    else:
        line = (f"{r['items_checked']} items seen checked, {r['items_with_headers']} with headers; values with "
                f"headers enqueued: {enqueued}; {r['refused_for_level']} ops refused for the feature level")
    for kind, count in r["violations"].items():
        if count:
            shown = [s.get("value", s.get("values")) for s in r["samples"].get(kind, [])[:5]]
            line += f"\n      {kind}: {count} e.g. {', '.join(str(v) for v in shown)}"
    return line
