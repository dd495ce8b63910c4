"""Test support shipped with rcq.

* :class:`InMemoryReplicator` (``rcq.testing.replicator``): the Replicator protocol in memory,
  so transactions, the HTTP API and the client are tested fast and deterministically;
* :func:`wait_until` (``rcq.testing.waits``): poll a condition with a deadline, never a bare sleep;
* ``rcq.testing.cluster`` (with ``nodes`` and ``polls``): real multi-process loopback clusters,
  the one harness of the tests, chaos, the benchmark and the launcher; ``rcq.testing.tls``: a
  throwaway CA for HTTPS clusters;
* ``rcq.testing.spark_standalone``: a Spark standalone master and worker (separate JVMs from
  the pyspark package) for the connector's tests, example and bench; ``rcq.testing.powerfs``:
  the FUSE filesystem that loses unsynced writes (the power nemesis).

``rcq.testing`` itself imports only the waits; the replicator is loaded on first use so that
a client-only install (no server extra) can still use the waits. The cluster harness needs the
server extra: its nodes run ``rcq serve``, and it writes tokens files (pydantic) and test
certificates (cryptography) itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rcq.testing.waits import wait_until

if TYPE_CHECKING:
    from rcq.testing.replicator import InMemoryReplicator

__all__ = ["InMemoryReplicator", "wait_until"]


def __getattr__(name: str) -> Any:
    if name == "InMemoryReplicator":
        from rcq.testing.replicator import InMemoryReplicator

        return InMemoryReplicator
    raise AttributeError(f"module 'rcq.testing' has no attribute {name!r}")
