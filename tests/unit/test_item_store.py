"""ItemStore against a plain dict: same answers whatever the sequence of appends and removals."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rcq.server.core import item_store
from rcq.server.core.item_store import ItemStore


class StoreModel(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.store = ItemStore()
        self.model: dict[int, bytes] = {}
        self.next_id = 1

    @rule(gap=st.sampled_from([0, 0, 0, 1, 5, item_store.GAP_MAX, item_store.GAP_MAX + 1, 5000]),
          size=st.sampled_from([0, 1, 100, 1000, item_store.BLOB_MAX + 1]), count=st.integers(1, 40))
    def append(self, gap: int, size: int, count: int) -> None:
        for _ in range(count):
            self.next_id += gap
            value = bytes([self.next_id % 251]) * size
            self.store.append(self.next_id, value)
            self.model[self.next_id] = value
            self.next_id += 1

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), how=st.sampled_from(["head", "tail", "any"]), count=st.integers(1, 60))
    def pop(self, data: st.DataObject, how: str, count: int) -> None:
        for _ in range(count):
            if not self.model:
                return
            ids = sorted(self.model)
            item_id = ids[0] if how == "head" else ids[-1] if how == "tail" else data.draw(st.sampled_from(ids))
            assert self.store.pop(item_id) == self.model.pop(item_id)

    @rule(item_id=st.integers(0, 10_000))
    def lookups(self, item_id: int) -> None:
        assert (item_id in self.store) == (item_id in self.model)
        assert self.store.get(item_id) == self.model.get(item_id)
        if item_id not in self.model:
            with pytest.raises(KeyError):
                self.store.pop(item_id)

    @rule()
    def clear(self) -> None:
        self.store.clear()
        self.model.clear()

    @invariant()
    def same_contents(self) -> None:
        if not hasattr(self, "store"):
            return
        assert len(self.store) == len(self.model)
        assert self.store.value_bytes == sum(len(v) for v in self.model.values())
        assert list(self.store.ids()) == sorted(self.model)
        assert self.store.first_id() == (min(self.model) if self.model else None)
        assert list(self.store.items()) == sorted(self.model.items())


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_ids_must_grow_even_after_everything_left():
    store = ItemStore()
    store.append(5, b"a")
    store.pop(5)
    with pytest.raises(ValueError):
        store.append(5, b"b")
    store.append(6, b"b")
    assert list(store.items()) == [(6, b"b")]


def test_a_mostly_dead_chunk_is_repacked_and_a_dead_one_released():
    store = ItemStore()
    for item_id in range(1, 1001):
        store.append(item_id, b"x" * 200)
    chunk = store._chunks[0]
    for item_id in range(2, 1001):
        if item_id != 700:
            store.pop(item_id)
    # 200 KB of values, 400 bytes live: repacked, it holds at most REPACK_MIN_BYTES of dead values
    assert len(chunk.blob) < item_store.REPACK_MIN_BYTES + 400
    assert store.get(1) == b"x" * 200 and store.get(700) == b"x" * 200
    store.pop(700)
    store.pop(1)
    assert len(store) == 0 and store.first_id() is None


def test_a_million_small_items_cost_a_few_bytes_each_besides_their_values():
    import tracemalloc

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = ItemStore()
    value = b"v" * 100
    for item_id in range(1, 200_001):
        store.append(item_id, value)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_item = used / 200_000
    assert per_item < 100 + 25, f"{per_item:.1f} bytes per 100-byte item"
