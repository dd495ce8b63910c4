"""A partition's ports on each node, and the NodeConfig of its process (rcq.server.partitions.ports;
docs/partitions.md "Ports")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rcq.server.config import NodeConfig
from rcq.server.partitions.ports import (
    MemberPorts,
    PartitionPortsExhausted,
    partition_config,
    partitions_max,
    ports_of,
    with_port,
)

SECRET = "correct horse battery staple"


def node(i: int, **overrides: Any) -> NodeConfig:
    """node-i of a three-node loopback cluster: p0 on 800i (HTTP) and 900i (Raft), partitions in
    7i00-7i09 (five of them)."""
    fields: dict[str, Any] = dict(
        node_id=f"node-{i}", http_port=8000 + i, raft_address=f"127.0.0.1:{9000 + i}", cluster_secret=SECRET,
        data_dir=Path(f"/data/node-{i}"), partition_ports=f"7{i}00-7{i}09",
        peers=[{"node_id": f"node-{j}", "raft_address": f"127.0.0.1:{9000 + j}", "http_url": f"http://127.0.0.1:{8000 + j}"}
               for j in range(3) if j != i])
    fields.update(overrides)
    return NodeConfig.model_validate(fields)


def test_partition_k_takes_two_ports_from_the_start_of_the_range() -> None:
    assert partitions_max((7000, 7009)) == 5
    assert ports_of((7000, 7009), 1) == (7000, 7001)
    assert ports_of((7000, 7009), 5) == (7008, 7009)
    with pytest.raises(PartitionPortsExhausted, match="node-x's partition_ports 7000-7009 hold 5 partitions"):
        ports_of((7000, 7009), 6, "node-x")
    with pytest.raises(ValueError, match="p0 is served by the node itself"):
        ports_of((7000, 7009), 0)


def test_a_partitions_config_has_its_ports_data_dir_and_members_and_keeps_the_rest() -> None:
    nodes = [node(i, transactions_open_max=77) for i in range(3)]
    members = [MemberPorts.of(n) for n in nodes]
    config = partition_config(nodes[1], "p2", 2, members)
    assert (config.node_id, config.http_port, config.raft_address) == ("node-1", 7102, "127.0.0.1:7103")
    assert config.url == "http://127.0.0.1:7102" and config.raft_bind_address is None
    assert config.data_dir == Path("/data/node-1/partitions/p2.2")  # with its number, never reused
    assert [(p.node_id, p.raft_address, p.http_url) for p in config.peers] == [
        ("node-0", "127.0.0.1:7003", "http://127.0.0.1:7002"), ("node-2", "127.0.0.1:7203", "http://127.0.0.1:7202")]
    assert config.cluster_secret == SECRET and config.transactions_open_max == 77
    assert config.partition_ports is None  # a partition process runs no partitions of its own


def test_a_partitions_dial_addresses_are_its_nodes_partition_map_whole_and_not_p0s() -> None:
    dial = {"127.0.0.1:7003": "127.0.0.1:6001", "127.0.0.1:7001": "127.0.0.1:6002"}
    nodes = [node(i, raft_dial_addresses={"127.0.0.1:9000": "127.0.0.1:5000"}, partition_raft_dial_addresses=dial)
             for i in range(3)]
    config = partition_config(nodes[1], "p2", 2, [MemberPorts.of(n) for n in nodes])
    assert config.raft_dial_addresses == dial  # every entry: members may change, the config stays the same
    assert config.partition_raft_dial_addresses == {}
    assert partition_config(node(1), "p2", 2, [MemberPorts.of(node(i)) for i in range(3)]).raft_dial_addresses == {}


def test_published_ports_are_what_peers_and_clients_get_and_binds_stay_inside() -> None:
    """As in a container: every node binds 7010-7019 on 0.0.0.0 and publishes other host ports."""
    def container(i: int) -> NodeConfig:
        return node(i, http_host="0.0.0.0", insecure_http=True, advertise_url=f"http://127.0.0.1:{7001 + i}",
                    raft_address=f"rcq{i}:7100", raft_bind_address="0.0.0.0:7100", partition_ports="7010-7019",
                    partition_advertise_ports=f"7{i + 1}10-7{i + 1}19", peers=[],
                    peer_urls={f"node-{j}": f"http://rcq{j}:7000" for j in range(3)})
    nodes = [container(i) for i in range(3)]
    config = partition_config(nodes[0], "p1", 1, [MemberPorts.of(n) for n in nodes])
    assert config.http_port == 7010 and config.url == "http://127.0.0.1:7110"
    assert (config.raft_address, config.raft_bind_address) == ("rcq0:7111", "0.0.0.0:7011")
    assert [(p.raft_address, p.http_url) for p in config.peers] == [
        ("rcq1:7211", "http://127.0.0.1:7210"), ("rcq2:7311", "http://127.0.0.1:7310")]
    assert config.peer_urls == {"node-1": "http://rcq1:7010", "node-2": "http://rcq2:7010"}


def test_a_node_that_is_not_a_member_or_has_no_ports_gets_no_config() -> None:
    nodes = [node(i) for i in range(3)]
    with pytest.raises(ValueError, match="node-2 is not a member of partition p1"):
        partition_config(nodes[2], "p1", 1, [MemberPorts.of(n) for n in nodes[:2]])
    with pytest.raises(PartitionPortsExhausted, match="node-0 has no partition_ports"):
        MemberPorts.of(node(0, partition_ports=None))
    with pytest.raises(PartitionPortsExhausted, match="hold 5 partitions"):
        partition_config(nodes[0], "p6", 6, [MemberPorts.of(n) for n in nodes])


@pytest.mark.parametrize("overrides, message", [
    ({"partition_ports": "7000"}, "expected START-END"),
    ({"partition_ports": "7009-7000"}, "START below END"),
    ({"partition_ports": "0-9"}, "ports must be 1 to 65535"),
    ({"partition_ports": "7000-70000"}, "ports must be 1 to 65535"),
    ({"partition_ports": "7000-7008"}, "an even number of ports"),
    ({"partition_ports": "7000-7009", "partition_advertise_ports": "8000-8019"}, "as many ports as partition_ports"),
    ({"partition_ports": None, "partition_advertise_ports": "8000-8009"}, "needs partition_ports"),
    ({"partition_ports": "8000-8009"}, r"must not hold http_port \(8000\)"),
    ({"partition_ports": "8990-9009"}, r"must not hold raft_address's port \(9000\)"),
    ({"partition_port_map": {"p0": {"http": 7500, "raft": 7501}}}, "must not name p0"),
    ({"partition_port_map": {"Orders": {"http": 7500, "raft": 7501}}}, "should match pattern"),
    ({"partition_port_map": {"a": {"http": 7500, "raft": 7501}, "b": {"http": 7501, "raft": 7502}}},
     "ports of its own"),
    ({"partition_port_map": {"a": {"http": 7500, "raft": 7500}}}, "http and raft must differ"),
    ({"partition_port_map": {"a": {"http": 7005, "raft": 7501}}}, "7005 is in partition_ports"),
    ({"partition_port_map": {"a": {"http": 8000, "raft": 7501}}}, "must not hold port 8000"),
    ({"partition_port_map": {"a": {"http": 7500, "raft": 7501, "advertise_http": 1}}}, "go together"),
    ({"partition_port_map": {"a": {"http": 7500, "raft": 70000}}}, "less than or equal to 65535"),
])
def test_partition_ports_that_cannot_work_are_refused_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        node(0, **overrides)


def test_a_range_reads_from_text_or_a_pair_and_writes_as_text() -> None:
    assert node(0, partition_ports=[7000, 7009]).partition_ports == (7000, 7009)
    assert node(0).model_dump(mode="json")["partition_ports"] == "7000-7009"
    assert with_port("https://[::1]:8000/base", 7002) == "https://[::1]:7002/base"


def test_a_partition_named_in_the_port_map_takes_its_own_ports_whatever_its_number() -> None:
    """node-0 and node-1 name ports for "orders" (node-1 publishes others), node-2 takes the pair
    of its range; a node with named ports only serves nothing else."""
    named = {"orders": {"http": 7500, "raft": 7501}}
    nodes = [node(0, partition_port_map=named),
             node(1, partition_port_map={"orders": {"http": 7500, "raft": 7501, "advertise_http": 7600,
                                                    "advertise_raft": 7601}}),
             node(2)]
    members = [MemberPorts.of(n) for n in nodes]
    config = partition_config(nodes[0], "orders", 5, members)  # named: not 7008, the range's pair for 5
    assert (config.http_port, config.raft_address) == (7500, "127.0.0.1:7501")
    assert [(p.node_id, p.raft_address, p.http_url) for p in config.peers] == [
        ("node-1", "127.0.0.1:7601", "http://127.0.0.1:7600"), ("node-2", "127.0.0.1:7209", "http://127.0.0.1:7208")]
    assert config.partition_port_map == {} and config.partition_ports is None
    assert partition_config(nodes[0], "p1", 1, members).http_port == 7000  # others still take the range
    only_named = node(0, partition_ports=None, partition_port_map=named)
    assert only_named.serves_partitions and not node(0, partition_ports=None).serves_partitions
    assert MemberPorts.of(only_named).bound("orders", 4) == (7500, 7501)
    with pytest.raises(PartitionPortsExhausted, match="no partition_ports range and no ports named for p1"):
        MemberPorts.of(only_named).bound("p1", 1)


def test_rcq_serve_names_a_partitions_ports_on_the_command_line() -> None:
    from rcq.cli import build_parser

    args = build_parser().parse_args(["serve", "--partition-port", "orders=7500,7501",
                                      "--partition-port", "audit=7502,7503,17502,17503"])
    assert dict(args.partition_port) == {"orders": {"http": 7500, "raft": 7501},
                                         "audit": {"http": 7502, "raft": 7503, "advertise_http": 17502,
                                                   "advertise_raft": 17503}}
    assert node(0, partition_port_map=dict(args.partition_port)).partition_port_map["audit"].ports() == (
        7502, 7503, 17502, 17503)
    for bad in ("orders", "orders=7500", "orders=7500,x", "=7500,7501", "orders=1,2,3"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--partition-port", bad])
