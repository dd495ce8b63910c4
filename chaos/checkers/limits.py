"""The limits checker: a queue with its own max_items never holds more, whatever the faults.

Every ``count`` op reads a queue's replicated count and the limit it was configured with; the
state machine refuses (deterministically, on every replica) any commit that would take a queue
past its limit, so no read may ever show more. Refusals are counted: a run whose limited queue
never filled up tested nothing, and the report says so (``queue_full_refusals``).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel


def check_limits(model: QueueModel) -> dict[str, Any]:
    over: list[dict[str, Any]] = []
    reads = 0
    for op in model.ops:
        if op.f != "count" or op.type != "ok" or not isinstance(op.value, dict):
            continue
        limit, count = op.value.get("max_items"), op.value.get("count")
        if not isinstance(limit, int) or not isinstance(count, int):
            continue
        reads += 1
        if count > limit:
            over.append({"queue": op.value.get("queue"), "count": count, "max_items": limit,
                         "index": op.invoke_index})
    refusals = sum(1 for op in model.ops if op.f in ("enqueue", "move") and op.error == "queue_full")
    return {"valid": not over, "limited_reads": reads, "over_limit_count": len(over),
            "over_limit": over[:SAMPLE_SIZE_MAX], "queue_full_refusals": refusals}
