"""Where a partition is served: its ports on each member node, and its process's NodeConfig.

Partition number k (p1 is 1) takes two ports of a node's ``partition_ports``: HTTP at
``start + 2(k-1)``, Raft at the next one (docs/partitions.md). Clients and the other nodes reach it
at the same offsets of ``partition_advertise_ports`` (default: the same ports). A partition named
in the node's ``partition_port_map`` takes the ports given there instead, whatever its number. No
port is chosen at random, so a partition's addresses survive restarts, and every member can work
out every other's from a :class:`MemberPorts`.

:func:`partition_config` derives a partition process's NodeConfig from its node's: the node's
identity, secrets, tokens, TLS and tuning (``storage_bytes_max`` as is: it is the node's budget,
which the process shares with the node's other partitions); the partition's ports, data directory
(``<data_dir>/partitions/<name>.<number>``), members, and how many partitions its static share of
the budget is split between (docs/partitions.md, "Memory budget").

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from rcq.server.config import NodeConfig, PeerConfig
from rcq.server.core.directory import NO_RANGE, NodePorts

PARTITIONS_DIR = "partitions"


class PartitionPortsExhausted(ValueError):
    """The node's partition_ports range holds no ports for this partition number."""


def data_dir_name(name: str, number: int) -> str:
    """The folder of partition ``name``'s data under ``<data_dir>/partitions``: with its number,
    never reused, so a partition created anew under a deleted one's name starts empty."""
    return f"{name}.{number}"


def partitions_max(ports: tuple[int, int]) -> int:
    """How many partitions (beyond p0) a range of ports can serve."""
    return 0 if ports == NO_RANGE else (ports[1] - ports[0] + 1) // 2


def ports_of(ports: tuple[int, int], number: int, node_id: str = "this node") -> tuple[int, int]:
    """(HTTP port, Raft port) of partition ``number`` in ``ports``."""
    if number < 1:
        raise ValueError(f"partition number {number}: p0 is served by the node itself")
    if number > partitions_max(ports):
        raise PartitionPortsExhausted(
            f"partition number {number} needs ports {ports[0] + 2 * (number - 1)}-{ports[0] + 2 * number - 1}; "
            f"{node_id}'s partition_ports {ports[0]}-{ports[1]} hold {partitions_max(ports)} partitions")
    http_port = ports[0] + 2 * (number - 1)
    return http_port, http_port + 1


