"""ItemRules: what the leader does about time and poison items (docs/queue-features.md).

* Delayed items join their queue view when their time comes (a timer on the leader, no entry);
* items past their expiry, and items whose delivery count reached ``max_deliveries`` when their
  transaction ends without a commit, leave through an :class:`ItemsAction` proposed here and
  grouped with commits into one entry; the state machine re-checks the rule at the entry's time;
* the stream of applied entries keeps the views in step with what each action did.

Only the leader runs this, while it serves; losing leadership drops everything here with the
views (a new leader rebuilds them from the replicated state and starts again).

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from rcq.errors import RcqError
from rcq.server.core.commands import Barrier, ItemsAction, ItemsOutcome
from rcq.server.core.state_machine import ITEM_ACTION_IDS_MAX
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.queue_view import QueueView
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)

TIMER_MAX_SLEEP_S = 1.0  # the timer looks again at least this often (new delayed items wake it sooner)


def chunks(item_ids: list[int]) -> Iterator[tuple[int, ...]]:
    for start in range(0, len(item_ids), ITEM_ACTION_IDS_MAX):
        yield tuple(item_ids[start:start + ITEM_ACTION_IDS_MAX])


class ItemRules:
    def __init__(self, replicator: Replicator, committer: GroupCommitter, clock: LeaderClock,
                 views: Callable[[], dict[str, QueueView]], spawn: Callable[[Any], None],
                 term: Callable[[], int], commit_timeout_s: float) -> None:
        self._replicator = replicator
        self._term = term
        self._commit_timeout_s = commit_timeout_s
        self._advancing = False  # a time entry is on its way
        self._committer = committer
        self._clock = clock
        self._views = views
        self._spawn = spawn
        self._wakeup = asyncio.Event()
        self._leaving: dict[str, set[int]] = {}  # queue -> ids handed to an action under way

    def reset(self) -> None:
        self._leaving = {}

    # ------------------------------------------------------------ proposals
    def propose(self, action: str, queue: str, item_ids: list[int], note: str | None = None, *,
                taken: bool = True) -> list[asyncio.Future[Any]]:
        """Propose ``action`` on ids. ``taken``: they are already out of the view's availability
        (taken, then released): the applied entry forgets those that left and gives back those
        the rule did not hold for. Otherwise they are still in the view (as available, or
        withheld) and the applied entry turns those that left into tombstones."""
        if not item_ids:
            return []
        if taken:
            self._leaving.setdefault(queue, set()).update(item_ids)
        futures: list[asyncio.Future[Any]] = []
        for chunk in chunks(item_ids):
            future = self._committer.commit(ItemsAction(action, queue, chunk, note), 16 * len(chunk))  # type: ignore[arg-type]  # action: a str the callers take from the Literal
            future.add_done_callback(functools.partial(self._settled, queue=queue, item_ids=chunk))
            futures.append(future)
        return futures

    def _settled(self, future: asyncio.Future[Any], *, queue: str, item_ids: tuple[int, ...]) -> None:
        """An action that failed (leadership lost, timeout): its items stay where they were in the
        replicated state; if this leader still serves, they are available again."""
        if future.cancelled() or future.exception() is None:
            return
        log.info("item action on %d item(s) of %s not applied: %r", len(item_ids), queue, future.exception())
        self._give_back_if_present(queue, list(item_ids))

    def _give_back_if_present(self, queue: str, item_ids: list[int]) -> None:
        leaving = self._leaving.get(queue, set())
        mine = [i for i in item_ids if i in leaving]
        leaving.difference_update(mine)
        view = self._views().get(queue)
        if view is None or not mine:
            return
        present = self._replicator.read(lambda sm: [sm.contains(queue, i) for i in mine])
        view.give_back([i for i, here in zip(mine, present, strict=True) if here])

    # ------------------------------------------------------------ returns
    def return_items(self, queue: str, view: QueueView, item_ids: list[int], *, delivered: bool) -> int:
        """Items a transaction held go back, unless they must leave: past their expiry, or (their
        delivery having ended without a commit) at their queue's delivery limit. Returns how many
        went back to the head."""
        if not item_ids:
            return 0
        now = self._clock.now_ms()
        expired = set(view.expired_among(item_ids, now))
        rest = [i for i in item_ids if i not in expired]
        dying: list[int] = []
        if delivered:
            if view.max_deliveries is not None:
                limit = view.max_deliveries
                dying = [i for i in rest if view.deliveries.get(i, 0) >= limit]
            else:
                deliveries = view.deliveries
                for item_id in rest:  # counted in memory only: deliveries are not replicated here
                    deliveries[item_id] = deliveries.get(item_id, 0) + 1
        if dying:
            dead = set(dying)
            rest = [i for i in rest if i not in dead]
        view.release(list(expired) + dying)
        self.propose("expire", queue, sorted(expired))
        self.propose("dead_letter", queue, dying)
        view.give_back(rest)
        return len(rest)

    # ------------------------------------------------------------ applied
    def on_applied(self, outcome: ItemsOutcome, action: ItemsAction, now_ms: int) -> None:
        """Keep the views in step with an applied action (every replica applied the same)."""
        views = self._views()
        if outcome.status != "done":
            self._give_back_if_present(action.queue, list(action.item_ids))
            return
        view = views.get(action.queue)
        leaving = self._leaving.get(action.queue, set())
        removed = set(outcome.removed)
        if view is not None:
            taken = [i for i in outcome.removed if i in leaving or i in view.locked]
            taken_set = set(taken)
            leaving.difference_update(taken)
            view.forget_taken(taken)
            view.forget([i for i in outcome.removed if i not in taken_set])
            for item_id, count in zip(outcome.acted, outcome.counts, strict=False):
                view.deliveries[item_id] = count
        for arrival in outcome.moved:
            target = views.get(arrival.queue)
            if target is None:
                target = views[arrival.queue] = QueueView(self._max_deliveries(arrival.queue))
            target.add_range(arrival.first_item_id, arrival.count, arrival.priority, arrival.visible_at_ms,
                             arrival.expires_at_ms, now_ms)
            if arrival.visible_at_ms > now_ms or arrival.expires_at_ms is not None:
                self.wake()
        not_acted = [i for i in action.item_ids if i in leaving and i not in removed]
        if action.action != "deliver" and not_acted:
            self._give_back_if_present(action.queue, not_acted)

    def _max_deliveries(self, queue: str) -> int | None:
        features = self._replicator.read(lambda sm: sm.queue_features(queue))
        return features.max_deliveries if features is not None else None

    # ------------------------------------------------------------ timer
    def wake(self) -> None:
        self._wakeup.set()

    async def run_timer(self, still_serving: Callable[[], bool]) -> None:
        """Promote delayed items and expire due ones until this leadership ends.

        An item becomes visible only once the replicated state's time has reached its
        ``visible_at_ms`` (a new leader rebuilds its views from that time: an item shown before
        would be hidden again). When items are due by the clock but the state's time lags (no entry
        for a while), a time entry (a barrier of this term) moves it on."""
        while still_serving():
            now = self._clock.now_ms()
            applied = self._clock.applied_ms
            next_due: int | None = None
            time_needed = False
            for queue, view in list(self._views().items()):
                view.promote(applied)
                visible_at = view.next_visible_ms()
                if visible_at is not None and visible_at <= now:
                    time_needed = True
                due = view.due_expiries(now)
                if due:
                    self.propose("expire", queue, due, taken=False)
                for when in (view.next_expiry_ms(), visible_at):
                    # a visible_at already reached waits for the time entry, which wakes the timer
                    if when is not None and when > now and (next_due is None or when < next_due):
                        next_due = when
            if time_needed:
                self._advance_time()
            sleep_s = TIMER_MAX_SLEEP_S
            if next_due is not None:
                sleep_s = min(sleep_s, max(0.001, (next_due - self._clock.now_ms()) / 1000))
            self._wakeup.clear()
            try:
                async with asyncio.timeout(sleep_s):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def _advance_time(self) -> None:
        if not self._advancing:
            self._advancing = True
            self._spawn(self._time_entry())

    async def _time_entry(self) -> None:
        try:
            await self._replicator.submit(Barrier(term=self._term(), now_ms=self._clock.now_ms()),
                                          self._commit_timeout_s)
        except RcqError as exc:
            log.info("time entry not applied: %s", exc.code)
            await asyncio.sleep(0.05)
        finally:
            self._advancing = False
            self.wake()

    async def settle(self, futures: list[asyncio.Future[Any]]) -> list[ItemsOutcome]:
        """Wait for proposals made on a caller's behalf (reject, redrive); raise what failed."""
        outcomes = []
        for future in futures:
            outcome = await future
            if not isinstance(outcome, ItemsOutcome):
                raise RcqError(f"unexpected outcome {outcome!r}")
            outcomes.append(outcome)
        return outcomes
