"""The local chaos target: rcq's loopback cluster harness with the proxy in front of every link.

:class:`ChaosCluster` is :class:`rcq.local.cluster.LocalCluster` (node processes, their
files, kill -9 / SIGSTOP / wipe, the HTTP polls and bounded waits) plus only what chaos
adds: its own fault-injecting proxy (chaos.netproxy) on every Raft link and every client
link, nodes configured with the proxy's addresses, and node settings that make faults
matter. The harness's own status polls go straight to the nodes' HTTP ports, so a client
partition never blinds the checker.

**Raft through the proxy.** pysyncobj keeps one TCP connection per pair of nodes. Only the
node whose own address (``host:port`` string) is *greater* dials
(``TCPTransport._shouldConnect``), and its first message is its own address, which the
accepting node looks up in its peer list to learn who is calling. Every node is known to every
other by its real ``raft_address`` (its identity, the one membership changes replicate), and a
node dials each smaller node ``j`` through the proxy link ``raft:node-i->node-j``: its
``raft_dial_addresses`` maps ``j``'s address to that link's port. Raft ports are the ``n``
greatest (as strings) of one pool of free ports, in node order, so node ``i`` dials exactly the
nodes below it; the smaller ports go to HTTP and the links. Client traffic reaches node ``i``
through ``client->node-i``; every node advertises that URL, so the leader URLs nodes give clients
go through the proxy too.

**Partitions' own Raft links** (``partitions`` > 1): each partition process dials its peers
through the proxy too, one link per partition number and pair of nodes
(``raft-<number>:node-i->node-j``, :meth:`ChaosCluster.partition_raft_links`), wired by the node
setting ``partition_raft_dial_addresses``, which a node copies into each partition process's
``raft_dial_addresses``. Network faults between two nodes cut their partitions' links as well
as p0's; ``isolate-partition-member`` cuts one partition's links around one member only.

**Membership changes** (the ``membership`` nemesis) remove existing nodes and re-add each as
itself: same node id, same real Raft address, its advertised URL (:meth:`ChaosCluster.member_identity`),
so the proxy links made at start stay right. New nodes (``add_node``) are refused: the links are
made for the first nodes only.

**Two releases** (the ``upgrade`` nemesis): given ``previous_release`` (a release of rcq from the
repository's history, :mod:`rcq.local.releases`), the nodes start as the code under test and the
nemesis restarts one at a time into that release and back (:meth:`LocalCluster.restart_node_as`,
which writes an old node only the config fields its release knows; ``raft_dial_addresses``, the
proxy's wiring, is one of them). A killed or power-cut node restarts into the release it ran.

**Tokens.** The nodes require API tokens, as a production cluster does (LocalCluster's
default): the workload's clients, the drain and the harness's own polls all send the cluster's
admin token (:attr:`ChaosTarget.token <chaos.target.ChaosTarget.token>`).

**Power failures** (``power_fs=True``, the ``power`` nemesis): each node's data directory is
its own powerfs mount (chaos.powerfs: a disk whose writes not made durable live in memory
only), so :meth:`ChaosCluster.lose_power` of one node drops that node's unsynced data and no
other's. It kills the node and everything it forked, waits until none of them is left running
(a dying process writes its dirty mmap pages back as it exits), then cuts. A wipe on such a
disk is made durable (a new, empty disk). The mounts are closed after the nodes stop; the
data on them is gone then (the logs are outside them).

**Stalled disks** (``power_fs=True``, the ``disk-stall`` nemesis): :meth:`ChaosCluster.stall_disk`
makes every sync on one node's mount hang until :meth:`ChaosCluster.release_disk`; the heal and
the close release every disk first (a node killed while its sync hangs exits only once released).

Must not import: any rcq module but rcq.client, rcq.errors and rcq.testing's cluster harness.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, Self

from chaos.netproxy import HOST, ProxyThread
from chaos.powerfs import PowerFSError, PowerMount, close_all
from chaos.target import TARGET_START_TIMEOUT_S, client_link, partition_raft_link, raft_link
from rcq.local.cluster import LocalCluster
from rcq.local.nodes import STOP_TIMEOUT_S, LocalNode, free_ports
from rcq.local.polls import POLL_TIMEOUT_S
from rcq.local.releases import PREVIOUS_RELEASE, PREVIOUS_RELEASE_NAME, Release, materialise
from rcq.local.waits import wait_until

log = logging.getLogger(__name__)

PORT_ALLOCATION_ATTEMPTS = 5
POLL_INTERVAL_S = 0.1  # the harness's polls share two cores with the nodes and the workload

# Nodes tuned so that faults matter: short transaction deadlines (vanished clients give their
# items back quickly) and snapshots every few hundred entries or seconds, so log compaction and
# snapshot installs happen *during* faults.
CHAOS_NODE_OVERRIDES: dict[str, Any] = {
    "transaction_timeout_default_s": 10.0,
    "log_compaction_entries_min": 200,
    "log_compaction_interval_s": 5.0,
    "commit_timeout_s": 5.0,
}


def previous_release(directory: Path) -> Release:
    """The previous release of rcq (rcq.local.releases.PREVIOUS_RELEASE) made runnable in
    ``directory`` from this repository's history, for the ``upgrade`` nemesis. Raises
    rcq.local.releases.ReleaseUnavailable, naming the commit, when the history does not hold it
    (a shallow clone, an exported tree)."""
    return materialise(PREVIOUS_RELEASE, directory, PREVIOUS_RELEASE_NAME)


def address(port: int) -> str:
    return f"{HOST}:{port}"


def groups_running(pgids: set[int]) -> set[int]:
    """Those of the process groups ``pgids`` in which a process still runs (zombies have
    finished exiting: their mappings are closed and their dirty pages written back)."""
    running: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as stat_file:
                fields = stat_file.read().rpartition(")")[2].split()
        except OSError:  # it exited while we looked
            continue
        if len(fields) > 2 and int(fields[2]) in pgids and fields[0] not in ("Z", "X"):
            running.add(int(fields[2]))
    return running


BALANCE_HOLD_S = 5.0  # the leader balancer's hold in a chaos run (60 s by default): it acts during faults
LIFECYCLE_PARTITIONS_MAX = 24  # partitions the partition-lifecycle nemesis may create in one run


class ChaosCluster(LocalCluster):
    """``nodes`` rcq processes on 127.0.0.1, wired through a proxy of their own (seeded with
    ``seed``, closed with the cluster); see the module docstring. ``base_dir`` None: a
    temporary directory, kept on close (a chaos run's logs are evidence). ``previous_release``:
    the release the ``upgrade`` nemesis restarts nodes into (None: that nemesis cannot run)."""

    target = "local"
    start_timeout_s = TARGET_START_TIMEOUT_S
    poll_interval_s = POLL_INTERVAL_S

    def __init__(self, nodes: int, seed: int = 0, base_dir: Path | None = None,
                 node_overrides: dict[str, Any] | None = None, log_level: str = "INFO", *,
                 power_fs: bool = False, previous_release: Release | None = None, partitions: int = 1) -> None:
        self.previous_release = previous_release
        self.partitions_count = partitions
        self.proxy = ProxyThread(seed)
        self.raft_proxy_ports: dict[tuple[int, int], int] = {}  # (dialler, acceptor) -> link port
        # (partition number, dialler, acceptor) -> link port: every partition's own Raft links
        self.partition_link_ports: dict[tuple[int, int, int], int] = {}
        self.client_ports: list[int] = []  # the link port in front of each node's HTTP port
        self.power_mounts: list[PowerMount] = []  # node i's data directory, with power_fs
        try:
            # With partitions: the balancer moves leaders during the run (a short hold), and each node
            # has ports for the partitions the partition-lifecycle nemesis creates (numbers are never reused).
            partitioned = {"balance_hold_s": BALANCE_HOLD_S} if partitions > 1 else {}
            super().__init__(nodes, base_dir,
                             node_overrides={**CHAOS_NODE_OVERRIDES, **partitioned, **(node_overrides or {})},
                             log_level=log_level, keep=True,
                             partitions_max=partitions - 1 + (LIFECYCLE_PARTITIONS_MAX if partitions > 1 else 0))
            if "raft_ticks_on_loop" not in (node_overrides or {}):
                # Both ways of ticking Raft in one cluster: node 0 on pysyncobj's own tick thread,
                # the others on their event loop (rcq.server.raft.loop_ticker, the default).
                self.set_node_override(0, raft_ticks_on_loop=False)
            if "raft_fast_seal" not in (node_overrides or {}) and nodes > 1:
                # Both seals of the Raft wire: node 1's connections stay Fernet, the others' are
                # AES-GCM (rcq.server.raft.wire_seal, the default).
                self.set_node_override(1, raft_fast_seal=False)
            if power_fs:
                for node in self.nodes:
                    node.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                    self.power_mounts.append(PowerMount(node.data_dir, log_path=node.directory / "powerfs.log"))
        except BaseException:
            close_all(self.power_mounts)
            self.proxy.close()
            raise

    @classmethod
    def reopen(cls, base_dir: Path, log_level: str = "INFO") -> NoReturn:
        # The proxy's link ports die with it: the saved configs point at ports nobody serves.
        raise TypeError("a chaos cluster cannot be reopened: its proxy links are gone")

    # ------------------------------------------------------------- wiring
    def allocate_ports(self, count: int) -> tuple[list[int], list[int]]:
        http_ports, raft_ports = self._link_raft(count)
        self.client_ports = [self.proxy.add_link(client_link(i), http_ports[i]) for i in range(count)]
        return http_ports, raft_ports

    def _link_raft(self, count: int) -> tuple[list[int], list[int]]:
        """Pick the ports and add a proxy link for every pair of nodes: (HTTP ports, Raft ports)."""
        pairs = [(i, j) for i in range(count) for j in range(i)]
        for attempt in range(PORT_ALLOCATION_ATTEMPTS):
            pool = sorted(free_ports(2 * count + len(pairs)), key=address)
            raft_ports, rest = pool[-count:], pool[:-count]  # the greatest addresses: they dial
            http_ports, link_ports = rest[:count], rest[count:]
            try:
                for (i, j), port in zip(pairs, link_ports, strict=True):
                    self.proxy.add_link(raft_link(i, j), raft_ports[j], port)
                    self.raft_proxy_ports[(i, j)] = port
            except OSError:  # a port was taken between the probe and the bind: pick again
                for i, j in self.raft_proxy_ports:
                    self.proxy.remove_link(raft_link(i, j))
                self.raft_proxy_ports.clear()
                if attempt + 1 == PORT_ALLOCATION_ATTEMPTS:
                    raise
                continue
            for i, j in self.raft_proxy_ports:
                assert address(raft_ports[i]) > address(raft_ports[j]), "node i would not dial node j"
            return http_ports, raft_ports
        raise AssertionError("not reached: the last attempt returns or raises")

    def advertised_url(self, i: int) -> str:
        return f"{self.nodes[i].scheme}://{HOST}:{self.client_ports[i]}"

    def _node_config(self, node: LocalNode, peers: Sequence[int] | None = None) -> dict[str, Any]:
        config = super()._node_config(node, peers)
        # I dial the nodes below me through the proxy; they know me by my real address.
        config["raft_dial_addresses"] = {self.nodes[j].raft_address: address(self.raft_proxy_ports[(node.index, j)])
                                         for j in range(node.index)}
        if self.partitions_max:  # and my partition processes dial theirs through it too
            self._link_partitions()
            config["partition_raft_dial_addresses"] = {
                address(self._partition_raft_port(acceptor, number)): address(port)
                for (number, dialler, acceptor), port in self.partition_link_ports.items() if dialler == node.index}
        return config

    def _partition_raft_port(self, i: int, number: int) -> int:
        """The Raft port of partition number ``number`` on node ``i`` (rcq.server.partitions.ports)."""
        first = int(str(self.node_settings[i]["partition_ports"]).split("-")[0])
        return first + 2 * (number - 1) + 1

    def _link_partitions(self) -> None:
        """A proxy link for every partition number's Raft between every pair of nodes, once. The
        process whose Raft address is the greater string dials (pysyncobj's rule, as for p0)."""
        if self.partition_link_ports:
            return
        for number in range(1, self.partitions_max + 1):
            for i in range(len(self.nodes)):
                for j in range(i):
                    a, b = address(self._partition_raft_port(i, number)), address(self._partition_raft_port(j, number))
                    dialler, acceptor = (i, j) if a > b else (j, i)
                    self.partition_link_ports[(number, dialler, acceptor)] = self.proxy.add_link(
                        partition_raft_link(number, dialler, acceptor), self._partition_raft_port(acceptor, number))

    def partition_raft_links(self, a: int, b: int, number: int | None = None) -> list[tuple[str, int]]:
        """(link, dialler) of the partitions' Raft links between nodes ``a`` and ``b``
        (chaos.target.PartitionLinks)."""
        return [(partition_raft_link(k, dialler, acceptor), dialler)
                for (k, dialler, acceptor) in self.partition_link_ports
                if {dialler, acceptor} == {a, b} and (number is None or k == number)]

    def add_node(self, peers: Sequence[int] | None = None, *, start: bool = True) -> int:
        raise NotImplementedError("the chaos cluster's proxy links are made for its first nodes; "
                                  "membership changes there remove and re-add them")

    # ------------------------------------------------ membership (chaos.target.MembershipControl)
    def member_identity(self, i: int) -> dict[str, str]:
        """Node ``i`` as it is re-added: its real Raft address (every peer dials it, through the
        proxy links made at start) and the client link's URL, which it advertises."""
        node = self.nodes[i]
        return {"node_id": node.node_id, "raft_address": node.raft_address, "url": self.advertised_url(i)}

    def admin_request(self, i: int, path: str, method: str = "GET", body: dict[str, Any] | None = None,
                      timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
        return self.poll_json(self.poll_url(i) + path, timeout_s, method, body=body)

    # ------------------------------------------------------ ChaosTarget
    @property
    def client_urls(self) -> list[str]:
        return self.urls

    @property
    def node_urls(self) -> list[str]:
        return [self.url(i) for i in range(len(self.nodes))]

    def link_faults(self) -> ProxyThread:
        return self.proxy

    def node_isolation(self) -> None:
        return None  # link faults cut whole nodes and finer shapes alike

    def partition_process_control(self) -> Self | None:
        """Itself (:meth:`partition_processes`) when it runs partitions besides p0
        (chaos.faults.processes.partition_processes)."""
        return self if self.partitions_count > 1 else None

    def power_failure(self) -> Self | None:
        """Itself (:meth:`lose_power`) when its disks are powerfs mounts (chaos.faults.power_failure)."""
        return self if self.power_mounts else None

    def disk_stall(self) -> Self | None:
        """Itself (:meth:`stall_disk`) when its disks are powerfs mounts (chaos.faults.disk_stall)."""
        return self if self.power_mounts else None

    def stall_disk(self, i: int) -> dict[str, Any]:
        """Stall node ``i``'s disk: every fsync, fdatasync and fsyncdir on it hangs until
        :meth:`release_disk` (or the heal); reads and writes go on. The mount's stall state."""
        return self._mount(i, "stalled disks").stall()

    def release_disk(self, i: int) -> dict[str, Any]:
        """End the stall of node ``i``'s disk (not stalled: nothing): its hanging syncs complete;
        ``released``: how many were hanging."""
        return self._mount(i, "stalled disks").release()

    def release_disks(self) -> None:
        """Release every stalled disk (a mount that cannot answer is logged: its close says more)."""
        for mount in self.power_mounts:
            try:
                mount.release()
            except PowerFSError as exc:
                log.error("could not release the stall of %s: %s", mount.mountpoint, exc)

    def _mount(self, i: int, what: str) -> PowerMount:
        if not self.power_mounts:
            raise RuntimeError(f"no {what} without powerfs: make the cluster with power_fs=True")
        return self.power_mounts[i]

    def lose_power(self, indices: Sequence[int]) -> dict[int, dict[str, Any]]:
        """kill -9 nodes ``indices`` and what they forked, wait until none of it runs, then drop
        everything their disks had not made durable; per node, what was dropped."""
        if not self.power_mounts:
            raise RuntimeError("no power failures without powerfs: make the cluster with power_fs=True")
        groups: set[int] = set()
        for i in indices:
            pid = self.nodes[i].pid  # the node leads its process group
            self.kill_node(i)
            if pid is not None:
                groups.add(pid)
        if groups:
            wait_until(lambda: not groups_running(groups), STOP_TIMEOUT_S,
                       what=f"process groups {sorted(groups)} to be gone after SIGKILL")
        return {i: self.power_mounts[i].cut() for i in indices}

    def wipe_node(self, i: int) -> None:
        super().wipe_node(i)
        if self.power_mounts:  # a wiped node is a new, empty disk: a later cut must not bring files back
            self.power_mounts[i].sync()

    def heal(self, timeout_s: float | None = None) -> list[int]:
        self.release_disks()  # before the restarts: a node on a stalled disk would hang starting
        self.proxy.heal()
        return super().heal(timeout_s)

    def close(self) -> None:
        try:
            self.release_disks()  # a node hanging in a sync could not stop
            super().close()  # the nodes first: a disk is unmounted once nothing uses it
        finally:
            errors = close_all(self.power_mounts)
            self.power_mounts = []
            self.proxy.close()
            if errors:
                log.error("powerfs mounts not closed cleanly: %s", errors)
                raise PowerFSError("powerfs mounts not closed cleanly: " + "; ".join(errors))
