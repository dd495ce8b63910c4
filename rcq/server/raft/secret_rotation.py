"""Rotating the cluster secret without downtime: a node that accepts older secrets too.

pysyncobj seals every Raft frame with one Fernet key derived from its ``password`` and opens
frames with the same key, so two nodes with different secrets cannot talk, and changing the
secret would mean stopping the whole cluster. While a node's ``SyncObj`` is built, the
encryptor it makes is replaced by a ``MultiFernet``: it still *seals* with the cluster secret but
*opens* frames sealed with that secret or any of ``cluster_secrets_previous``. pysyncobj uses
only ``encrypt_at_time``, ``extract_timestamp`` and ``decrypt``, which MultiFernet has; rcq's
own frame decoding (``transport_patches``) uses the same three.

A rotation is then three rolling restarts (docs/security.md): accept the new secret; seal with
the new one, accept the old; drop the old. At every moment each pair of nodes shares a secret
that one seals with and the other opens.

Must not import: anything of rcq's (pysyncobj and cryptography only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from cryptography.fernet import MultiFernet
from pysyncobj import syncobj as syncobj_module


@contextlib.contextmanager
def accepting_previous_secrets(previous: Sequence[str]) -> Iterator[None]:
    """Around ``SyncObj(...)``: its encryptor also opens frames sealed with ``previous`` secrets.
    Safe because pysyncobj makes its encryptor in the constructor, before any thread starts."""
    if not previous:
        yield
        return
    original = syncobj_module.getEncryptor

    def sealing_with_first(password: Any) -> MultiFernet:
        return MultiFernet([original(password), *(original(secret) for secret in previous)])

    syncobj_module.getEncryptor = sealing_with_first
    try:
        yield
    finally:
        syncobj_module.getEncryptor = original
