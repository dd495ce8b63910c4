"""The Raft wire's AES-GCM seal: a key per connection and direction, between nodes that both offer it.

pysyncobj seals every Raft frame with Fernet (AES-CBC, HMAC-SHA256, base64, a timestamp) after
zlib, and opens each one the same way: ~30 µs to send and ~40 µs to receive a small frame on this
project's test machine, several times each per Raft entry on every node, where AES-GCM seals or
opens one in ~1.3 µs (docs/performance.md). A node of this version offers the faster seal in
the nonce it sends at the handshake (pysyncobj's ``recvRandKey``, 32 bytes whose content pysyncobj
never looks at): :data:`OFFER` and 24 random bytes. When both nonces of a connection carry the
offer, each side derives two keys from the cluster secret and the two nonces, one per direction,
and every frame after the nonces is::

    kind (1 byte: PLAIN or ZLIB) || AES-GCM(key of this direction, nonce = frame counter, aad = kind)

of the message pickled with protocol 5 (pysyncobj's frames: protocol 2; rcq.server.raft.transport_patches).

The counter is implicit (TCP delivers in order): a replayed, reordered, cut or altered frame does
not open, and the connection is closed, as pysyncobj closes one whose Fernet frame does not. A
node that does not offer (rcq 0.1, pysyncobj's own tools, a node with ``raft_fast_seal`` off or in
the middle of a secret rotation) gets Fernet frames, as before; Fernet frames are always read.
Fernet tokens begin with ``g`` (base64 of version 0x80), so the first byte tells the two apart.

Must not import: anything of rcq's; pysyncobj.
"""

from __future__ import annotations

import os
import zlib
from typing import TypeGuard

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

OFFER = b"rcqSeal2"  # the first bytes of an offering node's handshake nonce
NONCE_BYTES = 32  # pysyncobj's
PLAIN = 0x02  # the pickled message follows, sealed
ZLIB = 0x03  # zlib of the pickled message follows, sealed
SEALED_KINDS = frozenset((PLAIN, ZLIB))
# Raft frames are small (append entries of a few KB, acknowledgements) and queue payloads are often
# random or already compressed: only frames this large are worth zlib's ~8 µs per 2 KB.
COMPRESS_FROM_BYTES = 32 * 1024
COMPRESS_LEVEL = 1
# As costly to guess from a frame as pysyncobj's Fernet key (PBKDF2-HMAC-SHA256, 100,000 rounds),
# with a salt of its own: neither key can be computed from the other.
KDF_SALT = b"rcq raft wire seal 2"
KDF_ITERATIONS = 100_000
_KEY_LABEL = b"rcq raft seal 2 direction key"


def master_key(secret: str) -> bytes:
    """The key every connection's keys are derived from (once per node start: ~0.1 s of CPU)."""
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=KDF_SALT, iterations=KDF_ITERATIONS)
    return kdf.derive(secret.encode())


def offering_nonce() -> bytes:
    """A handshake nonce that offers the seal: 24 random bytes, as unguessable as a connection needs."""
    return OFFER + os.urandom(NONCE_BYTES - len(OFFER))


def offers(nonce: object) -> TypeGuard[bytes]:
    return type(nonce) is bytes and len(nonce) == NONCE_BYTES and nonce.startswith(OFFER)


def is_sealed(frame: bytes) -> bool:
    """Is ``frame`` (after its length) one of this seal's, rather than a Fernet token?"""
    return bool(frame) and frame[0] in SEALED_KINDS


def _direction_key(master: bytes, sender_nonce: bytes, receiver_nonce: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=_KEY_LABEL + sender_nonce + receiver_nonce).derive(master)


class Seal:
    """One connection's seal: its own nonce (the connection it belongs to), the key and counter of
    each direction. Not thread-safe: a connection is used by one thread at a time."""

    __slots__ = ("_received", "_receiving", "_sending", "_sent", "own_nonce")

    def __init__(self, master: bytes, own_nonce: bytes, peer_nonce: bytes) -> None:
        self.own_nonce = own_nonce
        self._sending = AESGCM(_direction_key(master, own_nonce, peer_nonce))
        self._receiving = AESGCM(_direction_key(master, peer_nonce, own_nonce))
        self._sent = 0
        self._received = 0

    def seal(self, data: bytes) -> bytes:
        kind = PLAIN
        if len(data) >= COMPRESS_FROM_BYTES:
            kind, data = ZLIB, zlib.compress(data, COMPRESS_LEVEL)
        header = bytes((kind,))
        nonce = self._sent.to_bytes(12, "big")
        self._sent += 1
        return header + self._sending.encrypt(nonce, data, header)

    def open(self, frame: bytes) -> bytes:
        """The data of the next frame; raises (cryptography's InvalidTag, ValueError) unless it is
        exactly the frame the peer sealed next on this connection."""
        kind = frame[0]
        if kind not in SEALED_KINDS:
            raise ValueError(f"not a sealed frame (kind {kind})")
        header = frame[:1]
        data = self._receiving.decrypt(self._received.to_bytes(12, "big"), frame[1:], header)
        self._received += 1
        return zlib.decompress(data) if kind == ZLIB else data
