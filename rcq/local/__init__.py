"""Local clusters: real rcq nodes as separate processes on this machine.

:class:`~rcq.local.cluster.LocalCluster` (with ``nodes``: the node processes, ``polls``: their
HTTP polls with deadlines, ``tls``: a throwaway CA for HTTPS clusters, ``releases``: a node of
another release of rcq) is product code: the launcher (``python -m cluster up``, what ``./run up``
and ``./run demo`` run) and ``rcq restore --local`` use it, and so do the tests, the chaos
harness and the benchmarks. What only tests need (the in-memory replicator, bounded waits) is in
:mod:`rcq.testing`.

The cluster needs the server extra: its nodes run ``rcq serve``, and it writes certificates
(cryptography) itself.
"""
