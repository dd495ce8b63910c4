"""Processes seen through /proc, for the tests: rcq.local.processes, where the harness keeps them.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

from rcq.local.processes import children_of, partition_processes, process_alive

__all__ = ["children_of", "partition_processes", "process_alive"]
