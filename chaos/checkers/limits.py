"""The limits checker: a queue with its own max_items never holds more, whatever the faults, and a
spread queue's fragments never more than their shares of it.

Every ``count`` op reads a queue's replicated count and the limit it was configured with; the
state machine refuses (deterministically, on every replica) any commit that would take a queue
past its limit, so no read may ever show more. Refusals are counted: a run whose limited queue
never filled up tested nothing, and the report says so (``queue_full_refusals``).

A spread queue (docs/partitions.md, "Spread queues") has its ``max_items`` split into one share
per fragment, adding up to it, the first fragments in placement order taking the remainder (40
over three are 14, 13 and 13: :func:`shares`, the server's rule); each fragment refuses what would
take it past its share. Its ``count`` op records the fragments' sum and the whole limit (None when
a fragment did not answer), and each fragment that answered its own count and share
(``by_partition``, chaos.executor). The queues' stats after the drain (the ``queue-stats`` checker
input) record each queue's count too. Each limit is the configured one (the ``configure`` ops),
else the one the read states.

**Invalid** when:

* ``over_limit``: a read shows a queue holding more than its max_items (a spread queue's count is
  its fragments' sum: each fragment held at most its share when it was read, so the sum is at most
  the limit, though the fragments are not read at one point in time);
* ``over_share``: a fragment's count over its share;
* ``wrong_limit``: a read states a whole limit, or a fragment's share, other than the configured
  limit or the share the server's rule gives it; or a ``queue_full`` refusal names a limit reached
  other than the queue's, or than the share of the fragment the transaction ran in (a one-request
  enqueue's fragment is not known: any of the shares).

Counts: the reads checked (``limited_reads``; ``fragment_reads``: a fragment's count of a limited
spread queue), and the ``queue_full`` refusals of enqueues and moves (definite failures: nothing
was enqueued), by queue (``queue_full_refusals_by_queue``: the queue the refusal named, ``full`` in
the op's value; else the one limited queue it wrote into, ``unknown`` when several).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from chaos.checkers.features.given import queue_stats
from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel

QUEUE_FULL = "queue_full"
UNKNOWN = "unknown"


def shares(limit: int, partitions: Sequence[str]) -> dict[str, int]:
    """Each fragment's share of a spread queue's ``limit``, the server's way: equal parts adding up
    to it, the first fragments in placement order one more each while the remainder lasts."""
    base, extra = divmod(limit, len(partitions))
    return {partition: base + (1 if i < extra else 0) for i, partition in enumerate(partitions)}


def _configured(model: QueueModel) -> dict[str, tuple[int, dict[str, int]]]:
    """queue -> its configured max_items and, spread, each fragment's share of it."""
    limits: dict[str, tuple[int, dict[str, int]]] = {}
    for queue, settings in model.settings.items():
        limit, partitions = settings.get("max_items"), settings.get("partitions")
        if isinstance(limit, int):
            spread = [str(p) for p in partitions] if isinstance(partitions, list) and len(partitions) > 1 else []
            limits[queue] = limit, shares(limit, spread) if spread else {}
    return limits


def _share_of(row: dict[str, Any]) -> Any:
    """A fragment's recorded share: ``{"max_items": n, ...}`` as the server answers it, or n."""
    share = row.get("share")
    return share.get("max_items") if isinstance(share, dict) else share


def check_limits(model: QueueModel, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    configured = _configured(model)
    over: list[dict[str, Any]] = []
    over_share: list[dict[str, Any]] = []
    wrong: list[dict[str, Any]] = []
    reads = fragment_reads = 0
    for op in model.ops:
        if op.f != "count" or op.type != "ok" or not isinstance(op.value, dict):
            continue
        queue, count, stated = op.value.get("queue"), op.value.get("count"), op.value.get("max_items")
        known = configured.get(str(queue))
        share_of = known[1] if known is not None else {}
        if known is not None and isinstance(stated, int) and stated != known[0]:
            wrong.append({"queue": queue, "max_items": stated, "configured": known[0], "index": op.invoke_index})
        limit = known[0] if known is not None else stated
        if isinstance(limit, int) and isinstance(count, int):
            reads += 1
            if count > limit:
                over.append({"queue": queue, "count": count, "max_items": limit, "index": op.invoke_index})
        fragments = op.value.get("by_partition")
        for partition, row in (fragments.items() if isinstance(fragments, dict) else ()):
            held, recorded = (row.get("count"), _share_of(row)) if isinstance(row, dict) else (None, None)
            share = share_of.get(partition)
            if share is not None and isinstance(recorded, int) and recorded != share:
                wrong.append({"queue": queue, "partition": partition, "share": recorded, "configured": share,
                              "index": op.invoke_index})
            share = share if share is not None else recorded
            if isinstance(share, int) and isinstance(held, int):
                fragment_reads += 1
                if held > share:
                    over_share.append({"queue": queue, "partition": partition, "count": held, "share": share,
                                       "index": op.invoke_index})
    for queue, stats in sorted((queue_stats(history) or {}).items()):
        count = stats.get("count") if isinstance(stats, dict) else None
        if queue in configured and isinstance(count, int):
            reads += 1
            if count > configured[queue][0]:
                over.append({"queue": queue, "count": count, "max_items": configured[queue][0], "by": "queue-stats"})
    refusals = _refusals(model, configured, wrong)
    return {"valid": not (over or over_share or wrong), "limited_reads": reads, "fragment_reads": fragment_reads,
            "over_limit_count": len(over), "over_limit": over[:SAMPLE_SIZE_MAX],
            "over_share_count": len(over_share), "over_share": over_share[:SAMPLE_SIZE_MAX],
            "wrong_limit_count": len(wrong), "wrong_limit": wrong[:SAMPLE_SIZE_MAX],
            "queue_full_refusals": sum(refusals.values()), "queue_full_refusals_by_queue": dict(sorted(refusals.items())),
            "shares": {queue: share_of for queue, (_, share_of) in sorted(configured.items()) if share_of}}


def _refusals(model: QueueModel, configured: dict[str, tuple[int, dict[str, int]]], wrong: list[dict[str, Any]]
              ) -> Counter[str]:
    """The enqueues and moves refused queue_full, by the queue that was full; a refusal that names a
    configured queue and the limit it reached must name its limit, or the share of the fragment the
    transaction ran in (any of the shares, not known where: a one-request enqueue), else ``wrong``."""
    refused: Counter[str] = Counter()
    for op in model.ops:
        if op.f not in ("enqueue", "move") or op.error != QUEUE_FULL:
            continue
        value = op.value if isinstance(op.value, dict) else {}
        full = value.get("full")
        if isinstance(full, dict) and isinstance(full.get("queue"), str):
            named, reached, ran_in = str(full["queue"]), full.get("max_items"), value.get("partition")
            refused[named] += 1
            limit, share_of = configured[named] if named in configured else (None, {})
            allowed = ({share_of[ran_in]} if ran_in in share_of else set(share_of.values())) if share_of else {limit}
            if isinstance(reached, int) and limit is not None and reached not in allowed:
                wrong.append({"queue": named, "partition": ran_in, "refused_at": reached, "configured": sorted(allowed),
                              "index": op.invoke_index})
            continue
        written = ([str(value.get("to"))] if op.f == "move"
                   else sorted({str(w.get("queue")) for w in value.get("writes") or [] if isinstance(w, dict)}))
        limited = [queue for queue in written if queue in configured] or written
        refused[limited[0] if len(limited) == 1 else UNKNOWN] += 1
    return refused
