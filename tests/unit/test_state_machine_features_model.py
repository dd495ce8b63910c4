"""The state machine's queue features against a plain reference model (hypothesis stateful test).

The model knows queues with settings (max_deliveries, dead-letter queue, max_priority, default TTL and
delay) and items with (value, priority, visible_at, expires_at, deliveries, dead info, enqueue time),
and applies docs/queue-features.md's rules at entry time. Every entry also goes to a twin replica and,
after a snapshot rule, to a machine restored from that snapshot: all must agree, and the state machine
must match the model after every step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import rcq.server.core.queue as queue_module
import rcq.server.core.state_machine as sm_module
from rcq.server.core.commands import (
    ITEM_ACTIONS,
    ApplyResult,
    Barrier,
    BarrierResult,
    BatchResult,
    CommitBatch,
    CommitUnit,
    EnqueuedRange,
    EnqueueOptions,
    ItemsAction,
    ItemsOutcome,
    QueueChange,
    QueueChangeResult,
    QueueSettings,
    TransactionWrite,
    UnitOutcome,
    encode,
)
from rcq.server.core.queue import ItemMeta, QueueStats
from rcq.server.core.state_machine import QueueStateMachine, ViewSeed, coalesce_ranges
from tests.helpers.state import assert_plain_meta, replicated_state, restored_copy

NAMES = ("a", "b", "c", "d")
PLAIN = ItemMeta()

options_strategy = st.none() | st.builds(
    EnqueueOptions,
    priority=st.integers(0, 8),
    delay_ms=st.none() | st.just(0) | st.integers(1, 2_000),
    ttl_ms=st.none() | st.integers(1, 4_000),
)
# settings that may be wrong in every way (range, unknown/self/cycle dead-letter queue)
settings_strategy = st.builds(
    QueueSettings,
    max_deliveries=st.none() | st.integers(1, 3) | st.sampled_from([1000, 1001, 5000]),
    dead_letter_queue=st.none() | st.sampled_from(NAMES) | st.just("zzz"),
    default_ttl_ms=st.none() | st.integers(1, 4_000),
    default_delay_ms=st.none() | st.just(0) | st.integers(1, 2_000),
    max_priority=st.none() | st.integers(0, 6) | st.sampled_from([255, 256, 999]),
)
# settings in range, without a dead-letter queue (the rules choose one that is valid)
valid_settings_strategy = st.builds(
    QueueSettings,
    max_deliveries=st.none() | st.integers(1, 3),
    default_ttl_ms=st.none() | st.integers(1, 4_000),
    default_delay_ms=st.none() | st.just(0) | st.integers(1, 1_000),
    max_priority=st.none() | st.integers(0, 6),
)
PICKS = st.lists(st.integers(0, 10_000), min_size=1, max_size=5)
ADVANCE = st.integers(0, 1_500)
QUEUE_PICK = st.integers(0, 999)  # mostly a queue that holds items (see busy_queue)


@dataclass
class MItem:
    item_id: int
    value: bytes
    meta: ItemMeta
    at_ms: int


@dataclass
class MQueue:
    settings: QueueSettings = field(default_factory=QueueSettings)
    items: list[MItem] = field(default_factory=list)  # id order
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QueueStats.TOTALS, 0))

    def find(self, item_id: int) -> MItem | None:
        return next((item for item in self.items if item.item_id == item_id), None)


class FeatureModel(RuleBasedStateMachine):
    @initialize(layout=st.lists(valid_settings_strategy, min_size=len(NAMES), max_size=len(NAMES)),
                dead_letter_queues=st.lists(st.sampled_from(NAMES[1:]) | st.none(), min_size=len(NAMES),
                                            max_size=len(NAMES)))
    def start(self, layout: list[QueueSettings], dead_letter_queues: list[str | None]) -> None:
        # enqueue-time boundaries are compacted after a handful, not thousands: this test reaches it
        self.compact_at = queue_module._TIMES_COMPACT_AT
        queue_module._TIMES_COMPACT_AT = 2
        self.sm = QueueStateMachine()
        self.twin = QueueStateMachine()
        self.restored: QueueStateMachine | None = None
        self.index = 0
        self.term = 1
        self.now = 0
        self.counter = 0
        self.queues: dict[str, MQueue] = {}
        self.next_id = 1
        assert self.apply(encode(Barrier(self.term, self.now))) == BarrierResult(self.term)
        # Queues configured from the start, each with a dead-letter queue later in NAMES (or none):
        # no cycle is possible, so every one is accepted.
        for position in reversed(range(len(NAMES))):
            target = dead_letter_queues[position]
            if target is not None and NAMES.index(target) <= position:
                target = None
            self.configure_valid(NAMES[position], replace(layout[position], dead_letter_queue=target))

    def configure_valid(self, queue: str, new_settings: QueueSettings) -> None:
        assert not self.settings_problems(queue, new_settings)
        result = self.apply(encode(QueueChange(self.term, self.now, queue, "configure", settings=new_settings)))
        assert result == QueueChangeResult("done", queue, "configure")
        self.queues.setdefault(queue, MQueue()).settings = new_settings

    # ------------------------------------------------------------ plumbing
    def apply(self, raw: Any) -> ApplyResult:
        self.index += 1
        result = self.sm.apply(raw, self.index)
        assert self.twin.apply(raw, self.index) == result
        if self.restored is not None:
            assert self.restored.apply(raw, self.index) == result
        return result

    def batch(self, units: list[CommitUnit | ItemsAction], now_ms: int, term: int | None = None) -> tuple[Any, ...]:
        result = self.apply(encode(CommitBatch(self.term if term is None else term, now_ms, tuple(units))))
        assert isinstance(result, BatchResult), result
        assert len(result.outcomes) == len(units)
        return result.outcomes

    def tick(self, advance: int, older: bool) -> int:
        """An entry time: later than every one so far, or (a leader whose clock is behind) earlier."""
        entry = max(0, self.now - advance) if older else self.now + advance
        self.now = max(self.now, entry)  # the state machine's time never goes back
        return entry

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def candidates(self, queue: str) -> list[int]:
        """Ids an action may name: mostly the queue's items, some elsewhere, some long gone."""
        here = [item.item_id for item in self.queues[queue].items] if queue in self.queues else []
        elsewhere = [item.item_id for name, q in sorted(self.queues.items()) if name != queue for item in q.items]
        return here * 3 + elsewhere[:3] + [1, self.next_id - 1, self.next_id + 5]

    def busy_queue(self, pick: int) -> str:
        """A queue holding items, mostly; any name (one may not exist) one time in five."""
        busy = [name for name in sorted(self.queues) if self.queues[name].items]
        if pick % 5 == 4 or not busy:
            return NAMES[pick % len(NAMES)]
        return busy[pick // 5 % len(busy)]

    def pick(self, queue: str, picks: list[int]) -> tuple[int, ...]:
        pool = self.candidates(queue)
        return tuple(pool[p % len(pool)] for p in picks)

    # ------------------------------------------------------------ the model's rules
    def model_append(self, queue_name: str, value: bytes, meta: ItemMeta) -> EnqueuedRange:
        queue = self.queues.setdefault(queue_name, MQueue())
        item_id = self.next_id
        self.next_id += 1
        queue.items.append(MItem(item_id, value, meta, self.now))
        queue.totals["enqueued_total"] += 1
        return EnqueuedRange(queue_name, item_id, 1, meta.priority, meta.visible_at_ms, meta.expires_at_ms)

    def enqueue_meta(self, queue_name: str, options: EnqueueOptions | None) -> ItemMeta:
        s = self.queues[queue_name].settings if queue_name in self.queues else QueueSettings()
        priority = min(options.priority if options else 0, s.max_priority or 0)
        delay = options.delay_ms if options and options.delay_ms is not None else s.default_delay_ms
        ttl = options.ttl_ms if options and options.ttl_ms is not None else s.default_ttl_ms
        return ItemMeta(priority=priority, visible_at_ms=self.now + delay if delay else 0,
                        expires_at_ms=None if ttl is None else self.now + ttl)

    def model_remove(self, queue: MQueue, item: MItem) -> None:
        queue.items.remove(item)

    def model_kill(self, queue_name: str, item: MItem, reason: str, note: str | None) -> EnqueuedRange | None:
        queue = self.queues[queue_name]
        queue.totals[{"expired": "expired_total", "rejected": "rejected_total",
                      "max_deliveries": "max_deliveries_total"}[reason]] += 1
        self.model_remove(queue, item)
        target_name = queue.settings.dead_letter_queue
        if target_name is None:
            queue.totals["dropped_total"] += 1
            return None
        queue.totals["dead_lettered_total"] += 1
        target = self.queues[target_name]  # a dead-letter queue in use cannot be deleted
        ttl = target.settings.default_ttl_ms
        meta = ItemMeta(priority=item.meta.priority, expires_at_ms=None if ttl is None else self.now + ttl,
                        dead_reason=reason, dead_source=queue_name, dead_deliveries=item.meta.deliveries,
                        dead_note=note)
        return self.model_append(target_name, item.value, meta)

    def model_redrive(self, queue_name: str, item: MItem) -> EnqueuedRange:
        queue = self.queues[queue_name]
        source_name = item.meta.dead_source
        assert source_name is not None
        source = self.queues.setdefault(source_name, MQueue())
        ttl = source.settings.default_ttl_ms
        meta = ItemMeta(priority=min(item.meta.priority, source.settings.max_priority or 0),
                        expires_at_ms=None if ttl is None else self.now + ttl)
        queue.totals["redriven_total"] += 1
        self.model_remove(queue, item)
        return self.model_append(source_name, item.value, meta)

    def model_action(self, action: ItemsAction) -> ItemsOutcome:
        queue = self.queues.get(action.queue)
        if queue is None:
            return ItemsOutcome("done", self.index, action.action, action.queue)
        acted: list[int] = []
        counts: list[int] = []
        dead: list[int] = []
        removed: list[int] = []
        moved: list[EnqueuedRange] = []
        limit = queue.settings.max_deliveries
        for item_id in dict.fromkeys(action.item_ids):
            item = queue.find(item_id)
            if item is None:
                continue
            meta = item.meta
            at_limit = limit is not None and meta.deliveries >= limit
            if action.action == "deliver":
                if not at_limit:
                    item.meta = replace(meta, deliveries=meta.deliveries + 1)
                    acted.append(item_id)
                    counts.append(item.meta.deliveries)
                    continue
                dead.append(item_id)
                reason = "max_deliveries"
            elif action.action == "dead_letter":
                if not at_limit:
                    continue
                acted.append(item_id)
                reason = "max_deliveries"
            elif action.action == "expire":
                if meta.expires_at_ms is None or meta.expires_at_ms > self.now:
                    continue
                acted.append(item_id)
                reason = "expired"
            elif action.action == "reject":
                acted.append(item_id)
                reason = "rejected"
            else:
                if meta.dead_reason is None:
                    continue
                acted.append(item_id)
                removed.append(item_id)
                moved.append(self.model_redrive(action.queue, item))
                continue
            removed.append(item_id)
            arrival = self.model_kill(action.queue, item, reason, action.note if action.action == "reject" else None)
            if arrival is not None:
                moved.append(arrival)
        return ItemsOutcome("done", self.index, action.action, action.queue, acted=tuple(acted),
                            counts=tuple(counts), dead=tuple(dead), removed=tuple(removed), moved=tuple(moved))

    def settings_problems(self, queue_name: str, s: QueueSettings) -> set[str]:
        problems = set()
        if s.max_deliveries is not None and not 1 <= s.max_deliveries <= 1000:
            problems.add("max_deliveries_out_of_range")
        if s.max_priority is not None and not 0 <= s.max_priority <= 255:
            problems.add("max_priority_out_of_range")
        target = s.dead_letter_queue
        if target == queue_name:
            problems.add("dead_letter_queue_self")
        elif target is not None and target not in self.queues:
            problems.add("dead_letter_queue_unknown")
        elif target is not None:
            hops = 0
            while target is not None:
                if target == queue_name:
                    problems.add("dead_letter_queue_cycle")
                    break
                target = self.queues[target].settings.dead_letter_queue
                hops += 1
                assert hops <= len(self.queues), "a cycle among existing queues"
        return problems

    # ------------------------------------------------------------ rules
    @rule(enqueues=st.lists(st.tuples(st.sampled_from(NAMES), st.lists(st.binary(max_size=3), min_size=1,
                                                                          max_size=3), options_strategy),
                            min_size=1, max_size=3),
          advance=ADVANCE, older=st.booleans())
    def enqueue(self, enqueues: list[tuple[str, list[bytes], EnqueueOptions | None]], advance: int,
                older: bool) -> None:
        entry = self.tick(advance, older)
        write = TransactionWrite(self.fresh("enq"), enqueues=tuple((q, tuple(v)) for q, v, _ in enqueues),
                                 enqueue_options=tuple(o for _, _, o in enqueues))
        (outcome,) = self.batch([CommitUnit((write,))], entry)
        expected = []
        for queue_name, values, options in enqueues:
            meta = self.enqueue_meta(queue_name, options)
            ranges = [self.model_append(queue_name, value, replace(meta)) for value in values]
            expected.append(EnqueuedRange(queue_name, ranges[0].first_item_id, len(values), meta.priority,
                                          meta.visible_at_ms, meta.expires_at_ms))
        assert outcome == UnitOutcome("committed", self.index, enqueued=tuple(expected))

    @rule(queue=st.sampled_from(NAMES), values=st.lists(st.binary(max_size=3), min_size=1, max_size=6),
          options=options_strategy, advance=ADVANCE)
    def produce(self, queue: str, values: list[bytes], options: EnqueueOptions | None, advance: int) -> None:
        """One enqueue of several items (the rules are chosen evenly: this keeps the queues filled)."""
        self.enqueue([(queue, values, options)], advance, False)

    @precondition(lambda self: any(q.items for q in self.queues.values()))
    @rule(queue_pick=QUEUE_PICK, count=st.integers(1, 4), times=st.integers(1, 3), advance=ADVANCE,
          then=st.sampled_from(["dead_letter", "reject", None]))
    def deliver_heads(self, queue_pick: int, count: int, times: int, advance: int, then: str | None) -> None:
        """What a leader does on a queue with max_deliveries: count deliveries of items it hands out,
        again and again for items that keep coming back; then the items at the limit die as their
        transaction aborts (or the transaction rejects them)."""
        queue = self.busy_queue(queue_pick)
        heads = tuple(item.item_id for item in self.queues[queue].items[:count]) if queue in self.queues else ()
        for kind in ["deliver"] * times + ([then] if then else []):
            action = ItemsAction(kind, queue, heads)  # type: ignore[arg-type]
            (outcome,) = self.batch([action], self.tick(advance, False))
            assert outcome == self.model_action(action)

    @precondition(lambda self: any(item.meta.expires_at_ms is not None and item.meta.expires_at_ms >= self.now
                                   for q in self.queues.values() for item in q.items))
    @rule(pick=st.integers(0, 999), early=st.booleans())
    def expire_at_its_time(self, pick: int, early: bool) -> None:
        """An expire entry whose time is exactly an item's expiry (it goes), or one ms earlier (it stays)."""
        due = [(name, item) for name, q in sorted(self.queues.items()) for item in q.items
               if item.meta.expires_at_ms is not None and item.meta.expires_at_ms >= self.now]
        name, item = due[pick % len(due)]
        assert item.meta.expires_at_ms is not None
        at = item.meta.expires_at_ms - 1 if early and item.meta.expires_at_ms > self.now else item.meta.expires_at_ms
        self.now = at
        action = ItemsAction("expire", name, tuple(i.item_id for i in self.queues[name].items))
        (outcome,) = self.batch([action], at)
        assert (item.item_id in outcome.acted) == (at == item.meta.expires_at_ms)
        assert outcome == self.model_action(action)

    @rule(queue_pick=QUEUE_PICK, advance=ADVANCE, older=st.booleans())
    def redrive_everything(self, queue_pick: int, advance: int, older: bool) -> None:
        """Redrive names every item of a queue; only the dead ones go back."""
        queue = self.busy_queue(queue_pick)
        ids = tuple(item.item_id for item in self.queues[queue].items) if queue in self.queues else ()
        action = ItemsAction("redrive", queue, ids)
        (outcome,) = self.batch([action], self.tick(advance, older))
        assert outcome == self.model_action(action)

    @precondition(lambda self: any(q.items for q in self.queues.values()))
    @rule(queue_pick=QUEUE_PICK, picks=PICKS, move_to=st.none() | st.sampled_from(NAMES), advance=ADVANCE)
    def commit_dequeue(self, queue_pick: int, picks: list[int], move_to: str | None, advance: int) -> None:
        queue = self.busy_queue(queue_pick)
        present = [item.item_id for item in self.queues[queue].items] if queue in self.queues else []
        if not present:
            return
        ids = tuple(dict.fromkeys(present[p % len(present)] for p in picks))
        entry = self.tick(advance, False)
        values = [self.queues[queue].find(i).value for i in ids]  # type: ignore[union-attr]
        enqueues = ((move_to, tuple(values)),) if move_to is not None else ()
        write = TransactionWrite(self.fresh("deq"), enqueues=enqueues, dequeues=((queue, ids),))
        (outcome,) = self.batch([CommitUnit((write,))], entry)
        model_queue = self.queues[queue]
        for item_id in ids:
            self.model_remove(model_queue, model_queue.find(item_id))  # type: ignore[arg-type]
        model_queue.totals["dequeued_total"] += len(ids)
        expected: tuple[EnqueuedRange, ...] = ()
        if move_to is not None:
            meta = self.enqueue_meta(move_to, None)
            ranges = [self.model_append(move_to, value, replace(meta)) for value in values]
            expected = (EnqueuedRange(move_to, ranges[0].first_item_id, len(values), meta.priority,
                                      meta.visible_at_ms, meta.expires_at_ms),)
        assert outcome == UnitOutcome("committed", self.index, enqueued=expected)

    @rule(kind=st.sampled_from(ITEM_ACTIONS), queue_pick=QUEUE_PICK, picks=PICKS,
          note=st.none() | st.sampled_from(["bad", "poison pill"]), advance=ADVANCE, older=st.booleans())
    def item_action(self, kind: str, queue_pick: int, picks: list[int], note: str | None, advance: int,
                    older: bool) -> None:
        queue = self.busy_queue(queue_pick)
        action = ItemsAction(kind, queue, self.pick(queue, picks), note)  # type: ignore[arg-type]
        entry = self.tick(advance, older)
        (outcome,) = self.batch([action], entry)
        assert outcome == self.model_action(action)

    @precondition(lambda self: self.queues)
    @rule(kinds=st.lists(st.sampled_from(ITEM_ACTIONS), min_size=1, max_size=4), picks=PICKS,
          queue_picks=st.lists(QUEUE_PICK, min_size=4, max_size=4), advance=ADVANCE)
    def several_actions_in_one_entry(self, kinds: list[str], picks: list[int], queue_picks: list[int],
                                     advance: int) -> None:
        """Grouped actions apply in order, each seeing what the ones before it did."""
        queues = [self.busy_queue(p) for p in queue_picks]
        entry = self.tick(advance, False)
        actions = [ItemsAction(kind, q, self.pick(q, picks)) for kind, q in zip(kinds, queues, strict=False)]  # type: ignore[arg-type]
        outcomes = self.batch(actions, entry)  # type: ignore[arg-type]
        assert list(outcomes) == [self.model_action(a) for a in actions]

    @rule(queue=st.sampled_from(NAMES), new_settings=settings_strategy, valid=valid_settings_strategy,
          pick=st.integers(0, 99), anything=st.booleans())
    def configure(self, queue: str, new_settings: QueueSettings, valid: QueueSettings, pick: int,
                  anything: bool) -> None:
        if not anything:
            # a valid change: a dead-letter queue (if any) among those that close no cycle
            allowed = [None] + [name for name in sorted(self.queues)
                                if not self.settings_problems(queue, replace(valid, dead_letter_queue=name))]
            self.configure_valid(queue, replace(valid, dead_letter_queue=allowed[pick % len(allowed)]))
            return
        problems = self.settings_problems(queue, new_settings)
        before = replicated_state(self.sm, "last_index")
        result = self.apply(encode(QueueChange(self.term, self.now, queue, "configure", settings=new_settings)))
        assert isinstance(result, QueueChangeResult)
        if problems:
            assert (result.status, result.queue, result.action) == ("rejected", queue, "configure")
            assert result.reason in problems, (result.reason, problems)
            assert replicated_state(self.sm, "last_index") == before
            return
        assert result == QueueChangeResult("done", queue, "configure")
        self.queues.setdefault(queue, MQueue()).settings = new_settings

    @rule(queue=st.sampled_from(NAMES), action=st.sampled_from(["purge", "delete"]), now=st.integers(0, 2))
    def purge_or_delete(self, queue: str, action: str, now: int) -> None:
        if now:
            return  # emptying queues one step in three is plenty
        before = replicated_state(self.sm, "last_index")
        result = self.apply(encode(QueueChange(self.term, self.now, queue, action)))  # type: ignore[arg-type]
        model_queue = self.queues.get(queue)
        users = [n for n, q in self.queues.items() if q.settings.dead_letter_queue == queue]
        if model_queue is None or (action == "delete" and users):
            reason = "queue_not_found" if model_queue is None else "queue_in_use"
            assert result == QueueChangeResult("rejected", queue, action, reason=reason)
            assert replicated_state(self.sm, "last_index") == before
            return
        assert result == QueueChangeResult("done", queue, action, removed=len(model_queue.items))
        if action == "delete":
            del self.queues[queue]
        else:
            model_queue.totals["purged_total"] += len(model_queue.items)
            model_queue.items.clear()

    @rule(advance=ADVANCE, older=st.booleans(), kind=st.sampled_from(ITEM_ACTIONS), queue_pick=QUEUE_PICK,
          picks=PICKS)
    def new_leader(self, advance: int, older: bool, kind: str, queue_pick: int, picks: list[int]) -> None:
        """A new leader's barrier; the deposed one's item actions still arrive after it, fenced."""
        queue = self.busy_queue(queue_pick)
        self.term += 1
        entry = self.tick(advance, older)
        assert self.apply(encode(Barrier(self.term, entry))) == BarrierResult(self.term)
        before = replicated_state(self.sm, "last_index", "now_ms")
        action = ItemsAction(kind, queue, self.pick(queue, picks))  # type: ignore[arg-type]
        (outcome,) = self.batch([action], self.now, term=self.term - 1)
        assert outcome == ItemsOutcome("rejected", self.index, kind, queue, reason="stale_leader")
        assert replicated_state(self.sm, "last_index", "now_ms") == before

    @rule(via=st.sampled_from(["json", "pickle", "direct"]))
    def restart_from_snapshot(self, via: str) -> None:
        assert_plain_meta(self.sm.snapshot_meta())
        self.restored = restored_copy(self.sm, via)
        assert self.restored.digest() == self.sm.digest()

    # ------------------------------------------------------------ invariants
    def expected_seed(self, queue: MQueue) -> ViewSeed:
        seed = ViewSeed({}, [], [], {}, [])
        by_priority: dict[int, list[int]] = {}
        limit = queue.settings.max_deliveries
        for item in queue.items:
            meta = item.meta
            if meta.expires_at_ms is not None:
                seed.expiring.append((meta.expires_at_ms, item.item_id))
            if meta.deliveries:
                seed.deliveries[item.item_id] = meta.deliveries
                if limit is not None and meta.deliveries >= limit:
                    seed.at_limit.append(item.item_id)
                    continue
            if meta.visible_at_ms > self.now:
                seed.delayed.append((meta.visible_at_ms, item.item_id, meta.priority))
            else:
                by_priority.setdefault(meta.priority, []).append(item.item_id)
        seed.ranges = {p: coalesce_ranges(ids) for p, ids in by_priority.items()}
        return seed

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "sm"):
            return
        sm = self.sm
        assert sm.now_ms == self.now
        assert sm.queue_names() == sorted(self.queues)
        items_total = bytes_total = 0
        for name in NAMES:
            queue = self.queues.get(name)
            if queue is None:
                assert sm.queue_stats(name) is None and sm.item_ids(name) == []
                continue
            ids = [item.item_id for item in queue.items]
            assert sm.item_ids(name) == ids
            assert sm.values(name, ids) == [item.value for item in queue.items]
            assert sm.item_meta(name, ids) == [(item.meta, item.at_ms) for item in queue.items]
            # plain items cost no metadata
            assert sorted(sm._queues[name].meta) == [item.item_id for item in queue.items if item.meta != PLAIN]
            assert sm.queue_features(name) == queue.settings
            size = sum(len(item.value) for item in queue.items)
            items_total += len(ids)
            bytes_total += size
            assert sm.queue_stats(name) == {
                "count": len(ids), "bytes": size, "cost_bytes": size + len(ids) * sm_module.ITEM_OVERHEAD_BYTES,
                "delayed": sum(1 for item in queue.items if item.meta.visible_at_ms > self.now),
                **queue.totals}
            assert sm.view_seed(name) == self.expected_seed(queue)
            assert sm.dead_items(name, 10_000) == [(item.item_id, item.meta.dead_source) for item in queue.items
                                                   if item.meta.dead_source is not None]
            # enqueue times cost a boundary per distinct entry time, pruned as the head moves
            own = sm._queues[name]
            boundary_ids, boundary_ms = own.time_boundaries()
            assert len(own._times_ids) == len(own._times_ms)
            assert all(x < y for x, y in itertools.pairwise(boundary_ids))
            assert all(x < y for x, y in itertools.pairwise(boundary_ms))
            if ids:
                assert boundary_ids and boundary_ids[0] <= sm._queues[name].items.first_id()
        sizes = sm.table_sizes()
        assert (sizes["items"], sizes["item_bytes"]) == (items_total, bytes_total)
        assert sm.snapshot_meta()["next_item_id"] == self.next_id

    @invariant()
    def every_item_is_in_exactly_one_place(self) -> None:
        if not hasattr(self, "sm"):
            return
        seen: dict[int, str] = {}
        for name, item_id, _ in self.sm.snapshot_items():
            assert item_id not in seen, f"item {item_id} in {seen[item_id]} and {name}"
            seen[item_id] = name
            assert 0 < item_id < self.next_id
        assert seen == {item.item_id: name for name, q in self.queues.items() for item in q.items}

    @invariant()
    def replicas_and_snapshots_agree(self) -> None:
        if not hasattr(self, "sm"):
            return
        digest = self.sm.digest()
        assert self.twin.digest() == digest
        if self.restored is not None:
            assert self.restored.digest() == digest

    def teardown(self) -> None:
        if not hasattr(self, "compact_at"):
            return
        try:
            if hasattr(self, "sm"):  # the final state survives a snapshot too
                restored = restored_copy(self.sm, "json")
                assert restored.digest() == self.sm.digest()
                for name in self.sm.queue_names():
                    assert restored.view_seed(name) == self.sm.view_seed(name)
        finally:
            queue_module._TIMES_COMPACT_AT = self.compact_at


# No explain phase: its tracing makes shrinking a failure of this long-running machine take minutes.
FeatureModel.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                          derandomize=True, suppress_health_check=list(HealthCheck),
                                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
TestFeatureModel = FeatureModel.TestCase
