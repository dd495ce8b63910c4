"""The signature p0's leader puts on the PUT that creates a queue in a partition
(rcq.server.leader.placement): made for one queue in one partition, checked under the cluster
secret or a previous one, so a queue can be placed while a secret rotation is half done."""

from __future__ import annotations

from typing import Any

from rcq.server.config import NodeConfig
from rcq.server.leader.placement import placement_allowed, placement_token

OLD, NEW, OTHER = "o" * 32, "n" * 32, "x" * 32


def config(secret: str, previous: tuple[str, ...] = (), **overrides: Any) -> NodeConfig:
    return NodeConfig.model_validate({
        "node_id": "n1", "http_port": 0, "raft_address": "127.0.0.1:10001", "data_dir": "/nonexistent",
        "cluster_secret": secret, "cluster_secrets_previous": previous, **overrides})


def test_a_placement_is_signed_for_one_queue_in_one_partition() -> None:
    p1 = config(OLD, partition_name="p1")
    token = placement_token(config(OLD), "p1", "jobs")
    assert placement_allowed(p1, "jobs", token)
    assert not placement_allowed(p1, "other", token)
    assert not placement_allowed(config(OLD, partition_name="p2"), "jobs", token)
    assert not placement_allowed(p1, "jobs", None)
    assert not placement_allowed(config(OLD), "jobs", token)  # p0 takes no signed PUT


def test_during_a_rotation_either_shared_secret_signs_and_a_stranger_does_not() -> None:
    accepting_new = config(OLD, (NEW,), partition_name="p1")  # phase 1
    sealing_new = config(NEW, (OLD,), partition_name="p1")  # phase 2
    for signer in (OLD, NEW):
        token = placement_token(config(signer), "p1", "jobs")
        assert placement_allowed(accepting_new, "jobs", token) and placement_allowed(sealing_new, "jobs", token)
    assert not placement_allowed(config(NEW, partition_name="p1"), "jobs", placement_token(config(OLD), "p1", "jobs"))
    assert not placement_allowed(accepting_new, "jobs", placement_token(config(OTHER), "p1", "jobs"))
