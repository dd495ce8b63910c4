"""The one rerun a Spark test gets (tests/spark/conftest.py marks every ``spark`` test with it).

Spark waits a fixed 10 s (not configurable in 4.3) for a Python worker it spawns to connect back,
and fails the job or query with :data:`WORKER_CONNECT_BACK` when one is slower: a cold
interpreter importing pyspark (0.6 s idle) on a machine overloaded by the suite's workers. Such a
test runs once more, and only for this message (docs/dependency-workarounds.md).

Must not import: a test module or a conftest.
"""

from __future__ import annotations

WORKER_CONNECT_BACK = r"Python worker failed to connect back"
WORKER_CONNECT_RERUNS = 1
