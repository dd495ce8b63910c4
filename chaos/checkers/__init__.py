"""The chaos checkers, one module per concern; ``chaos.checker.check`` runs them all.

Each checker is ``check_x(history) -> dict`` with a ``"valid"`` key, counts
and at most 20 sample offenders per kind. Pure Python: imports nothing
from rcq.
"""
