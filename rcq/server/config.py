"""NodeConfig: every setting of one rcq node, documented, with defaults in one place.

Why over 400 lines: every setting of a node, each a documented Field with its checks, in one place by design.

Loaded from a JSON file (``rcq serve --config node.json``) and/or command-line
flags; the cluster secret may also come from the ``RCQ_CLUSTER_SECRET``
environment variable so it never shows in a process list. Cross-field rules
are checked here, and their messages name both fields.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rcq import limits
from rcq.errors import InvalidRequest
from rcq.names import P0, PARTITION_NAME
from rcq.private_files import read_private
from rcq.tokens import TokenEntry, TokenFormatError

NODE_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
HOST_PORT_PATTERN = r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$"
# Fields renamed early on so that units and qualifiers come last: an old config file gets a clear
# error. Settings renamed since are read for one release (RENAMED_STILL_READ, docs/upgrades.md).
RENAMED_FIELDS = {
    "raft_min_timeout_s": "raft_timeout_min_s",
    "raft_max_timeout_s": "raft_timeout_max_s",
    "log_compaction_min_entries": "log_compaction_entries_min",
    "log_compaction_min_time_s": "log_compaction_interval_s",
    "commands_queue_size": "commands_queued_max",
    "closed_transactions_remembered": "closed_transactions_remembered_max",
}


def safe_validation_message(exc: ValidationError, limit: int = 5) -> str:
    """A pydantic error as 'field: problem' pairs, never echoing the input (which may be a secret)."""
    problems = [f"{'.'.join(str(p) for p in e['loc']) or '(whole)'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False, include_context=False)[:limit]]
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


def _token_entry(value: Any) -> TokenEntry:
    """A ``tokens`` item: an entry already made, or its JSON form checked by rcq.tokens (the
    standard-library model the CLI shares), whose message names the field, never its value."""
    if isinstance(value, TokenEntry):
        return value
    try:
        return TokenEntry.from_json(value)
    except TokenFormatError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in where)}: {what}" if where else what
                             for where, what in exc.problems)
        raise PydanticCustomError("token_entry", "{problems}", {"problems": problems}) from None


# A token entry in the config: validated and written in the tokens file's format (rcq.tokens).
ConfigTokenEntry = Annotated[
    TokenEntry, PlainValidator(_token_entry), PlainSerializer(TokenEntry.to_json),
    WithJsonSchema({"type": "object", "description": "a token entry as in a tokens file (rcq token create)"})]


def default_storage_bytes() -> int:
    """A quarter of the memory this process may use: the machine's, or its cgroup's limit if lower."""
    total = 0
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        total = int(pages) * int(page_size)
    except (OSError, ValueError):
        pass
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (total or int(text) + 1):
            total = int(text)
    return max(total // 4, 64 << 20) if total else 1 << 30


def _port_range(value: Any) -> tuple[int, int]:
    """``"START-END"`` (or a pair) as (START, END): ports 1 to 65535, START <= END, two at least."""
    if isinstance(value, str):
        start_text, dash, end_text = value.partition("-")
        if not dash or not start_text.strip().isdigit() or not end_text.strip().isdigit():
            raise PydanticCustomError("port_range", "expected START-END, e.g. 7010-7049")
        value = (int(start_text), int(end_text))
    if (not isinstance(value, tuple | list) or len(value) != 2
            or not all(isinstance(port, int) and not isinstance(port, bool) for port in value)):
        raise PydanticCustomError("port_range", "expected START-END, e.g. 7010-7049")
    start, end = value
    if not 1 <= start < end <= 65535:
        raise PydanticCustomError("port_range", "ports must be 1 to 65535, START below END")
    return start, end


# A range of ports, written "START-END" (both included).
PortRange = Annotated[tuple[int, int], PlainValidator(_port_range),
                      PlainSerializer(lambda value: f"{value[0]}-{value[1]}"),
                      WithJsonSchema({"type": "string", "pattern": r"^[0-9]{1,5}-[0-9]{1,5}$"})]


Port = Annotated[int, Field(ge=1, le=65535)]


class NamedPartitionPorts(BaseModel):
    """The ports one named partition's process binds on this node, and where clients and the other
    nodes reach them when that is elsewhere (a container's published ports)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    http: Port
    raft: Port
    advertise_http: Port | None = None
    advertise_raft: Port | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> NamedPartitionPorts:
        if (self.advertise_http is None) != (self.advertise_raft is None):
            raise ValueError("advertise_http and advertise_raft go together")
        if self.http == self.raft:
            raise ValueError("http and raft must differ")
        return self

    def ports(self) -> tuple[int, int, int, int]:
        """(HTTP, Raft, advertised HTTP, advertised Raft)."""
        return (self.http, self.raft, self.advertise_http or self.http, self.advertise_raft or self.raft)


class PeerConfig(BaseModel):
    """Another node of the cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str = Field(pattern=NODE_ID_PATTERN)
    raft_address: str = Field(pattern=HOST_PORT_PATTERN, description="host:port of its Raft listener")
    http_url: str = Field(pattern=r"^https?://", description="base URL clients use to reach it")


log = logging.getLogger(__name__)

# Settings renamed, read under their old name for one release (docs/upgrades.md): old -> new names.
RENAMED_STILL_READ: dict[str, tuple[str, ...]] = {
    # one name capped two things: a transaction's item bytes and the group committer's Raft entry
    "commit_batch_bytes_max": ("transaction_bytes_max", "commit_entry_bytes_max"),
}


class NodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- identity and addresses
    node_id: str = Field(pattern=NODE_ID_PATTERN, description="unique name of this node")
    http_host: str = Field("127.0.0.1", description="interface the HTTP API binds to")
    http_port: int = Field(ge=0, le=65535, description="HTTP API port")
    advertise_url: str | None = Field(
        None, pattern=r"^https?://", description="URL other nodes give clients for this node; default http://http_host:http_port")
    raft_address: str = Field(pattern=HOST_PORT_PATTERN, description="host:port this node's Raft listens on")
    peers: tuple[PeerConfig, ...] = Field(
        (), description="the other nodes when this node starts (2 or 4 for a 3- or 5-node cluster); afterwards "
        "membership changes, replicated, decide (docs/membership.md)")
    raft_bind_address: str | None = Field(
        None, pattern=HOST_PORT_PATTERN, description="host:port the Raft listener binds to; default raft_address "
        "(its host resolved once, at start). In a container, 0.0.0.0:PORT: a container whose network is "
        "reconnected gets a new address, and a listener bound to the old one hears no peer again")
    raft_dns_cache_s: float = Field(
        5.0, gt=0, description="a peer's Raft host name, once resolved, is dialled at that address this long before "
                               "it is resolved again (pysyncobj keeps it 600 s): a peer that comes back at a new "
                               "address (a container restarted or recreated) is reached within this. Names are "
                               "resolved only when a connection is made, on the Raft tick thread")
    raft_dial_addresses: dict[str, Annotated[str, Field(pattern=HOST_PORT_PATTERN)]] = Field(
        default_factory=dict, description="peer Raft address -> host:port to connect to it at (a tunnel or "
        "proxy); the peer is still known by its own address")
    partition_raft_dial_addresses: dict[str, Annotated[str, Field(pattern=HOST_PORT_PATTERN)]] = Field(
        default_factory=dict, description="the same for the partition processes this node runs: a peer "
        "partition's Raft address -> host:port to connect to it at; copied whole into each one's "
        "raft_dial_addresses (the chaos harness's proxy uses it)")
    peer_urls: dict[Annotated[str, Field(pattern=NODE_ID_PATTERN)], Annotated[str, Field(pattern=r"^https?://")]] = Field(
        default_factory=dict, description="node id -> base URL this node reaches that node's HTTP API at, where the "
        "URL the node advertises to clients does not work between nodes (containers, NAT, a load balancer): "
        "forwards to the leader, the feature-level survey and the status page's peer views go there, while "
        "clients are still given the advertised URL. Node-local, never replicated; an entry naming this node "
        "itself is ignored (one map may serve every node)")
    partition_ports: PortRange | None = Field(
        None, description="START-END: the ports this node's partition processes bind (docs/partitions.md): "
                          "partition k (p1 is 1) serves HTTP on START+2(k-1) and Raft on the port after; a range "
                          "of 2n ports holds n partitions. None: this node runs p0 only")
    partition_advertise_ports: PortRange | None = Field(
        None, description="START-END: partition_ports as clients and the other nodes reach them, where they differ "
                          "(a container's published ports); same size as partition_ports. Default: partition_ports")
    partition_port_map: dict[Annotated[str, Field(pattern=rf"^{PARTITION_NAME}$")], NamedPartitionPorts] = Field(
        default_factory=dict, description="partition name -> its ports on this node, {\"http\", \"raft\"} (and "
        "\"advertise_http\", \"advertise_raft\" where others reach them elsewhere): a partition named here "
        "takes these whatever its number, any other takes its pair of partition_ports (docs/partitions.md). "
        "For ports that are not one range, or a partition's own fixed ports")
    balance_leaders: bool = Field(
        True, description="while this node is p0's leader, move partition leaders so that each node leads about "
                          "as many as the others (docs/partitions.md, \"Leaders spread\"); false: only by hand, "
                          "rcq cluster rebalance")
    balance_hold_s: float = Field(
        60.0, ge=0, le=3600, description="the leader balancer moves no partition's leader within this long of "
                                         "that partition's last leader change")
    partition_name: str | None = Field(
        None, description="set by a node for the partition processes it starts (docs/partitions.md): the partition "
                          "this process serves. None: p0, the node's own process")
    storage_share_partitions: int = Field(
        1, ge=1, le=1000, description="set by a node for the partition processes it starts (docs/partitions.md, "
                                      "\"Memory budget\"): until p0's controller gives this process its share of "
                                      "storage_bytes_max, it takes storage_bytes_max divided by this (the most "
                                      "partitions, p0 included, any member of its partition hosted when it started)")
    data_dir: Path = Field(description="Raft journal, its meta file and the LMDB snapshot live here")

    # --- security
    cluster_secret: str | None = Field(
        None, min_length=16, repr=False, description="shared secret encrypting and authenticating Raft traffic")
    cluster_secrets_previous: tuple[str, ...] = Field(
        (), repr=False, description="older cluster secrets still accepted from peers while the secret is rotated "
                                    "(frames are sealed with cluster_secret); see docs/security.md")
    insecure: bool = Field(False, description="allow running without a cluster secret (development only)")
    tokens: tuple[ConfigTokenEntry, ...] = Field(
        (), description="API tokens this node accepts (hashed: see `rcq token create`); with tokens_file, both")
    tokens_file: Path | None = Field(
        None, description="JSON file of hashed API tokens (mode 0600), re-read when it changes")
    insecure_http: bool = Field(
        False, description="allow an HTTP API without tokens on a non-loopback address: anyone who reaches "
                           "the port can do anything (development only)")
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain of the HTTPS listener")
    tls_key_file: Path | None = Field(None, description="PEM private key of the HTTPS listener (mode 0600)")
    tls_client_ca_file: Path | None = Field(
        None, description="require client certificates signed by this CA (mutual TLS)")
    tls_peer_ca_file: Path | None = Field(
        None, description="CA bundle to verify the other nodes' HTTPS with (status page); default: the system's")

    # --- transactions
    transaction_timeout_default_s: float = Field(30.0, gt=0, description="deadline of a transaction that asks for none")
    transaction_timeout_max_s: float = Field(
        limits.TRANSACTION_TIMEOUT_MAX_S, gt=0, description="longest deadline a transaction may ask for")
    transactions_open_max: int = Field(10_000, ge=1, description="open transactions on the leader before 429")
    dequeue_wait_max_ms: int = Field(30_000, ge=0, description="longest a dequeue may wait for an item")
    dequeue_items_max: int = Field(limits.DEQUEUE_ITEMS_MAX, ge=1, description="most items one dequeue may return")
    closed_transactions_remembered_max: int = Field(
        50_000, ge=0, description="recently aborted/expired ids kept for status answers")

    transactions_open_per_client_max: int = Field(
        2_500, ge=1, description="open transactions one principal (without tokens: one peer address) may "
                                 "hold on the leader before 429")
    transaction_bytes_max: int = Field(
        limits.TRANSACTION_BYTES_MAX, ge=1024, description="most item bytes (headers included) one transaction "
                                                           "may enqueue; past it 413")
    transaction_lifetime_max_s: float = Field(
        4 * 3600.0, gt=0, description="longest a transaction may live, extends included; past it an extend "
                                      "is refused and the deadline aborts it")

    # --- sizes and per-request bounds
    item_bytes_max: int = Field(1 << 20, ge=1, description="largest item")
    body_bytes_max: int = Field(32 << 20, ge=1024, description="largest HTTP request body")
    request_items_max: int = Field(10_000, ge=1, description="most items one enqueue request may carry")
    transaction_items_max: int = Field(
        100_000, ge=1, description="most items one transaction may enqueue plus dequeue")
    dequeue_answer_bytes_max: int = Field(
        16 << 20, ge=1024, description="a dequeue returns at most this many item bytes (always at least one item)")
    batch_requests_max: int = Field(
        1_000, ge=1, description="most sub-requests in one /v1/batch or /v1/execute-batch, most ids in one commit_many")

    # --- storage (what the replicated state may hold; every node holds all of it in RAM)
    storage_bytes_max: int = Field(
        default_factory=lambda: default_storage_bytes(), ge=1 << 20,
        description="memory budget for queued items, counting each item's bookkeeping as well as its "
                    "bytes; past it enqueues get 507 storage_full. Default: a quarter of the machine's "
                    "memory (or of the cgroup's limit). Set the same on every node: the leader's applies. "
                    "A node hosting partitions shares it between them (docs/partitions.md, \"Memory budget\")")
    queue_items_max_default: int = Field(
        10_000_000, ge=1, description="most items in a queue that has no max_items of its own")
    queue_bytes_max_default: int = Field(
        1 << 30, ge=1, description="most item bytes (with bookkeeping) in a queue that has no max_bytes of its own")

    # --- HTTP connections
    http_connections_max: int | None = Field(
        None, ge=1, description="open HTTP connections before new ones are refused; None: three quarters "
                                "of the process's open-file limit")
    http_header_timeout_s: float = Field(10.0, gt=0, description="a client must send a request's headers within this")
    http_body_timeout_s: float = Field(30.0, gt=0, description="...and its body within this")
    http_keepalive_s: float = Field(75.0, gt=0, description="an idle keep-alive connection is closed after this")

    # --- session channels (GET /v1/session, docs/session-channel.md)
    session_in_flight_max: int = Field(
        128, ge=1, le=10_000, description="requests in flight on one session channel; past it the node stops "
                                          "reading that channel until answers go out (back-pressure)")
    session_idle_timeout_s: float = Field(
        300.0, gt=0, description="a session channel with nothing in flight and no frame this long is closed")
    session_channels_per_client_max: int = Field(
        256, ge=1, description="session channels one client (principal, or peer address without tokens) may hold open")
    session_unsent_bytes_max: int = Field(
        1 << 20, ge=4096, description="answers of one session channel written but not yet taken by its client "
                                      "(the connection's write buffer); past it the node stops reading that channel")
    session_unsent_timeout_s: float = Field(
        30.0, gt=0, description="a session channel whose unsent answers stay past session_unsent_bytes_max this long "
                                "is closed (4000); its close frame then gets as long (at least 5 s) to be taken before the "
                                "connection is dropped")

    # --- commits
    commit_timeout_s: float = Field(10.0, gt=0, description="after this, a commit's outcome is reported unknown (504)")
    feature_level_auto: bool = Field(
        True, description="the leader raises the cluster's feature level once every member reads a higher one "
                          "(false: only POST /v1/cluster/feature-level does, so a rollback stays possible)")
    test_clock_offset_ms: int = Field(
        0, description="FOR TESTS ONLY: skews this node's clock (as leader) by this many ms, to test that "
                       "time in the replicated state never goes back (docs/queue-features.md)")
    test_session_fault: bool = Field(
        False, description="FOR TESTS ONLY: a session frame {\"op\": \"test_fault\"} fails its channel as a bug "
                           "would (close 1011), to test that every close code is documented (docs/session-channel.md)")
    test_feature_level_max: int | None = Field(
        None, ge=1, description="FOR TESTS ONLY: this node reads feature levels only up to this one, as a node of an "
                                "older release would, to test refusals and stops (docs/upgrades.md)")
    commit_batch_units_max: int = Field(4096, ge=1, description="most commit units grouped into one Raft entry")
    commit_entry_bytes_max: int = Field(
        limits.COMMIT_ENTRY_BYTES_MAX, ge=1024, description="most item bytes the group committer puts into one "
                                                            "Raft entry (one commit alone may carry up to "
                                                            "commit_unit_bytes_max)")
    commit_unit_bytes_max: int = Field(
        64 << 20, ge=1024, description="most item bytes one commit (or commit_many) may carry: it is one Raft entry")
    commits_in_flight_max: int = Field(32, ge=1, description="Raft entries proposed but not yet applied")

    # --- Raft (see docs/operations.md: why these values)
    raft_timeout_min_s: float = Field(0.8, gt=0, description="minimum election timeout")
    raft_timeout_max_s: float = Field(1.6, gt=0, description="maximum election timeout")
    leader_fallback_timeout_s: float = Field(
        0.6, gt=0, description="a leader without a majority steps down after this; must be below raft_timeout_min_s")
    append_entries_batched: bool = Field(
        False, description="hold entries for append_entries_period_s and send them together (pysyncobj's "
                           "appendEntriesUseBatch); off: send each entry at once, rcq's group commit batches")
    # An election timeout holds 8 heartbeats (etcd's 100 ms / 1 s ratio); more only cost every node
    # CPU while idle. Entries do not wait for a heartbeat unless append_entries_batched.
    append_entries_period_s: float = Field(0.1, gt=0, description="heartbeat period; with batching, how often entries go out")
    raft_ticks_on_loop: bool = Field(
        True, description="run pysyncobj's ticks on the event loop's thread (rcq.server.raft.loop_ticker); false: "
                          "on a tick thread of its own, as pysyncobj does")
    auto_tick_period_s: float = Field(
        0.05, gt=0, description="longest wait of the Raft tick thread with nothing to do: messages, proposals, "
                                "heartbeats and election deadlines end it sooner; bounds how late the leader's "
                                "step-down check runs")
    connection_timeout_s: float = Field(3.5, gt=0, description="peer connection timeout; at least raft_timeout_max_s")
    log_compaction_entries_min: int = Field(50_000, ge=2, description="snapshot once the log holds this many entries")
    log_compaction_interval_s: float = Field(300.0, gt=0, description="...or this long after the last snapshot")
    log_compaction_bytes: int = Field(
        64 << 20, ge=1 << 16, description="...or once the journal holds this many bytes (bounds the log kept in RAM)")
    commands_queued_max: int = Field(20_000, ge=100, description="pysyncobj's queue of proposed commands")
    raft_handshake_frame_bytes_max: int = Field(
        1 << 16, ge=1024, description="largest Raft frame accepted from a connection that has not yet "
                                      "authenticated with the cluster secret; a bigger one closes the connection")
    raft_frame_bytes_max: int = Field(
        1 << 30, ge=1 << 20, description="largest Raft frame accepted from an authenticated peer")
    raft_fast_seal: bool = Field(
        True, description="seal Raft frames with AES-GCM, a key per connection and direction, with every peer that "
                          "offers it too (rcq.server.raft.wire_seal); false, or while cluster_secrets_previous is set: "
                          "pysyncobj's Fernet with every peer. Frames of either kind are always read")
    durability: Literal["fsync", "os"] = Field(
        "fsync", description="fsync: a node makes Raft entries durable (fdatasync) before it acknowledges them, "
                             "and term and vote before it votes; a power failure of every node loses no acknowledged "
                             "commit. os: entries go to the page cache only (pysyncobj's mmap'd journal): a kill -9 "
                             "loses nothing, a power failure of a majority loses recent acknowledged commits")
    unsafe_memory_journal: bool = Field(
        False, description="keep the Raft log in memory only: a crash loses acknowledged commits. Exists so "
                           "the chaos harness can prove it detects loss; never use it for data you keep")
    journal_flush_interval_s: float | None = Field(
        None, gt=0, description="with durability=os: msync the Raft journal this often (None: never; the OS "
                                "writes it back). Narrows the power-failure window, does not close it")

    @model_validator(mode="before")
    @classmethod
    def _read_renamed_settings(cls, data: Any) -> Any:
        """A setting renamed is still read for one release, as what its new names say, with a
        WARNING naming them (docs/upgrades.md); a new name given beside it wins."""
        if not isinstance(data, dict) or not RENAMED_STILL_READ.keys() & data.keys():
            return data
        data = dict(data)
        for old, new_names in RENAMED_STILL_READ.items():
            if old not in data:
                continue
            value = data.pop(old)
            for new in new_names:
                data.setdefault(new, value)
            log.warning("setting %s is renamed: read as %s; write %s instead (it is read until the next release)",
                        old, " and ".join(new_names), " and ".join(new_names))
        return data

    @model_validator(mode="after")
    def _check_cross_fields(self) -> NodeConfig:
        if self.journal_flush_interval_s is not None and self.durability != "os":
            raise ValueError("journal_flush_interval_s applies to durability=os only (with fsync every "
                             "acknowledged entry is already synced)")
        if self.cluster_secrets_previous and self.cluster_secret is None:
            raise ValueError("cluster_secrets_previous needs cluster_secret (the secret frames are sealed with)")
        if any(len(previous) < 16 for previous in self.cluster_secrets_previous):
            raise ValueError("each of cluster_secrets_previous must be at least 16 characters, like cluster_secret")
        if self.cluster_secret in self.cluster_secrets_previous:
            raise ValueError("cluster_secrets_previous must not repeat cluster_secret")
        if self.cluster_secret is None and not self.insecure:
            raise ValueError("cluster_secret is required (Raft traffic is pickled); "
                             "set insecure=true only for local development")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file (client certificates "
                             "are checked by the HTTPS listener)")
        if not self.auth_enabled and not self.insecure_http and not is_loopback(self.http_host):
            raise ValueError(f"http_host {self.http_host} is not a loopback address and no tokens are "
                             "configured: set tokens or tokens_file, or insecure_http=true (then anyone who "
                             "reaches the port can do anything)")
        if self.raft_timeout_min_s >= self.raft_timeout_max_s:
            raise ValueError("raft_timeout_min_s must be below raft_timeout_max_s")
        if self.leader_fallback_timeout_s >= self.raft_timeout_min_s:
            raise ValueError("leader_fallback_timeout_s must be below raft_timeout_min_s, "
                             "or a partitioned leader serves beside the new one")
        if self.leader_fallback_timeout_s + self.auto_tick_period_s >= self.raft_timeout_min_s:
            raise ValueError("leader_fallback_timeout_s + auto_tick_period_s must be below raft_timeout_min_s: "
                             "a leader checks for its majority at least every auto_tick_period_s")
        if self.connection_timeout_s < self.raft_timeout_max_s:
            raise ValueError("connection_timeout_s must be at least raft_timeout_max_s")
        if self.transaction_timeout_default_s > self.transaction_timeout_max_s:
            raise ValueError("transaction_timeout_default_s must not exceed transaction_timeout_max_s")
        if self.transaction_timeout_max_s > self.transaction_lifetime_max_s:
            raise ValueError("transaction_timeout_max_s must not exceed transaction_lifetime_max_s")
        if self.raft_handshake_frame_bytes_max > self.raft_frame_bytes_max:
            raise ValueError("raft_handshake_frame_bytes_max must not exceed raft_frame_bytes_max")
        if self.item_bytes_max > self.body_bytes_max:
            raise ValueError("item_bytes_max must not exceed body_bytes_max")
        if self.item_bytes_max > self.transaction_bytes_max:
            raise ValueError("item_bytes_max must not exceed transaction_bytes_max")
        if self.transaction_bytes_max > self.commit_unit_bytes_max:
            raise ValueError("transaction_bytes_max must not exceed commit_unit_bytes_max: a transaction's "
                             "commit is one Raft entry")
        if self.commit_entry_bytes_max > self.commit_unit_bytes_max:
            raise ValueError("commit_entry_bytes_max must not exceed commit_unit_bytes_max")
        self._check_partition_ports()
        ids = [self.node_id, *(p.node_id for p in self.peers)]
        if len(set(ids)) != len(ids):
            raise ValueError("node_id and peers[].node_id must all differ")
        addresses = [self.raft_address, *(p.raft_address for p in self.peers)]
        if len(set(addresses)) != len(addresses):
            raise ValueError("raft_address and peers[].raft_address must all differ")
        return self

    def _check_partition_ports(self) -> None:
        ports, advertised = self.partition_ports, self.partition_advertise_ports
        if advertised is not None and ports is None:
            raise ValueError("partition_advertise_ports needs partition_ports")
        self._check_partition_port_map()
        if ports is None:
            return
        if (ports[1] - ports[0] + 1) % 2:
            raise ValueError("partition_ports must hold an even number of ports (HTTP and Raft for each partition)")
        if advertised is not None and advertised[1] - advertised[0] != ports[1] - ports[0]:
            raise ValueError("partition_advertise_ports must hold as many ports as partition_ports")
        raft_port = int((self.raft_bind_address or self.raft_address).rsplit(":", 1)[1])
        for name, port in (("http_port", self.http_port), ("raft_address's port", raft_port)):
            if ports[0] <= port <= ports[1]:
                raise ValueError(f"partition_ports must not hold {name} ({port}): p0 serves there")

    def _check_partition_port_map(self) -> None:
        named = self.partition_port_map
        if not named:
            return
        if P0 in named:
            raise ValueError("partition_port_map must not name p0: it is served at http_port and raft_address")
        bound = [port for entry in named.values() for port in (entry.http, entry.raft)]
        if len(set(bound)) != len(bound):
            raise ValueError("partition_port_map must give every partition ports of its own")
        raft_port = int((self.raft_bind_address or self.raft_address).rsplit(":", 1)[1])
        for port in bound:
            if port in (self.http_port, raft_port):
                raise ValueError(f"partition_port_map must not hold port {port}: p0 serves there")
            if self.partition_ports is not None and self.partition_ports[0] <= port <= self.partition_ports[1]:
                raise ValueError(f"partition_port_map's port {port} is in partition_ports: each port serves one")

    @property
    def serves_partitions(self) -> bool:
        """Whether this node has ports for partitions besides p0 (a range, or named ones)."""
        return self.partition_ports is not None or bool(self.partition_port_map)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_cert_file is not None else "http"
        return self.advertise_url or f"{scheme}://{self.http_host}:{self.http_port}"

    def peer_url(self, node_id: str, http_url: str) -> str:
        """Where this node reaches node ``node_id``'s HTTP API: its ``peer_urls`` entry, else the
        URL that node advertises (``http_url``), which is also what clients are given."""
        if node_id == self.node_id:
            return http_url
        return self.peer_urls.get(node_id, http_url)

    @property
    def auth_enabled(self) -> bool:
        """Whether requests need a token (tokens configured inline or in a file)."""
        return bool(self.tokens) or self.tokens_file is not None

    @property
    def journal_path(self) -> Path:
        """The Raft log: rcq's write-ahead log with durability=fsync, pysyncobj's journal with os."""
        return self.data_dir / ("raft.wal" if self.durability == "fsync" else "raft.journal")

    @property
    def other_journal_path(self) -> Path:
        """Where the other durability setting keeps its log: a node must not switch with data in place."""
        return self.data_dir / ("raft.journal" if self.durability == "fsync" else "raft.wal")

    @property
    def snapshot_path(self) -> Path:
        return self.data_dir / "raft.snapshot.lmdb"

    def directory(self, recorded: dict[str, tuple[str, str]]) -> dict[str, PeerConfig]:
        """Raft address -> node, for every node this one knows: itself, its configured peers, and
        what membership changes recorded (``recorded``: node id -> (Raft address, HTTP URL), from
        the state machine), which wins over the configuration where they differ."""
        known = {p.raft_address: p for p in self.peers}
        known[self.raft_address] = PeerConfig(node_id=self.node_id, raft_address=self.raft_address,
                                              http_url=self.url)
        for node_id, (raft_address, http_url) in recorded.items():
            if node_id == self.node_id:
                continue  # this node knows where it is
            for address in [a for a, p in known.items() if p.node_id == node_id and a != self.raft_address]:
                del known[address]
            if raft_address != self.raft_address:  # nor is another node at this node's address
                known[raft_address] = PeerConfig.model_construct(node_id=node_id, raft_address=raft_address,
                                                                 http_url=http_url)
        return known


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_config(path: Path | None = None, *, extra_tokens: tuple[TokenEntry, ...] = (),
                **overrides: Any) -> NodeConfig:
    """Read a JSON config file (optional) and apply overrides (None values ignored); ``extra_tokens``
    are added to the file's ``tokens``, not put in their place. A config file that holds the
    cluster secret must be private (mode 0600). Error messages never echo a value."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise InvalidRequest(f"cannot read config {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"cannot read config {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise InvalidRequest(f"config {path}: a JSON object is expected")
        if data.get("cluster_secret") is not None or data.get("cluster_secrets_previous"):
            read_private(Path(path), "config (it holds the cluster secret)")
    data.update({k: v for k, v in overrides.items() if v is not None})
    if extra_tokens:
        listed = data.get("tokens")
        data["tokens"] = [*(listed if isinstance(listed, list) else []), *extra_tokens]
    renamed = sorted(set(data) & set(RENAMED_FIELDS))
    if renamed:
        raise InvalidRequest("invalid node configuration: renamed fields (units and qualifiers last): "
                             + ", ".join(f"{old} is now {RENAMED_FIELDS[old]}" for old in renamed))
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid node configuration: {safe_validation_message(exc, limit=20)}") from None
