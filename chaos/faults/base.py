"""What every kind of fault shares: the Fault a maker returns, the refusal a cluster may answer
with, and the state each part of the fault maker reads (the cluster, the leader to aim at).

Must not import: any rcq module; nor a target's module (targets are seen through chaos.target).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from chaos.target import ChaosTarget


@dataclasses.dataclass
class Fault:
    f: str
    nodes: list[int]
    stop: Callable[[], None]
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    outcome: dict[str, Any] = dataclasses.field(default_factory=dict)  # what stop() saw, for its history line
    stop_last: bool = False  # stopped after every other active fault (a re-add waits for the others' heal)


class FaultRefused(Exception):
    """The cluster would not take the fault (a membership change it refused, or no leader to ask):
    an outcome for the history (``f``, ``nodes``, ``details``), not a failure; nothing to stop."""

    def __init__(self, f: str, nodes: list[int], details: dict[str, Any]) -> None:
        super().__init__(f"{f} refused: {details.get('reason')}")
        self.f = f
        self.nodes = nodes
        self.details = details


class FaultKinds:
    """The state the parts of :class:`chaos.faults.maker.FaultMaker` share (it sets it): the
    cluster under test, and whether any other fault runs now."""

    cluster: ChaosTarget
    _others_active: Callable[[], bool]

    def _leader_or_any(self, rng: random.Random, among: list[int]) -> int | None:
        leader = self.cluster.leader()
        if leader is not None and leader in among:
            return leader
        return rng.choice(among) if among else None
