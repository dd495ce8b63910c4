"""The apply of queue administration (:class:`~rcq.server.core.commands.QueueChange`) and its rules.

``configure`` creates a queue or replaces its settings (limits, deliveries, dead-letter queue,
times, priorities); ``purge`` removes every item; ``delete`` removes the queue, unless another
queue sends its dead items there. Settings are checked here, where they apply, because every
replica must refuse the same ones: the leader asks :func:`settings_problem` first only to answer
sooner.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from collections.abc import Mapping

from rcq.server.core.commands import QueueChange, QueueChangeResult, QueueSettings
from rcq.server.core.ledger import Ledger
from rcq.server.core.queue import Queue

MAX_DELIVERIES_MAX = 1000
MAX_PRIORITY_MAX = 255


def apply_queue_change(ledger: Ledger, change: QueueChange, barrier_term: int, queues_max: int) -> QueueChangeResult:
    def rejected(reason: str) -> QueueChangeResult:
        return QueueChangeResult("rejected", change.queue, change.action, reason=reason)

    if change.term < barrier_term:
        return rejected("stale_leader")
    queue = ledger.queues.get(change.queue)
    if change.action == "configure":
        settings = change.settings or QueueSettings()
        problem = settings_problem(ledger.queues, change.queue, settings)
        if problem is not None:
            return rejected(problem)
        if queue is None:
            if len(ledger.queues) >= queues_max:
                return rejected("too_many_queues")
            queue = ledger.queue(change.queue)
        queue.max_items, queue.max_bytes = change.max_items, change.max_bytes
        queue.settings = settings
        return QueueChangeResult("done", change.queue, change.action)
    if queue is None:
        return rejected("queue_not_found")
    if change.action == "delete" and dead_letter_users(ledger.queues, change.queue):
        return rejected("queue_in_use")
    removed = ledger.clear(change.queue)
    if change.action == "delete":
        del ledger.queues[change.queue]
    else:
        queue.stats.purged_total += removed
    return QueueChangeResult("done", change.queue, change.action, removed=removed)


def settings_problem(queues: Mapping[str, Queue], queue_name: str, settings: QueueSettings) -> str | None:
    """Why ``settings`` cannot be given to ``queue_name`` now (a reason code), or None."""
    if settings.max_deliveries is not None and not 1 <= settings.max_deliveries <= MAX_DELIVERIES_MAX:
        return "max_deliveries_out_of_range"
    if settings.max_priority is not None and not 0 <= settings.max_priority <= MAX_PRIORITY_MAX:
        return "max_priority_out_of_range"
    target = settings.dead_letter_queue
    if target is None:
        return None
    if target == queue_name:
        return "dead_letter_queue_self"
    if target not in queues:
        return "dead_letter_queue_unknown"
    seen = {queue_name}
    while target is not None:  # follow the chain of dead-letter queues: it must end
        if target in seen:
            return "dead_letter_queue_cycle"
        seen.add(target)
        next_queue = queues.get(target)
        target = next_queue.settings.dead_letter_queue if next_queue is not None else None
    return None


def dead_letter_users(queues: Mapping[str, Queue], queue_name: str) -> list[str]:
    """The queues whose dead-letter queue is ``queue_name``."""
    return sorted(name for name, q in queues.items() if q.settings.dead_letter_queue == queue_name)
