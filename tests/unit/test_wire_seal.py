"""The Raft wire's AES-GCM seal (rcq.server.raft.wire_seal): what opens and what does not."""

from __future__ import annotations

import os

import pytest
from cryptography.exceptions import InvalidTag

from rcq.server.raft import wire_seal
from rcq.server.raft.wire_seal import Seal, is_sealed, master_key, offering_nonce, offers

MASTER = master_key("a cluster secret of the tests")


def pair() -> tuple[Seal, Seal]:
    """Both ends of one connection."""
    dialling, accepting = offering_nonce(), offering_nonce()
    return Seal(MASTER, dialling, accepting), Seal(MASTER, accepting, dialling)


def test_frames_open_in_order_on_the_other_end_in_both_directions() -> None:
    a, b = pair()
    for i in range(3):
        assert b.open(a.seal(b"to b %d" % i)) == b"to b %d" % i
        assert a.open(b.seal(b"to a %d" % i)) == b"to a %d" % i


def test_a_small_frame_is_not_compressed_a_large_one_is() -> None:
    a, b = pair()
    small, large = b"x" * 100, b"y" * wire_seal.COMPRESS_FROM_BYTES
    sealed_small, sealed_large = a.seal(small), a.seal(large)
    assert sealed_small[0] == wire_seal.PLAIN and len(sealed_small) == 1 + len(small) + 16
    assert sealed_large[0] == wire_seal.ZLIB and len(sealed_large) < len(large) // 10
    assert (b.open(sealed_small), b.open(sealed_large)) == (small, large)


def test_an_altered_frame_does_not_open() -> None:
    a, b = pair()
    frame = bytearray(a.seal(b"payload"))
    frame[5] ^= 1
    with pytest.raises(InvalidTag):
        b.open(bytes(frame))


def test_a_frame_whose_kind_was_changed_does_not_open() -> None:
    """The kind byte is authenticated: a PLAIN frame relabelled ZLIB is refused, not decompressed."""
    a, b = pair()
    frame = a.seal(b"payload")
    with pytest.raises(InvalidTag):
        b.open(bytes((wire_seal.ZLIB,)) + frame[1:])


def test_a_replayed_or_reordered_frame_does_not_open() -> None:
    a, b = pair()
    first, second = a.seal(b"first"), a.seal(b"second")
    with pytest.raises(InvalidTag):
        b.open(second)  # out of order: the counter expected 0
    assert b.open(first) == b"first"
    with pytest.raises(InvalidTag):
        b.open(first)  # again: the counter expects 1 now
    assert b.open(second) == b"second"


def test_a_frame_sent_back_to_its_sender_does_not_open() -> None:
    """Each direction has its own key: a frame reflected to the node that sealed it is refused."""
    a, _b = pair()
    with pytest.raises(InvalidTag):
        a.open(a.seal(b"reflected"))


def test_another_connection_or_another_secret_does_not_open() -> None:
    a, _b = pair()
    _c, d = pair()
    with pytest.raises(InvalidTag):
        d.open(a.seal(b"for another connection"))
    other = master_key("another cluster's secret")
    dialling, accepting = offering_nonce(), offering_nonce()
    with pytest.raises(InvalidTag):
        Seal(other, accepting, dialling).open(Seal(MASTER, dialling, accepting).seal(b"x"))


def test_a_fernet_token_is_not_taken_for_a_sealed_frame() -> None:
    from cryptography.fernet import Fernet

    token = Fernet(Fernet.generate_key()).encrypt(b"pysyncobj's frame")
    assert not is_sealed(token) and not is_sealed(b"")
    a, _b = pair()
    assert is_sealed(a.seal(b"ours"))
    with pytest.raises(ValueError, match="not a sealed frame"):
        a.open(token)


def test_only_a_nonce_carrying_the_offer_offers() -> None:
    assert offers(offering_nonce())
    assert len(offering_nonce()) == 32 and offering_nonce() != offering_nonce()
    assert not offers(os.urandom(32))  # pysyncobj's own nonce (the offer by chance: 2**-64)
    assert not offers(wire_seal.OFFER + b"short")
    assert not offers(bytearray(offering_nonce()))
    assert not offers("127.0.0.1:5000")
