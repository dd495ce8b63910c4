"""NodeConfig -> pysyncobj's SyncObjConf: every Raft setting rcq gives pysyncobj, and why.

Must not import: anything of rcq's but config, errors, the snapshot writer, the transport's
frame limits and the wire seal's key.
"""

from __future__ import annotations

from collections.abc import Callable

from pysyncobj import SERIALIZER_STATE, SyncObjConf

from rcq.errors import InvalidRequest
from rcq.server.config import NodeConfig
from rcq.server.raft.snapshots import ForkingSnapshotWriter, SnapshotState
from rcq.server.raft.transport_patches import FrameLimits, set_dial_addresses, set_frame_limits, set_seal_key
from rcq.server.raft.wire_seal import master_key

# A bind that keeps failing (port taken) fails start() after about 5 s instead of
# pysyncobj's default of retrying for ever.
BIND_RETRY_INTERVAL_S = 0.5
BIND_RETRIES_MAX = 10

_SNAPSHOT_STATES = {
    SnapshotState.IDLE: SERIALIZER_STATE.NOT_SERIALIZING,
    SnapshotState.WRITING: SERIALIZER_STATE.SERIALIZING,
    SnapshotState.SUCCEEDED: SERIALIZER_STATE.SUCCESS,
    SnapshotState.FAILED: SERIALIZER_STATE.FAILED,
}


def build_conf(config: NodeConfig, writer: ForkingSnapshotWriter, *, auto_tick: bool,
               on_state_changed: Callable[[int, int], None]) -> SyncObjConf:
    conf = SyncObjConf(
        password=config.cluster_secret,  # H10: encrypts and authenticates peers
        bindAddress=config.raft_bind_address or config.raft_address,  # pysyncobj would otherwise bind 0.0.0.0
        # A peer's name is resolved again after this (pysyncobj: 600 s), so that one that came back
        # at a new address (a container) is dialled there; a failed lookup is retried as soon.
        dnsCacheTime=config.raft_dns_cache_s,
        dnsFailCacheTime=config.raft_dns_cache_s,
        autoTick=auto_tick,
        autoTickPeriod=config.auto_tick_period_s,
        # Mandatory: without it acked writes and terms are lost (the unsafe option exists
        # only so the chaos harness can show that it catches exactly that loss).
        journalFile=None if config.unsafe_memory_journal else str(config.journal_path),
        fullDumpFile=str(config.snapshot_path),
        # H9: snapshots written in the tick thread stop heartbeats; fork instead.
        serializer=writer.serialize,
        serializeChecker=lambda: _SNAPSHOT_STATES[writer.check()],
        deserializer=writer.deserialize,
        # Group commit already packs concurrent commits into one entry; sending each entry
        # at once (a pipe wakes the tick thread) saves up to a whole period of latency.
        appendEntriesUseBatch=config.append_entries_batched,
        appendEntriesPeriod=config.append_entries_period_s,
        raftMinTimeout=config.raft_timeout_min_s,
        raftMaxTimeout=config.raft_timeout_max_s,
        # H3: below raftMinTimeout, so a partitioned leader steps down before a new one exists.
        leaderFallbackTimeout=config.leader_fallback_timeout_s,
        connectionTimeout=config.connection_timeout_s,
        # Only the node with the greater address dials; after a peer restarts it
        # redials every connectionRetryTime (default 5 s). One election timeout
        # keeps a restarted peer's return about as fast as a failover.
        connectionRetryTime=config.raft_timeout_min_s,
        commandsQueueSize=config.commands_queued_max,
        # H7 / docs/design.md §2: no leader means fail now, not a command applied after our timeout.
        commandsWaitLeader=False,
        logCompactionMinEntries=config.log_compaction_entries_min,
        logCompactionMinTime=config.log_compaction_interval_s,
        # Not split: pysyncobj's split makes a node wait for its time slot (up to
        # logCompactionMinTime, 300 s) even past the entry threshold or when forced, while
        # the log grows in RAM. Snapshots are written by a forked child, so nodes
        # snapshotting at the same time cost CPU, not heartbeats.
        logCompactionSplit=False,
        # H11: nodes are added and removed one at a time (docs/membership.md), with rcq's fixes to
        # pysyncobj's membership (H16..H18, rcq.server.raft.membership).
        dynamicMembershipChange=True,
        onStateChanged=on_state_changed,
        bindRetryTime=BIND_RETRY_INTERVAL_S,
        maxBindRetries=BIND_RETRIES_MAX,
    )
    # H13: the largest frame a connection may announce, before and after it authenticated.
    set_frame_limits(conf, FrameLimits(handshake_bytes_max=config.raft_handshake_frame_bytes_max,
                                       authenticated_bytes_max=config.raft_frame_bytes_max))
    set_dial_addresses(conf, dict(config.raft_dial_addresses))
    # AES-GCM where both ends offer it. Not while older secrets are accepted: the two ends of a
    # connection may then seal with different secrets, and the seal's keys need one they share.
    secret, offer_seal = config.cluster_secret, config.raft_fast_seal and not config.cluster_secrets_previous
    set_seal_key(conf, master_key(secret) if secret is not None and offer_seal else None)
    try:
        conf.validate()
    except AssertionError as exc:
        raise InvalidRequest("the Raft settings are inconsistent (raft_timeout_min_s must exceed "
                             "3 x append_entries_period_s, leader_fallback_timeout_s must exceed "
                             "append_entries_period_s)") from exc
    return conf

