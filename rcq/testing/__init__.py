"""Test support shipped with rcq.

* :class:`InMemoryReplicator` (``rcq.testing.replicator``): the Replicator protocol in memory,
  so transactions, the HTTP API and the client are tested fast and deterministically;
* :func:`wait_until`, :func:`async_wait_until` and their :class:`WaitTimeout`: the bounded waits
  of :mod:`rcq.local.waits` (outside the test support, so that the product and the harnesses
  may wait with them too), re-exported here;
* real multi-process loopback clusters are product code, in :mod:`rcq.local` (the launcher uses
  them; so do the tests, chaos and the benchmarks).

Machinery only the project's own harnesses use lives beside them, outside the package: powerfs
in ``chaos/powerfs``, the Spark standalone cluster in ``bench/spark_standalone.py``.

``rcq.testing`` itself imports only the waits; the replicator is loaded on first use so that
a client-only install (no server extra) can still use the waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rcq.local.waits import WaitTimeout, async_wait_until, wait_until

if TYPE_CHECKING:
    from rcq.testing.replicator import InMemoryReplicator

__all__ = ["InMemoryReplicator", "WaitTimeout", "async_wait_until", "wait_until"]


def __getattr__(name: str) -> Any:
    if name == "InMemoryReplicator":
        from rcq.testing.replicator import InMemoryReplicator

        return InMemoryReplicator
    raise AttributeError(f"module 'rcq.testing' has no attribute {name!r}")
