"""TransactionManager: the leader's front door — its verbs, its leadership, its stream of applied entries.

The HTTP layer (and tests) call the verbs here; each hands the work to the part whose job it is,
and no part calls back up:

* ``open_transactions`` — begin, extend, describe, enqueue (buffered), abort, expiry;
* ``dequeue`` — items locked into a transaction;
* ``commit_path`` — commit through the group committer and Raft, settling unknown outcomes;
* ``queue_admin`` — configure, purge, delete, reject, redrive, counts;
* ``leader_state`` — the state they share for one epoch (sessions, queue views) and its invariant.

This module owns what is the leader's as a whole. Leadership: a new leader serves nothing until
its barrier entry is applied, i.e. until every entry of earlier terms is applied; it then builds
its queue views from the replicated state. Losing leadership, or any change of term, aborts every
open transaction: their items are simply no longer locked, so they are back at the head of their
queues. And the stream of applied entries (:meth:`TransactionManager.on_applied`), which it hands
to the part each entry concerns. Transaction ids carry the term that created them
(``<term hex>.<random>``), so any later leader can say "aborted: leader changed" about a
transaction it never saw, or "committed" if the replicated outcomes say so (see ``answers``).

Two verbs are compositions of others, so that every front door behaves the same: ``receive``
(begin and dequeue, nothing held when nothing came) and ``execute`` (a one-request transaction).

Must not import: pysyncobj, lmdb, aiohttp; nothing from ``rcq.server.http`` (the walk goes one way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rcq.errors import LeaderChanged, RcqError
from rcq.server.config import NodeConfig
from rcq.server.core.commands import (
    ApplyResult,
    Barrier,
    BarrierResult,
    BatchResult,
    Command,
    CommitBatch,
    CommitUnit,
    EnqueueOptions,
    Headers,
    ItemsAction,
    ItemsOutcome,
    QueueChangeResult,
    QueueSettings,
    UnitOutcome,
)
from rcq.server.leader.admission import Admission
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.commit_path import CommitPath
from rcq.server.leader.dequeue import Dequeuer
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.leader_state import LeaderState
from rcq.server.leader.open_transactions import OpenTransactions
from rcq.server.leader.queue_admin import QueueAdmin, QueueLimits
from rcq.server.leader.routing import Routing
from rcq.server.leader.session import (
    AnswerBudget,
    CommitResult,
    DequeuedItem,
    DequeueStep,
    EnqueueStep,
    Executed,
    Session,
)
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)


class TransactionManager:
    def __init__(self, config: NodeConfig, replicator: Replicator,
                 leader_url: Callable[[], str | None]) -> None:
        self._config = config
        self._replicator = replicator
        self._leader_url = leader_url
        self._leader_term = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._clock = LeaderClock(config.test_clock_offset_ms)
        admission = self._admission = Admission(config)
        self._follows_stamps = config.partition_name is None
        self.on_serving: list[Callable[[], None]] = []  # called as this leader begins to serve, before any verb
        self._committer = GroupCommitter(
            replicator,
            units_max=config.commit_batch_units_max,
            bytes_max=config.commit_entry_bytes_max,
            in_flight_max=config.commits_in_flight_max,
            timeout_s=config.commit_timeout_s,
            limits=lambda: admission.limits,
            clock=self._clock.now_ms,
        )
        leader = self._leader = LeaderState(config, replicator, leader_url, admission, self._committer,
                                            self._clock, self._spawn)
        self._open = OpenTransactions(config, leader, replicator, admission)
        self.routing = Routing(config, replicator)
        self._deadlines = self._open.deadlines
        self._dequeuer = Dequeuer(config, leader, replicator, self._committer, self._clock)
        self._commits = CommitPath(config, leader, replicator, self._committer, admission, self._clock, self._spawn)
        self._queues = QueueAdmin(config, leader, replicator, admission, self._clock)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._leader.stopping = False  # a manager started again waits for items again
        self._deadlines.start()
        self._replicator.set_role_listener(self.on_role_change)
        self._replicator.set_apply_listener(self.on_applied)
        if self._replicator.is_leader():
            self.on_role_change(True, self._replicator.term)

    async def stop(self) -> None:
        self._reset(LeaderChanged("the node is shutting down"))
        await self._deadlines.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._committer.close()

    def end_waits(self) -> None:
        """The node stops: dequeues waiting for items answer now (empty), none waits from now on."""
        self._leader.end_waits()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ what others read
    @property
    def serving(self) -> bool:
        return self._leader.serving

    @property
    def open_count(self) -> int:
        return len(self._leader.sessions)

    @property
    def committer(self) -> GroupCommitter:
        return self._committer

    @property
    def closed_total(self) -> Counter[str]:
        """How transactions ended, by outcome (a metric)."""
        return self._leader.closed_total

    @property
    def returned_total(self) -> Counter[str]:
        """Items given back to the head, by queue (a metric)."""
        return self._leader.returned_total

    @property
    def on_commit_latency(self) -> Callable[[float], None] | None:
        """Called with the seconds from each commit's proposal to its outcome (a metric)."""
        return self._commits.on_latency

    @on_commit_latency.setter
    def on_commit_latency(self, observe: Callable[[float], None] | None) -> None:
        self._commits.on_latency = observe

    @property
    def storage_bytes_max(self) -> int:
        """This process's storage allowance: what it stamps on the entries it proposes as leader
        (its share of the node's budget: docs/partitions.md, "Memory budget")."""
        return self._admission.limits.storage_bytes_max

    @property
    def node_storage_bytes_max(self) -> int:
        """The node's budget (``storage_bytes_max`` of its configuration), shared by its partitions."""
        return self._admission.node_storage_bytes_max

    def set_storage_budget(self, storage_bytes_max: int) -> int:
        """Take ``storage_bytes_max`` as this process's allowance (p0's controller gives it); the
        allowance now in force (never above the node's budget)."""
        return self._admission.set_storage_budget(storage_bytes_max)

    def leader_url(self) -> str | None:
        """The URL of the leader this node knows of (None: none, or its URL is unknown)."""
        return self._leader_url()

    def require_serving(self) -> None:
        """Raise what a leader-only request answers when this node is not the serving leader."""
        self._leader.require_serving()

    def entry_stamp(self) -> tuple[int, int]:
        """(term, now in ms) for an administrative entry this serving leader proposes."""
        self.require_serving()
        return self._leader.serving_term, self._clock.now_ms()

    # ------------------------------------------------------------ leadership
    def on_role_change(self, is_leader: bool, term: int) -> None:
        """Called on the loop thread whenever leadership or term changes."""
        if is_leader and term == self._leader_term and self._leader.epoch:
            return
        self._reset(LeaderChanged())
        self._leader_term = term if is_leader else 0
        if is_leader:
            self._spawn(self._establish(term, self._leader.epoch))

    def _reset(self, error: RcqError) -> None:
        self._committer.start_term(0)  # commits not proposed yet never will be
        self._leader.new_epoch(error)
        self._deadlines.clear()

    async def _establish(self, term: int, epoch: int) -> None:
        """Propose a barrier for ``term`` until it is applied (see _on_barrier)."""
        delay_s = 0.05
        while (epoch == self._leader.epoch and self._leader.serving_term != term and self._replicator.is_leader()
               and self._replicator.term == term):
            try:
                await self._replicator.submit(
                    Barrier(term=term, now_ms=self._clock.now_ms()), self._config.commit_timeout_s)
            except RcqError as exc:
                log.info("barrier for term %d not applied yet: %s", term, exc.code)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def _on_barrier(self, index: int, result: BarrierResult) -> None:
        if (result.term != self._leader_term or self._leader.serving_term
                or self._replicator.term != result.term):
            return
        # Every entry of earlier terms is applied, and nothing after the barrier can change the
        # queues but this leader's own commits: build the views now.
        seeds = self._replicator.read(lambda sm: [
            (q, sm.view_seed(q), (sm.queue_features(q) or QueueSettings()).max_deliveries)
            for q in sm.queue_names()])
        for hook in self.on_serving:  # e.g. p0's allowance made safe before its first commit
            try:
                hook()
            except Exception:  # a bug in a hook must not keep the leader from serving
                log.exception("a hook of a leader beginning to serve failed")
        self._committer.start_term(result.term)
        self._leader.start_serving(result.term, seeds)
        epoch = self._leader.epoch
        self._spawn(self._leader.rules.run_timer(lambda: self._leader.epoch == epoch and self.serving))
        log.info("serving as leader of term %d from index %d", result.term, index)

    # ------------------------------------------------------------ the stream of applied entries
    def on_applied(self, index: int, command: Command | None, result: ApplyResult) -> None:
        """Every applied entry, in apply order, on the loop thread: keep the views in step."""
        if command is not None:
            self._clock.observe(command.now_ms)
        if self._follows_stamps and not self._leader.serving_term and isinstance(command, CommitBatch) \
                and command.limits is not None:
            # A follower of p0 shows the allowance its leader stamps (p0's leader sets its own:
            # docs/partitions.md, "Memory budget"); a partition's followers are given theirs.
            self._admission.set_storage_budget(command.limits.storage_bytes_max)
        if isinstance(result, BarrierResult):
            self._on_barrier(index, result)
            return
        if not self._leader.serving_term:
            return
        if isinstance(result, QueueChangeResult):
            self._queues.on_changed(command, result)
            return
        if not isinstance(result, BatchResult) or not isinstance(command, CommitBatch) \
                or len(command.units) != len(result.outcomes):
            return
        for unit, outcome in zip(command.units, result.outcomes, strict=True):
            if isinstance(unit, ItemsAction) and isinstance(outcome, ItemsOutcome):
                self._leader.rules.on_applied(outcome, unit, command.now_ms)
            elif isinstance(unit, CommitUnit) and isinstance(outcome, UnitOutcome):
                self._commits.on_unit_applied(unit, outcome, command.now_ms)

    # ------------------------------------------------------------ transaction verbs
    def begin(self, timeout_s: float | None = None, label: str | None = None, client: str = "",
              owner: str = "", partition: str | None = None) -> Session:
        self.routing.begin(partition)
        return self._open.begin(timeout_s, label, client, owner)

    def extend(self, transaction_id: str, timeout_s: float) -> Session:
        return self._open.extend(transaction_id, timeout_s)

    def describe(self, transaction_id: str) -> dict[str, Any]:
        self.routing.transaction(transaction_id)
        return self._open.describe(transaction_id)

    def check_owner(self, transaction_id: str, owner: str) -> None:
        """Raise unless ``owner`` may touch the transaction (and it belongs to this partition)."""
        self.routing.transaction(transaction_id)
        self._open.check_owner(transaction_id, owner)

    def list_open(self, label_prefix: str | None = None, owner: str = "") -> list[dict[str, Any]]:
        return self._open.list_open(label_prefix, owner)

    def enqueue(self, transaction_id: str, queue: str, values: list[bytes], key: str | None = None,
                options: EnqueueOptions | None = None, headers: list[Headers | None] | None = None) -> int:
        return self._open.enqueue(transaction_id, queue, values, key, options, headers)

    def answer_budget(self) -> AnswerBudget:
        return self._dequeuer.answer_budget()

    async def dequeue(self, transaction_id: str, queue: str, max_items: int = 1, wait_ms: int = 0,
                      key: str | None = None, budget: AnswerBudget | None = None) -> list[DequeuedItem]:
        return await self._dequeuer.dequeue(transaction_id, queue, max_items, wait_ms, key, budget)

    def abort(self, transaction_id: str) -> int:
        return self._open.abort(transaction_id)

    async def commit(self, transaction_id: str, idempotency_key: str | None = None) -> CommitResult:
        return await self._commits.commit(transaction_id, idempotency_key)

    async def commit_many(self, transaction_ids: list[str], idempotency_key: str | None = None) -> CommitResult:
        return await self._commits.commit_many(transaction_ids, idempotency_key)

    async def receive(self, queue: str, timeout_s: float | None = None, label: str | None = None,
                      max_items: int = 1, wait_ms: int = 0, client: str = "", owner: str = "",
                      budget: AnswerBudget | None = None) -> tuple[Session | None, list[DequeuedItem]]:
        """Begin a transaction and dequeue into it. Nothing received: the transaction is aborted at
        once and none is returned, so an idle consumer holds nothing on the leader."""
        self.routing.one_request((queue,))
        transaction = self._open.begin(timeout_s, label, client, owner)
        try:
            items = await self._dequeuer.dequeue(transaction.transaction_id, queue, max_items, wait_ms,
                                                 budget=budget)
        except BaseException:
            with contextlib.suppress(RcqError):
                self._open.abort(transaction.transaction_id)
            raise
        if not items:
            with contextlib.suppress(RcqError):
                self._open.abort(transaction.transaction_id)
            return None, []
        return transaction, items

    async def execute(self, steps: Sequence[EnqueueStep | DequeueStep], idempotency_key: str | None = None,
                      client: str = "", owner: str = "", budget: AnswerBudget | None = None) -> Executed:
        """A one-request transaction: run ``steps`` in a fresh transaction and commit it; anything
        failing aborts it. Its dequeues share one answer budget (``budget``: the enclosing
        request's, if it has one)."""
        self.routing.one_request(step.queue for step in steps)
        budget = budget if budget is not None else self.answer_budget()
        # One enqueue (a one-request enqueue, the commonest transaction): nothing awaits between the
        # begin and the commit's checks, so the transaction cannot meet its deadline open, and the
        # commit checks the queue limits for exactly the growth the enqueue would check, against
        # the same state: neither is done twice.
        at_once = len(steps) == 1 and isinstance(steps[0], EnqueueStep)
        transaction_id = self._open.begin(client=client, owner=owner, reaped=not at_once).transaction_id
        done: list[int | list[DequeuedItem]] = []
        try:
            for step in steps:
                if isinstance(step, EnqueueStep):
                    self._open.enqueue(transaction_id, step.queue, step.values, options=step.options,
                                       headers=step.headers, check_room=not at_once)
                    done.append(len(step.values))
                else:
                    # no read fence: the commit below answers first, and fences off a deposed leader
                    done.append(await self._dequeuer.dequeue(transaction_id, step.queue, step.max_items,
                                                             step.wait_ms, budget=budget, fenced=False))
            result = await self._commits.commit(transaction_id, idempotency_key)
        except BaseException:
            with contextlib.suppress(RcqError):  # already closed, or committing: nothing to give back here
                self._open.abort(transaction_id)
            raise
        if result.duplicate:
            # An earlier commit with this key already happened; this run's dequeues did not
            # apply (the items went back to their queues), so they must not be handed out.
            done = [[] if isinstance(step_done, list) else step_done for step_done in done]
        return Executed(transaction_id, result, done)

    # ------------------------------------------------------------ queue verbs
    def queue_limits(self, queue: str) -> QueueLimits:
        return self._queues.queue_limits(queue)

    def queue_partitions(self, queue: str) -> list[str]:
        """The partitions ``queue`` lives in: this process's own, or (in p0) where the directory places it."""
        return list(self.routing.placed(queue))

    async def change_queue(self, queue: str, action: str, max_items: int | None = None,
                           max_bytes: int | None = None, settings: QueueSettings | None = None) -> QueueChangeResult:
        return await self._queues.change_queue(queue, action, max_items, max_bytes, settings)

    async def reject(self, transaction_id: str, queue: str, item_ids: list[int], note: str | None = None
                     ) -> tuple[int, str | None]:
        return await self._queues.reject(transaction_id, queue, item_ids, note)

    async def redrive(self, dead_letter_queue: str, max_items: int | None = None, source_queue: str | None = None,
                      may_redrive_to: Callable[[str], bool] = lambda _: True) -> dict[str, int]:
        return await self._queues.redrive(dead_letter_queue, max_items, source_queue, may_redrive_to)

    def dequeues_waiting(self, queue: str) -> int:
        """Dequeues on ``queue`` waiting for items now (for the metrics and the tests)."""
        view = self._leader.views.get(queue)
        return view.waiting if view is not None else 0

    def queue_counts(self, queue: str) -> dict[str, int] | None:
        return self._queues.queue_counts(queue)

    def locked_count(self, queue: str) -> int | None:
        return self._queues.locked_count(queue)
