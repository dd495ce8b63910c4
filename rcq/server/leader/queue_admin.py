"""QueueAdmin: the leader's verbs on queues as a whole, and what the leader knows of their items.

Configure, purge and delete (one replicated :class:`QueueChange` each, refused before it is
proposed when it cannot apply), dead letters (``reject`` from a transaction, ``redrive`` back to
the source queues, both as :class:`ItemsAction` through the item rules), and the counts only the
leader knows (locked, delayed, ready). A purge or delete applied aborts the transactions that hold
the queue's items (:meth:`QueueAdmin.on_changed`): those items are gone, not given back.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from rcq.errors import (
    Forbidden,
    InternalError,
    InvalidRequest,
    QueueInUse,
    QueueNotFound,
    TooManyQueues,
    Unavailable,
)
from rcq.names import check_queue_name
from rcq.server.config import NodeConfig
from rcq.server.core import state_machine
from rcq.server.core.commands import Command, QueueChange, QueueChangeResult, QueueSettings
from rcq.server.leader.admission import Admission
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.leader_state import LeaderState
from rcq.server.leader.routing import lives_elsewhere
from rcq.server.leader.session import DequeuedItem, State
from rcq.server.raft.protocol import Replicator

QueueLimits = tuple[tuple[int | None, int | None] | None, tuple[int, int], QueueSettings | None]


class QueueAdmin:
    def __init__(self, config: NodeConfig, leader: LeaderState, replicator: Replicator, admission: Admission,
                 clock: LeaderClock) -> None:
        self._config = config
        self._leader = leader
        self._replicator = replicator
        self._admission = admission
        self._clock = clock

    # ------------------------------------------------------------ settings
    def queue_limits(self, queue: str) -> QueueLimits:
        """The queue's own (max_items, max_bytes) (None: no such queue), the limits that apply to it,
        and its other settings."""
        return self._replicator.read(lambda sm: (
            sm.queue_settings(queue), sm.effective_limits(queue, self._admission.limits), sm.queue_features(queue)))

    async def change_queue(self, queue: str, action: str, max_items: int | None = None,
                           max_bytes: int | None = None, settings: QueueSettings | None = None) -> QueueChangeResult:
        """Configure, purge or delete ``queue`` through Raft; answers once applied."""
        self._leader.require_serving()
        check_queue_name(queue)
        # Refused here, a request changes nothing at all (not even the log): a queue that is not
        # there, one more queue than the cap, bad settings, a dead-letter queue still in use. The
        # state machine checks again when it applies.
        exists, queues, problem, users = self._replicator.read(lambda sm: (
            sm.queue_settings(queue) is not None, sm.table_sizes()["queues"],
            sm.settings_problem(queue, settings) if settings is not None else None, sm.dead_letter_users(queue)))
        if not exists and action != "configure":
            raise QueueNotFound(f"no queue {queue!r}")
        if not exists and queues >= state_machine.QUEUES_MAX:
            raise TooManyQueues(details={"queue": queue})
        if action == "configure" and problem is not None:
            raise _settings_error(queue, settings, problem)
        if action == "delete" and users:
            raise _in_use_error(queue, users)
        change = QueueChange(term=self._leader.serving_term, now_ms=self._clock.now_ms(), queue=queue,
                             action=action, max_items=max_items, max_bytes=max_bytes,  # type: ignore[arg-type]  # action: checked against the Literal by the route
                             settings=settings if settings != QueueSettings() else None)
        result = await self._replicator.submit(change, self._config.commit_timeout_s)
        if not isinstance(result, QueueChangeResult):
            raise InternalError(f"queue change not applied: {result!r}")
        if result.reason == "queue_not_found":
            raise QueueNotFound(f"no queue {queue!r}")
        if result.reason == "too_many_queues":
            raise TooManyQueues(details={"queue": queue})
        if result.reason == "queue_placed_elsewhere":  # placed in another partition while this was in flight
            raise lives_elsewhere(queue, self._replicator.read(lambda sm: sm.directory.placed(queue))[0])
        if result.reason == "queue_in_use":
            raise _in_use_error(queue, self._replicator.read(lambda sm: sm.dead_letter_users(queue)))
        if result.status != "done" and result.reason and result.reason != "stale_leader" and settings is not None:
            raise _settings_error(queue, settings, result.reason)
        if result.status != "done":
            raise Unavailable(f"the leader changed before the queue change applied ({result.reason}); retry")
        return result

    def on_changed(self, command: Command | None, result: QueueChangeResult) -> None:
        """A queue change applied while this leader serves: keep the views in step."""
        if result.status != "done":
            return
        if result.action in ("purge", "delete"):
            self._on_queue_emptied(result.queue, result.action)
        if isinstance(command, QueueChange) and result.action == "configure":
            view = self._leader.view(result.queue)
            view.max_deliveries = command.settings.max_deliveries if command.settings else None

    def _on_queue_emptied(self, queue: str, action: str) -> None:
        """A purge or delete applied: transactions holding its items (or, for a delete, about to
        enqueue into it) are aborted; the items they held are gone, not given back."""
        leader = self._leader
        reason = "queue_purged" if action == "purge" else "queue_deleted"
        for transaction in list(leader.sessions.values()):
            if transaction.epoch != leader.epoch or transaction.state is not State.OPEN:
                continue
            held = bool(transaction.dequeued.get(queue))
            if held or (action == "delete" and queue in transaction.enqueued_queues()):
                transaction.dequeued.pop(queue, None)
                leader.close(transaction, State.ABORTED, reason)
        view = leader.views.pop(queue, None) if action == "delete" else leader.views.get(queue)
        if view is not None:
            view.clear()  # wakes waiting dequeuers: they look again
        if action == "purge":
            leader.view(queue)

    # ------------------------------------------------------------ dead letters
    async def reject(self, transaction_id: str, queue: str, item_ids: list[int], note: str | None = None
                     ) -> tuple[int, str | None]:
        """Items this transaction dequeued from ``queue`` die at once (reason ``rejected``): to the
        dead-letter queue, or dropped. They are no longer the transaction's, whatever it does next.
        Returns how many were rejected and the dead-letter queue (None: dropped)."""
        leader = self._leader
        transaction = leader.get_open(transaction_id)
        check_queue_name(queue)
        held = transaction.dequeued.get(queue, [])
        not_held = sorted(set(item_ids) - set(held))
        if not_held:
            raise InvalidRequest(f"item(s) {not_held[:10]} of queue {queue!r} are not held by this transaction",
                                 details={"item_ids": not_held[:100]})
        if not item_ids:
            return 0, None
        values = self._replicator.read(lambda sm: sm.values(queue, item_ids))
        transaction.drop_held(queue, [DequeuedItem(i, queue, v or b"") for i, v in zip(item_ids, values, strict=True)])
        view = leader.views[queue]
        unique = list(dict.fromkeys(item_ids))
        view.release(unique)
        outcomes = await leader.rules.settle(leader.rules.propose("reject", queue, unique, note))
        target = self._replicator.read(lambda sm: (sm.queue_features(queue) or QueueSettings()).dead_letter_queue)
        return sum(len(o.acted) for o in outcomes), target

    async def redrive(self, dead_letter_queue: str, max_items: int | None = None, source_queue: str | None = None,
                      may_redrive_to: Callable[[str], bool] = lambda _: True) -> dict[str, int]:
        """Move dead items of ``dead_letter_queue`` that no transaction holds back to their source
        queues (at most ``max_items``, and only from ``source_queue`` when given), in one entry.
        Returns how many went to each source queue."""
        leader = self._leader
        leader.require_serving()
        check_queue_name(dead_letter_queue)
        limit = min(max_items or state_machine.ITEM_ACTION_IDS_MAX, state_machine.ITEM_ACTION_IDS_MAX)
        view = leader.views.get(dead_letter_queue)
        locked = view.locked if view is not None else set()
        exists, candidates = self._replicator.read(lambda sm: (
            sm.queue_settings(dead_letter_queue) is not None,
            sm.dead_items(dead_letter_queue, limit, source_queue, locked)))
        if not exists:
            raise QueueNotFound(f"no queue {dead_letter_queue!r}")
        sources = sorted({source for _, source in candidates})
        refused = [s for s in sources if not may_redrive_to(s)]
        if refused:
            raise Forbidden(f"redriving needs produce permission on {refused[0]!r}", details={"queue": refused[0]})
        if not candidates or view is None:
            return {}
        ids = [item_id for item_id, _ in candidates]
        view.withhold(ids)
        outcomes = await leader.rules.settle(leader.rules.propose("redrive", dead_letter_queue, ids, taken=False))
        moved: Counter[str] = Counter()
        for outcome in outcomes:
            for arrival in outcome.moved:
                moved[arrival.queue] += arrival.count
        return dict(sorted(moved.items()))

    # ------------------------------------------------------------ counts
    def queue_counts(self, queue: str) -> dict[str, int] | None:
        """What this leader knows of a queue's items: locked, delayed, ready; None when not serving."""
        if not self._leader.serving:
            return None
        view = self._leader.views.get(queue)
        if view is None:
            return {"locked": 0, "delayed": 0, "ready": 0}
        return {"locked": len(view.locked), "delayed": view.delayed_count(), "ready": view.available_count()}

    def locked_count(self, queue: str) -> int | None:
        if not self._leader.serving:
            return None
        view = self._leader.views.get(queue)
        return len(view.locked) if view is not None else 0


def _settings_error(queue: str, settings: QueueSettings | None, problem: str) -> InvalidRequest:
    target = settings.dead_letter_queue if settings is not None else None
    messages = {
        "dead_letter_queue_self": f"queue {queue!r} cannot be its own dead-letter queue",
        "dead_letter_queue_unknown": f"dead-letter queue {target!r} does not exist: create it first "
                                     "(PUT /v1/queues/{name})",
        "dead_letter_queue_cycle": f"dead-letter queue {target!r} leads back to {queue!r}: dead-letter "
                                   "queues must not form a cycle",
    }
    return InvalidRequest(messages.get(problem, f"invalid queue settings: {problem}"),
                          details={"queue": queue, "reason": problem})


def _in_use_error(queue: str, users: list[str]) -> QueueInUse:
    return QueueInUse(f"queue {queue!r} is the dead-letter queue of {', '.join(map(repr, users[:5]))}; "
                      "remove that setting first", details={"queue": queue, "used_by": users[:100]})
