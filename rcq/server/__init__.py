"""The rcq server: ``pip install 'rcq[server]'``.

Its folders are its architecture, and ``tests/unit/test_module_rules.py`` enforces them:

* ``core/``   commands and the state machine: pure (no I/O, clock, randomness, concurrency);
* ``raft/``   the Replicator protocol and its pysyncobj implementation, with every workaround of a
  pysyncobj hazard (docs/raft-hazards.md), the start-up journal repair and the LMDB snapshots:
  the only place that imports pysyncobj or lmdb;
* ``leader/`` the leader's volatile side: transactions, dequeue locks, deadlines, group commit,
  its view of the queues;
* ``http/``   the HTTP API: pydantic wire models, operations, routes, the error middleware;
* ``config.py`` (NodeConfig) and ``node.py`` (the composition root).
"""
