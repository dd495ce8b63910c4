"""The OpenAPI description: every route documented, every documented route served, and a fuzz run
(schemathesis) against the leader of a live 3-node cluster: no 500, only documented statuses, and a
rejected request changes nothing (the state digest is the same before and after it)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from rcq.server.config import NodeConfig
from rcq.server.http.api import create_app
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import running_cluster

EXAMPLES_PER_OPERATION = 12  # bounded: the whole fuzz run stays near a minute on 2 cores
# A fuzzed dequeue's wait_ms may be anything up to the cap (30 s by default), and on an empty queue
# it is waited out in full (one example waited 15 s). The fuzz checks answers, not how long a long
# poll lasts: with a 1 s cap a longer wait is the documented 400 (which must change nothing) and
# shorter ones still long-poll.
FUZZED_NODE_SETTINGS = {"dequeue_wait_max_ms": 1000}
REJECTION_WINDOWS_MAX = 5  # a rejected request is sent at most this often to find a window without other entries


def test_every_route_is_documented_and_every_documented_route_is_served() -> None:
    config = NodeConfig(node_id="n1", http_port=0, raft_address="127.0.0.1:1", data_dir=Path("/nonexistent"),
                        insecure=True)
    replicator = InMemoryReplicator()
    app = create_app(config, TransactionManager(config, replicator, leader_url=lambda: None), replicator)
    served = {(route.method, route.resource.canonical) for route in app.router.routes()
              if route.method != "HEAD" and route.resource is not None}
    from rcq.server.http.openapi import openapi_spec

    spec = openapi_spec()
    documented = {(method.upper(), path) for path, methods in spec["paths"].items() for method in methods}
    assert served == documented
    assert spec["openapi"] == "3.1.0"
    # every request body refers to a schema that exists
    for methods in spec["paths"].values():
        for operation in methods.values():
            body = operation.get("requestBody")
            if body:
                ref = body["content"]["application/json"]["schema"]["$ref"]
                assert ref.rsplit("/", 1)[1] in spec["components"]["schemas"]


# Valid requests here change who leads: every later example would meet a follower. The route is
# exercised in tests/integration/test_membership.py.
NOT_FUZZED = {("POST", "/v1/cluster/leadership")}


def replicated_state(leader_url: str, headers: dict[str, str]) -> tuple[str, int]:
    """The leader's state digest and applied index (the digest covers the index: any entry moves it)."""
    answer = get_json(f"{leader_url}/v1/cluster/digest", headers)
    return answer["digest"], int(answer["applied_index"])


def get_json(url: str, headers: dict[str, str]) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.cluster
def test_fuzzing_a_live_cluster_finds_no_server_error_and_rejections_change_nothing() -> None:
    with running_cluster(overrides=FUZZED_NODE_SETTINGS) as cluster:
        leader_url = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))
        headers = cluster.auth_headers()  # the admin token: every route may be fuzzed, the digest read
        spec = get_json(f"{leader_url}/v1/openapi.json", headers)
        assert spec["servers"] == [{"url": leader_url}]
        schema = schemathesis.openapi.from_dict(spec)
        statuses: dict[str, set[int]] = {}
        for result in schema.get_all_operations():
            operation = result.ok()
            if (operation.method.upper(), operation.path) in NOT_FUZZED:
                continue
            documented = {int(code) for code in operation.definition.raw["responses"]}
            seen = statuses.setdefault(f"{operation.method.upper()} {operation.path}", set())
            fuzz_operation(operation, leader_url, headers, documented, seen)
        print({operation: sorted(codes) for operation, codes in sorted(statuses.items())})
        cluster.wait_for_convergence(CLUSTER_WAIT_S)


def fuzz_operation(operation: Any, leader_url: str, headers: dict[str, str], documented: set[int],
                   seen: set[int]) -> None:
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def fuzz(case: Any) -> None:
        before = replicated_state(leader_url, headers)
        response = case.call(base_url=leader_url, headers=headers, timeout=30)
        status = response.status_code
        seen.add(status)
        assert status != 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"
        assert status in documented, f"{case.method} {case.formatted_path} answered undocumented {status}"
        if 400 <= status < 500:
            # An entry applied meanwhile may be the cluster's own (a fuzzed item's delay or expiry
            # coming due commits one): the rejection is sent again until a window with no entry but
            # its own shows what it does. One that commits something moves the index every time.
            windows = [(before, replicated_state(leader_url, headers))]
            for _ in range(REJECTION_WINDOWS_MAX - 1):
                if windows[-1][0] == windows[-1][1]:
                    break
                again_before = replicated_state(leader_url, headers)
                again = case.call(base_url=leader_url, headers=headers, timeout=30)
                if 400 <= again.status_code < 500:  # (accepted now, the state having moved: no window)
                    windows.append((again_before, replicated_state(leader_url, headers)))
            assert windows[-1][0] == windows[-1][1], \
                f"rejected {case.method} {case.formatted_path} changed the state: {windows}"

    fuzz()
