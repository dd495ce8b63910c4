"""What the chaos runner and nemesis need from a cluster under test: the ChaosTarget protocol.

Two targets implement it: :class:`chaos.cluster.ChaosCluster` (local processes, every link
through the fault-injecting proxy) and :class:`chaos.docker_cluster.DockerCluster`
(docker-compose.yml's project). The nemesis chooses its faults by capability, never by
class:

* :meth:`ChaosTarget.link_faults` — per-link faults (partitions of any shape, one-way
  drops, delay, loss, client-only cuts) on links named by :func:`raft_link` and
  :func:`client_link`; None when the target has no such control;
* :meth:`ChaosTarget.node_isolation` — whole nodes taken off the network and put back;
  None when the target does not offer it (with link faults it is not needed).

Restricted tokens (the workload's intruder) are a capability only some targets have, found by
name like the power failure: :func:`token_issuer` returns the target as a :class:`TokenIssuer`
(the local target: every node's tokens file) or None (docker: the nodes know the admin token of
the compose project only).

Membership changes (the ``membership`` nemesis) are another: :func:`membership_control` returns
the target as a :class:`MembershipControl` (the local target: a node removed and re-added keeps
its real Raft address and advertised URL, which its peers reach) or None (docker: each node
advertises its published host port, which the leader's health probe of a node to add cannot
reach from inside its container).

Node indices are 0-based and node ``i`` is ``node-i`` on every target.

Must not import: any rcq module, nor the targets (they import this).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from chaos.netproxy import LinkFault

# A node restarted while faults are in force, on a loaded 2-core machine, may take a while to
# answer HTTP; a start that takes this long has failed.
TARGET_START_TIMEOUT_S = 60.0


def raft_link(a: int, b: int) -> str:
    """The link carrying Raft between nodes ``a`` and ``b``; ``forward`` on it is from the
    greater index to the smaller (the greater dials, see chaos.cluster)."""
    dialler, acceptor = max(a, b), min(a, b)
    return f"raft:node-{dialler}->node-{acceptor}"


PARTITION_LINK_PREFIX = "raft-"


def partition_raft_link(number: int, dialler: int, acceptor: int) -> str:
    """The link carrying partition number ``number``'s Raft between nodes ``dialler`` and
    ``acceptor``; ``forward`` is dialler -> acceptor (the process whose Raft address is the
    greater string dials, as p0's nodes do: see chaos.cluster)."""
    return f"{PARTITION_LINK_PREFIX}{number}:node-{dialler}->node-{acceptor}"


class PartitionLinks(Protocol):
    """A target whose partitions' own Raft links go through its proxy (chaos.cluster)."""

    def partition_raft_links(self, a: int, b: int, number: int | None = None) -> list[tuple[str, int]]:
        """(link, dialler's index) of every partition's Raft link between nodes ``a`` and ``b``
        (only partition number ``number``'s when given)."""
        ...


def partition_links(cluster: object) -> PartitionLinks | None:
    """The target as :class:`PartitionLinks`, or None when its partitions' links are not proxied."""
    links = getattr(cluster, "partition_raft_links", None)
    return cast(PartitionLinks, cluster) if callable(links) and getattr(cluster, "partition_link_ports", None) else None


def client_link(i: int) -> str:
    """The link carrying clients' HTTP to node ``i``; ``forward`` is client -> node."""
    return f"client->node-{i}"


class LinkFaults(Protocol):
    """Per-link fault control (chaos.netproxy.ProxyThread is one)."""

    def set_faults(self, faults: dict[str, LinkFault]) -> None:
        """Set the fault of each named link at once (HEALTHY heals it)."""

    def stats(self) -> dict[str, dict[str, int]]:
        """Per link: connections accepted, bytes forwarded and dropped."""

    def reset(self, name: str) -> None:
        """Close every connection of a link now (requests in flight on them are cut)."""


class NodeIsolation(Protocol):
    """Whole-node partitions: a node off the network reaches no other node and no client."""

    def isolate_nodes(self, indices: Iterable[int]) -> None: ...

    def reconnect_nodes(self, indices: Iterable[int]) -> None: ...


class TokenIssuer(Protocol):
    """Adds a token of principal ``name`` with ``grants`` to what every node accepts, and returns
    it once the nodes accept it (rcq.local.cluster.LocalCluster.add_token)."""

    def add_token(self, name: str, grants: Iterable[Mapping[str, Any]] = ..., admin: bool = ...) -> str: ...


def token_issuer(cluster: object) -> TokenIssuer | None:
    """The target as a :class:`TokenIssuer`, or None when it cannot issue tokens."""
    return cast(TokenIssuer, cluster) if callable(getattr(cluster, "add_token", None)) else None


class MembershipControl(Protocol):
    """What the membership nemesis needs to remove a node and re-add it as itself
    (chaos.cluster.ChaosCluster)."""

    def member_identity(self, i: int) -> dict[str, str]:
        """Node ``i`` as ``POST /v1/cluster/members`` adds it: ``node_id``, ``raft_address`` (its
        real one, the identity its peers know) and ``url`` (the one it advertises)."""
        ...

    def admin_request(self, i: int, path: str, method: str = "GET", body: dict[str, Any] | None = None,
                      timeout_s: float = ...) -> dict[str, Any]:
        """Node ``i``'s JSON answer to ``method path`` (straight to it, with the admin token); an
        error status with a JSON body (``{"error": {...}}``) is an answer too. Raises OSError or
        ValueError when there is none."""
        ...


def membership_control(cluster: object) -> MembershipControl | None:
    """The target as a :class:`MembershipControl`, or None when it cannot change membership."""
    return cast(MembershipControl, cluster) if callable(getattr(cluster, "member_identity", None)) else None


class TargetNode(Protocol):
    @property
    def node_id(self) -> str: ...

    @property
    def paused(self) -> bool: ...

    def running(self) -> bool: ...


@runtime_checkable
class ChaosTarget(Protocol):
    """A cluster the chaos harness can start, hurt, heal, observe and close."""

    @property
    def target(self) -> str:
        """Its ``--target`` name, for messages and results."""

    @property
    def nodes(self) -> Sequence[TargetNode]: ...

    @property
    def base_dir(self) -> Path: ...

    @property
    def client_urls(self) -> list[str]:
        """The URLs the workload's clients use (through the proxy, when there is one)."""

    @property
    def node_urls(self) -> list[str]:
        """Each node's own HTTP URL, past any proxy: what the intruder floods unread (a proxy that
        drops a link's bytes would read them for the node, and hide whether the node stops reading)."""

    @property
    def token(self) -> str | None:
        """The admin token of the cluster: the workload's clients, the drain and the harness's own
        polls (digests, snapshots) send it. None when the nodes need none."""

    # ------------------------------------------------------------- lifecycle
    def start(self, timeout_s: float | None = None) -> None:
        """Start every node and wait until each answers HTTP."""

    def start_node(self, i: int, wait: bool = True, timeout_s: float | None = None) -> object: ...

    def kill_node(self, i: int) -> object:
        """kill -9 (or what the target has closest to it); the node stays down until started."""

    def pause_node(self, i: int) -> None: ...

    def resume_node(self, i: int) -> None: ...

    def wipe_node(self, i: int) -> None:
        """Delete a stopped node's data; its next start begins empty."""

    def heal(self, timeout_s: float | None = None) -> list[int]:
        """Every link healed, every node reconnected, resumed and started; returns those started."""

    def close(self) -> None:
        """Stop everything the target started (logs are kept)."""

    # ------------------------------------------------------------- views
    def live_indices(self) -> list[int]:
        """Nodes running, not paused and reachable: the only ones polled."""

    def running_indices(self) -> list[int]: ...

    def leader(self) -> int | None:
        """The serving leader a majority names, from one poll; None when there is none now."""

    def status(self, i: int, timeout_s: float = ...) -> dict[str, Any]: ...

    def statuses(self, indices: Sequence[int] | None = None) -> dict[int, dict[str, Any]]: ...

    def digests(self, indices: Sequence[int] | None = None) -> dict[int, dict[str, Any]]: ...

    def request_snapshot(self, i: int, timeout_s: float = ...) -> dict[str, Any]: ...

    def unexpected_exits(self) -> Mapping[int, int | None]: ...

    # ------------------------------------------------------------- waits (bounded)
    def wait_for_http(self, indices: Iterable[int] | None = None, timeout_s: float | None = None) -> None: ...

    def wait_for_leader(self, timeout_s: float = ...) -> int: ...

    def wait_for_applied(self, timeout_s: float = ...) -> int: ...

    def wait_for_convergence(self, timeout_s: float = ...,
                             indices: Iterable[int] | None = None) -> dict[str, Any]: ...

    # ------------------------------------------------------------- logs
    def log_paths(self) -> list[Path]: ...

    def log_tail(self, i: int) -> str: ...

    # ------------------------------------------------------------- capabilities
    def link_faults(self) -> LinkFaults | None: ...

    def node_isolation(self) -> NodeIsolation | None: ...
