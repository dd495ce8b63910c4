"""rcq.server.core.commands: encode/decode round trips, and decode rejects garbage with MalformedCommand only."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rcq.server.core.commands import (
    COMMAND_VERSION,
    KIND_BARRIER,
    KIND_COMMIT,
    Barrier,
    CommitBatch,
    CommitUnit,
    MalformedCommand,
    TransactionWrite,
    decode,
    encode,
)
from tests.helpers.state import to_lists

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ strategies
ints = st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
texts = st.text(max_size=12)
transactions = st.builds(
    TransactionWrite,
    transaction_id=texts,
    enqueues=st.lists(st.tuples(texts, st.lists(st.binary(max_size=8), max_size=3).map(tuple)),
                      max_size=3).map(tuple),
    dequeues=st.lists(st.tuples(texts, st.lists(ints, max_size=3).map(tuple)), max_size=3).map(tuple),
)
units = st.builds(CommitUnit, transactions=st.lists(transactions, max_size=3).map(tuple),
                  idempotency_key=st.none() | texts)
batches = st.builds(CommitBatch, term=ints, now_ms=ints, units=st.lists(units, max_size=3).map(tuple))
barriers = st.builds(Barrier, term=ints, now_ms=ints)
commands = batches | barriers

PLAIN_LEAF_TYPES = (int, str, bytes, type(None))


def assert_plain(value: Any) -> None:
    """Only tuples of ints, str, bytes and None: readable by any later version, no pickled objects of ours."""
    if isinstance(value, tuple):
        for element in value:
            assert_plain(element)
    else:
        assert type(value) in PLAIN_LEAF_TYPES, f"{value!r} is not a plain value"


def decode_or_malformed(raw: Any) -> object:
    """decode may succeed or raise MalformedCommand; any other exception fails the test."""
    try:
        command = decode(raw)
    except MalformedCommand:
        return None
    assert isinstance(command, (Barrier, CommitBatch))
    return command


# ------------------------------------------------------------------ round trips
@FUZZ
@given(commands)
def test_decode_inverts_encode_for_every_command_type(command):
    raw = encode(command)
    assert decode(raw) == command
    assert type(decode(raw)) is type(command)


@FUZZ
@given(commands)
def test_an_encoded_command_is_made_of_plain_values_and_survives_pickle(command):
    raw = encode(command)
    assert_plain(raw)
    assert raw[0] == COMMAND_VERSION
    assert raw[1] == (KIND_BARRIER if isinstance(command, Barrier) else KIND_COMMIT)
    assert decode(pickle.loads(pickle.dumps(raw))) == command


@FUZZ
@given(commands)
def test_a_command_whose_tuples_became_lists_still_decodes_to_the_same_command(command):
    assert decode(to_lists(encode(command))) == command


def test_round_trip_examples_of_each_kind():
    barrier = Barrier(term=3, now_ms=1_700_000_000_000)
    assert decode(encode(barrier)) == barrier
    empty = CommitBatch(term=1, now_ms=0, units=())
    assert decode(encode(empty)) == empty
    full = CommitBatch(term=2, now_ms=5, units=(
        CommitUnit((TransactionWrite("t1", enqueues=(("a", (b"x", b"")),), dequeues=(("b", (1, 2)),)),
                    TransactionWrite("t2")), idempotency_key="k"),
        CommitUnit((TransactionWrite("t3", dequeues=(("a", (7,)),)),)),
    ))
    assert decode(encode(full)) == full


# ------------------------------------------------------------------ garbage
def commit(units_raw: Any) -> tuple[Any, ...]:
    return (COMMAND_VERSION, KIND_COMMIT, 1, 0, units_raw)


def tx(transaction_id: Any = "t", enqueues: Any = (), dequeues: Any = ()) -> tuple[Any, ...]:
    return (transaction_id, enqueues, dequeues)


def unit(*transactions: Any, key: Any = None) -> tuple[Any, ...]:
    return (key, transactions)


GARBAGE = {
    # not a command tuple at all
    "none": None,
    "int": 0,
    "float": 1.5,
    "empty_str": "",
    "str": "1barrier",
    "empty_bytes": b"",
    "empty_tuple": (),
    "empty_list": [],
    "empty_dict": {},
    "set": {1, 2},
    "object": object(),
    # version
    "version_2": (2, KIND_BARRIER, 1, 1),
    "version_0": (0, KIND_BARRIER, 1, 1),
    "version_str": ("1", KIND_BARRIER, 1, 1),
    "version_none": (None, KIND_BARRIER, 1, 1),
    "version_bool": (True, KIND_BARRIER, 1, 1),  # True == 1 must not pass for version 1
    "version_float": (1.0, KIND_BARRIER, 1, 1),
    # kind
    "unknown_kind": (COMMAND_VERSION, "compact", 1, 1),
    "kind_none": (COMMAND_VERSION, None, 1, 1),
    "kind_bytes": (COMMAND_VERSION, b"barrier", 1, 1),
    "kind_uppercase": (COMMAND_VERSION, "BARRIER", 1, 1),
    # truncated / overlong tuples
    "version_only": (COMMAND_VERSION,),
    "no_fields": (COMMAND_VERSION, KIND_BARRIER),
    "barrier_truncated": (COMMAND_VERSION, KIND_BARRIER, 1),
    "barrier_overlong": (COMMAND_VERSION, KIND_BARRIER, 1, 1, 1),
    "commit_truncated": (COMMAND_VERSION, KIND_COMMIT, 1, 1),
    "commit_overlong": (COMMAND_VERSION, KIND_COMMIT, 1, 1, (), ()),
    "unit_truncated": commit(((None,),)),
    "unit_overlong": commit(((None, (), ()),)),
    "transaction_truncated": commit((unit(("t", ())),)),
    "transaction_overlong": commit((unit(("t", (), (), (), (), ())),)),
    "enqueue_pair_truncated": commit((unit(tx(enqueues=(("q",),))),)),
    "dequeue_pair_truncated": commit((unit(tx(dequeues=(("q",),))),)),
    # wrong types for ints
    "term_bool": (COMMAND_VERSION, KIND_BARRIER, True, 1),
    "now_bool": (COMMAND_VERSION, KIND_BARRIER, 1, False),
    "term_float": (COMMAND_VERSION, KIND_BARRIER, 1.0, 1),
    "term_str": (COMMAND_VERSION, KIND_BARRIER, "1", 1),
    "term_none": (COMMAND_VERSION, KIND_BARRIER, None, 1),
    "commit_term_bool": (COMMAND_VERSION, KIND_COMMIT, False, 0, ()),
    "commit_now_bool": (COMMAND_VERSION, KIND_COMMIT, 1, True, ()),
    "commit_now_str": (COMMAND_VERSION, KIND_COMMIT, 1, "0", ()),
    "item_id_bool": commit((unit(tx(dequeues=(("q", (True,)),))),)),
    "item_id_float": commit((unit(tx(dequeues=(("q", (1.0,)),))),)),
    "item_id_str": commit((unit(tx(dequeues=(("q", ("1",)),))),)),
    "item_id_none": commit((unit(tx(dequeues=(("q", (None,)),))),)),
    # wrong containers
    "units_none": commit(None),
    "units_int": commit(3),
    "units_str": commit("units"),
    "unit_none": commit((None,)),
    "transactions_none": commit(((None, None),)),
    "transactions_int": commit(((None, 5),)),
    "transaction_none": commit((unit(None),)),
    "transaction_str": commit((unit("abc"),)),
    "enqueues_none": commit((unit(tx(enqueues=None)),)),
    "enqueues_bytes": commit((unit(tx(enqueues=b"q")),)),
    "dequeues_none": commit((unit(tx(dequeues=None)),)),
    "dequeue_ids_none": commit((unit(tx(dequeues=(("q", None),))),)),
    "dequeue_ids_int": commit((unit(tx(dequeues=(("q", 1),))),)),
    "enqueue_items_none": commit((unit(tx(enqueues=(("q", None),))),)),
    # iterable but not a sequence of the expected shape
    "dequeue_ids_bytes": commit((unit(tx(dequeues=(("q", b"\x05\x06"),))),)),  # not read as ids 5, 6
    "dequeue_ids_str": commit((unit(tx(dequeues=(("q", ""),))),)),
    "enqueue_items_dict": commit((unit(tx(enqueues=(("q", {b"x": 1}),))),)),
    "enqueues_dict": commit((unit(tx(enqueues={"q": (b"x",)})),)),
    "dequeues_dict": commit((unit(tx(dequeues={"q": (1,)})),)),
    "transactions_dict": commit(((None, {"t": ((), ())}),)),
    "units_dict": commit({None: ()}),
    "units_set": commit({1}),
    # non-bytes items
    "item_str": commit((unit(tx(enqueues=(("q", ("x",)),))),)),
    "item_bytearray": commit((unit(tx(enqueues=(("q", (bytearray(b"x"),)),))),)),
    "item_memoryview": commit((unit(tx(enqueues=(("q", (memoryview(b"x"),)),))),)),
    "item_none": commit((unit(tx(enqueues=(("q", (None,)),))),)),
    "item_int": commit((unit(tx(enqueues=(("q", (1,)),))),)),
    "items_as_one_bytes": commit((unit(tx(enqueues=(("q", b"xy"),))),)),
    # wrong types for strings
    "key_int": commit((unit(tx(), key=1),)),
    "key_bytes": commit((unit(tx(), key=b"k"),)),
    "transaction_id_none": commit((unit(tx(transaction_id=None)),)),
    "transaction_id_int": commit((unit(tx(transaction_id=7)),)),
    "transaction_id_bytes": commit((unit(tx(transaction_id=b"t")),)),
    "enqueue_queue_bytes": commit((unit(tx(enqueues=((b"q", (b"x",)),))),)),
    "enqueue_queue_none": commit((unit(tx(enqueues=((None, (b"x",)),))),)),
    "dequeue_queue_int": commit((unit(tx(dequeues=((1, (1,)),))),)),
}


@pytest.mark.parametrize("raw", list(GARBAGE.values()), ids=list(GARBAGE))
def test_decode_rejects_garbage_with_malformed_command(raw):
    with pytest.raises(MalformedCommand):
        decode(raw)


def test_malformed_command_is_a_value_error_with_a_message():
    with pytest.raises(ValueError, match="version"):
        decode((COMMAND_VERSION + 1, KIND_BARRIER, 1, 1))


# ------------------------------------------------------------------ fuzzing
leaves = (st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=3)
          | st.binary(max_size=3) | st.sampled_from([KIND_COMMIT, KIND_BARRIER, COMMAND_VERSION]))
nested = st.recursive(
    leaves,
    lambda children: (st.lists(children, max_size=4) | st.lists(children, max_size=4).map(tuple)
                      | st.dictionaries(st.integers(0, 4) | st.text(max_size=2), children, max_size=3)),
    max_leaves=20,
)
command_shaped = st.tuples(st.sampled_from([COMMAND_VERSION, 0, 2, True, "1"]),
                           st.sampled_from([KIND_COMMIT, KIND_BARRIER, "other", None]),
                           nested, nested, nested) | st.lists(nested, max_size=6).map(tuple)


@FUZZ
@given(nested | command_shaped)
def test_decode_of_random_values_raises_nothing_but_malformed_command(raw):
    decode_or_malformed(raw)


def paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    found = [prefix]
    if isinstance(value, tuple):
        for i, element in enumerate(value):
            found.extend(paths(element, (*prefix, i)))
    return found


def replace_at(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    return (*value[:head], replace_at(value[head], rest, new), *value[head + 1:])


def get_at(value: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        value = value[i]
    return value


WRONG_VALUES = [None, True, False, 0, -1, 1.5, "", "x", b"", b"x", (), (None,), [], {}, bytearray(b"x")]


@FUZZ
@given(commands, st.data())
def test_decode_of_a_mutated_command_raises_nothing_but_malformed_command(command, data):
    raw = encode(command)
    path = data.draw(st.sampled_from(paths(raw)), label="path")
    target = get_at(raw, path)
    mutations = ["replace"]
    if isinstance(target, tuple) and target:
        mutations += ["truncate", "extend"]
    mutation = data.draw(st.sampled_from(mutations), label="mutation")
    if mutation == "replace":
        new = data.draw(st.sampled_from(WRONG_VALUES), label="new")
    elif mutation == "truncate":
        new = target[: data.draw(st.integers(0, len(target) - 1), label="keep")]
    else:
        new = (*target, data.draw(st.sampled_from(WRONG_VALUES), label="extra"))
    mutated = replace_at(raw, path, new)
    decoded = decode_or_malformed(mutated)
    if decoded is not None:
        # whatever decode accepts must be a well-formed command that round-trips
        assert decode(encode(decoded)) == decoded
        assert_plain(encode(decoded))


@FUZZ
@given(commands)
def test_decode_of_a_truncated_command_is_malformed(command):
    raw = encode(command)
    for length in range(len(raw)):
        with pytest.raises(MalformedCommand):
            decode(raw[:length])


@FUZZ
@given(commands, st.sampled_from([True, False, 1.0, "1", None, b"1"]), st.sampled_from([2, 3]))
def test_decode_rejects_a_non_int_term_or_clock(command, bad, position):
    raw = encode(command)
    with pytest.raises(MalformedCommand):
        decode((*raw[:position], bad, *raw[position + 1:]))


def test_decoded_commands_are_json_friendly_after_encoding():
    command = CommitBatch(term=1, now_ms=2, units=(CommitUnit((TransactionWrite("t", dequeues=(("q", (1,)),)),)),))
    # no bytes here, so the encoded form must survive JSON (as lists)
    assert decode(json.loads(json.dumps(encode(command)))) == command
