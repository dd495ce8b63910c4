"""TimedTable (rcq.server.core.retention) against a plain model of what it promises, and its cost.

The model keeps entries in a list in write order (a key written again moves to the back) and
forgets from the front; every answer of the table (get, len, items, make_room, has_room, expire,
what it reports forgotten) must be the model's, for any sequence of operations. Its cost per
forget over a long run is a benchmark's (``python -m bench.retention``), not a test's."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from rcq.server.core.retention import TimedTable


@dataclass(frozen=True)
class Value:
    at_ms: int


class Model:
    def __init__(self, retention_ms: int, retention_min_ms: int, entries_max: int) -> None:
        self.retention_ms, self.retention_min_ms, self.entries_max = retention_ms, retention_min_ms, entries_max
        self.entries: list[tuple[str, Value]] = []
        self.forgotten: list[str] = []

    def put(self, key: str, value: Value) -> None:
        self.entries = [e for e in self.entries if e[0] != key] + [(key, value)]

    def _forget(self, horizon_ms: int, count_max: int) -> None:
        while self.entries and count_max > 0 and self.entries[0][1].at_ms < horizon_ms:
            self.forgotten.append(self.entries.pop(0)[0])
            count_max -= 1

    def expire(self, now_ms: int) -> None:
        self._forget(now_ms - self.retention_ms, len(self.entries))

    def has_room(self, count: int, now_ms: int) -> bool:
        excess = len(self.entries) + count - self.entries_max
        if excess <= 0:
            return True
        return excess <= len(self.entries) and all(
            value.at_ms < now_ms - self.retention_min_ms for _, value in self.entries[:excess])

    def make_room(self, count: int, now_ms: int) -> bool:
        excess = len(self.entries) + count - self.entries_max
        if excess > 0:
            self._forget(now_ms - self.retention_min_ms, excess)
        return len(self.entries) + count <= self.entries_max


operations = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from("abcdefgh"), st.integers(0, 3)),  # key, time step
    st.tuples(st.just("expire"), st.just(""), st.integers(0, 30)),
    st.tuples(st.just("make_room"), st.just(""), st.integers(1, 4)),
    st.tuples(st.just("has_room"), st.just(""), st.integers(1, 4)),
    st.tuples(st.just("reload"), st.just(""), st.just(0)),
), max_size=80)


@settings(max_examples=400, deadline=None)
@given(operations, st.integers(1, 20), st.integers(0, 10), st.integers(1, 6))
def test_the_table_answers_what_a_list_in_write_order_answers(ops, retention_ms, retention_min_ms, entries_max):
    forgotten: list[str] = []
    table: TimedTable[Value] = TimedTable(retention_ms, retention_min_ms, entries_max, on_forget=forgotten.append)
    model = Model(retention_ms, retention_min_ms, entries_max)
    now = 0
    for op, key, number in ops:
        if op == "put":
            now += number
            table.put(key, Value(now))
            model.put(key, Value(now))
        elif op == "expire":
            table.expire(now + number)
            model.expire(now + number)
        elif op == "make_room":
            assert table.make_room(number, now) == model.make_room(number, now)
        elif op == "has_room":
            assert table.has_room(number, now) == model.has_room(number, now)
        else:  # a snapshot restore
            table.replace_all(iter(list(table.items())))
        assert list(table.items()) == model.entries
        assert len(table) == len(model.entries)
        assert all(table.get(k) == v and k in table for k, v in model.entries)
        assert forgotten == model.forgotten