def with_port(url: str, port: int) -> str:
    """``url`` with its port replaced (scheme, host and path kept)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, parts.query, parts.fragment))


def host_of(address: str) -> str:
    """The host of ``host:port``."""
    return address.rsplit(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class MemberPorts:
    """Where one node serves its partitions, as the other nodes need to know it."""

    node_id: str
    raft_host: str  # the host of its raft_address
    url: str  # the URL it advertises for p0
    partition_ports: tuple[int, int]  # NO_RANGE: none
    partition_advertise_ports: tuple[int, int]
    named: tuple[tuple[str, int, int, int, int], ...] = ()  # (name, HTTP, Raft, advertised HTTP, advertised Raft)

    @classmethod
    def of(cls, config: NodeConfig) -> MemberPorts:
        if not config.serves_partitions:
            raise PartitionPortsExhausted(f"{config.node_id} has no partition_ports: it runs p0 only")
        ports = config.partition_ports or NO_RANGE
        named = tuple(sorted((name, *entry.ports()) for name, entry in config.partition_port_map.items()))
        return cls(config.node_id, host_of(config.raft_address), config.url, ports,
                   config.partition_advertise_ports or ports, named)

    def _ports(self, name: str, number: int, advertised: bool) -> tuple[int, int]:
        """(HTTP port, Raft port) of partition ``name`` (number ``number``) on this node: its named
        ports, else its pair of the range; as bound, or as others reach them."""
        entry = next((e for e in self.named if e[0] == name), None)
        if entry is not None:
            return (entry[3], entry[4]) if advertised else (entry[1], entry[2])
        if self.partition_ports == NO_RANGE:
            raise PartitionPortsExhausted(f"{self.node_id} has no partition_ports range and no ports named for {name}")
        return ports_of(self.partition_advertise_ports if advertised else self.partition_ports, number, self.node_id)

    def bound(self, name: str, number: int) -> tuple[int, int]:
        """(HTTP port, Raft port) that partition ``name`` (number ``number``) binds on this node."""
        return self._ports(name, number, advertised=False)

    def advertised(self, name: str, number: int) -> tuple[str, str]:
        """(HTTP URL, Raft address) of partition ``name`` on this node, as others reach it."""
        http_port, raft_port = self._ports(name, number, advertised=True)
        return with_port(self.url, http_port), f"{self.raft_host}:{raft_port}"


def partition_config(node: NodeConfig, name: str, number: int, members: Sequence[MemberPorts],
                     share_partitions: int = 1) -> NodeConfig:
    """The NodeConfig of partition ``name`` (number ``number``) on ``node``, whose members (this
    node among them) are ``members``; ``share_partitions``: the most partitions (p0 included) one
    of them hosts, which its budget is split between until p0's controller gives it a share."""
    own = [m for m in members if m.node_id == node.node_id]
    if len(own) != 1:
        raise ValueError(f"{node.node_id} is not a member of partition {name}")
    if len({m.node_id for m in members}) != len(members):
        raise ValueError(f"partition {name} names a member twice")
    me = MemberPorts.of(node)
    http_port, raft_port = me.bound(name, number)
    url, raft_address = me.advertised(name, number)
    bind_host = host_of(node.raft_bind_address or node.raft_address)
    peers = []
    peer_urls = {}
    for member in members:
        if member.node_id == node.node_id:
            continue
        peer_url, peer_raft = member.advertised(name, number)
        peers.append(PeerConfig(node_id=member.node_id, raft_address=peer_raft, http_url=peer_url))
        if member.node_id in node.peer_urls:  # reached between nodes at the ports it binds
            peer_urls[member.node_id] = with_port(node.peer_urls[member.node_id], member.bound(name, number)[0])
    fields = node.model_dump(exclude={"partition_ports", "partition_advertise_ports", "partition_port_map",
                                      "peers", "peer_urls", "partition_raft_dial_addresses",
                                      "raft_dial_addresses", "raft_bind_address", "advertise_url"})
    bind_address = f"{bind_host}:{raft_port}"
    fields.update(
        http_port=http_port, advertise_url=url, raft_address=raft_address,
        raft_bind_address=bind_address if bind_address != raft_address else None,
        peers=peers, peer_urls=peer_urls, data_dir=node.data_dir / PARTITIONS_DIR / data_dir_name(name, number),
        raft_dial_addresses=dict(node.partition_raft_dial_addresses),  # whole: stable when members change
        partition_name=name, storage_share_partitions=share_partitions)
    return NodeConfig.model_validate(fields)


def member_ports(entry: NodePorts) -> MemberPorts:
    """A member's ports as the directory recorded them."""
    return MemberPorts(entry.node_id, entry.raft_host, entry.url, entry.partition_ports, entry.partition_advertise_ports,
                       entry.named)


def reach_url(node: NodeConfig, member: MemberPorts, name: str, number: int) -> str:
    """Where ``node`` reaches partition ``name``'s (number ``number``) HTTP on ``member``: on
    itself, at the address it binds (loopback when it binds every address); on a peer, at its
    ``peer_urls`` entry's host with the port the peer binds, else at the URL the peer advertises."""
    http_port = member.bound(name, number)[0]
    if member.node_id == node.node_id:
        host = "127.0.0.1" if node.http_host in ("0.0.0.0", "::", "") else node.http_host
        scheme = "https" if node.tls_cert_file is not None else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{http_port}"
    if member.node_id in node.peer_urls:
        return with_port(node.peer_urls[member.node_id], http_port)
    return member.advertised(name, number)[0]


def partition_urls(node: NodeConfig, name: str, number: int, entries: Sequence[NodePorts]) -> list[str]:
    """Where ``node`` reaches partition ``name`` on each member (``entries``: their recorded ports)."""
    return [reach_url(node, member_ports(entry), name, number) for entry in entries]
