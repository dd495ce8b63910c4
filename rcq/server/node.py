"""The composition root: config -> state machine -> replicator -> transactions -> HTTP app.

``Node`` owns the lifetime of one rcq node: it starts Raft, the transaction
manager and the HTTP server (and, with ``partition_ports``, the host of its other partitions'
processes), and stops them in reverse order. ``run_node``
runs one until SIGINT/SIGTERM.

A stopping leader first hands leadership to its most caught-up follower (clients wait tens of
milliseconds for the new leader instead of an election timeout) and ends its session channels
(what is in flight is answered first): aiohttp's shutdown waits for every open request, and a
channel whose client keeps sending would otherwise hold the node up until it is killed.

Must not import: pysyncobj, lmdb (the replicator module does).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from aiohttp import web

from rcq.errors import RcqError
from rcq.names import P0
from rcq.server.config import NodeConfig, is_loopback
from rcq.server.core.features import level_max_read
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.heap import keep_heap_top
from rcq.server.http import session_channel
from rcq.server.http.api import create_app
from rcq.server.http.connections import HttpListener, runner_options
from rcq.server.http.handlers import PARTITION_HOST
from rcq.server.http.membership_routes import MEMBERSHIP
from rcq.server.leader.transactions import TransactionManager
from rcq.server.partitions.host import PartitionHost
from rcq.server.raft.protocol import Replicator, known_nodes

log = logging.getLogger(__name__)

# A hand-over takes tens of milliseconds; a stopping leader waits no longer than this for one (when
# the whole cluster stops at once, the target stops too and no election would come).
HAND_OVER_ON_STOP_S = 1.0


class Node:
    def __init__(self, config: NodeConfig, replicator: Replicator | None = None) -> None:
        self.config = config
        self.state_machine = QueueStateMachine(level_max_read(config.test_feature_level_max),
                                               partition=config.partition_name or P0)
        if replicator is None:
            from rcq.server.raft.replicator import RaftReplicator  # the only door to pysyncobj

            replicator = RaftReplicator(config, self.state_machine)
        self.replicator = replicator
        self.manager = TransactionManager(config, replicator, leader_url=self.leader_url)
        self.app = create_app(config, self.manager, replicator)
        # The node's other partitions, one child process each (docs/partitions.md), when it has ports for them.
        self.partition_host = PartitionHost(config, replicator) if config.serves_partitions else None
        if self.partition_host is not None:
            self.app[PARTITION_HOST] = self.partition_host
        self._runner: web.AppRunner | None = None
        self.http_listener: HttpListener | None = None  # the HTTP socket and its connection limits
        self.port: int | None = None

    def leader_url(self) -> str | None:
        address = self.replicator.leader_raft_address()
        if address is None:
            return None
        known = known_nodes(self.config, self.replicator).get(address)
        return known.http_url if known is not None else None

    async def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        await self.replicator.start()
        await self.manager.start()
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, **runner_options(self.config))
        await self._runner.setup()
        # Not a TCPSite: the listener puts a connection cap and a request-head deadline in front of
        # aiohttp's protocol (so one client cannot take every file descriptor Raft needs too).
        self.http_listener = HttpListener(self._runner, self.config)
        self.port = await self.http_listener.start()  # http_port 0 binds a free port: this is the one
        # Long-lived objects (code, config, the app) need no more GC passes; a young-generation
        # threshold well above the default keeps collection pauses (measured up to 0.45 s under
        # load in the pysyncobj study) short and rare, so heartbeats are not delayed.
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        log.info("node %s serving HTTP%s on %s:%s, Raft on %s", self.config.node_id,
                 "S" if self.config.tls_cert_file is not None else "", self.config.http_host, self.port,
                 self.config.raft_address)
        if self.partition_host is not None:
            self.partition_host.start()
        if not self.config.auth_enabled:
            exposed = not is_loopback(self.config.http_host)
            (log.warning if exposed else log.info)(
                "the HTTP API has no tokens: anyone who reaches %s:%s can do anything%s", self.config.http_host,
                self.port, " (insecure_http; never do this outside development)" if exposed else " (loopback only)")

    async def stop(self) -> None:
        if self.partition_host is not None:  # the partitions stop first (each hands its leadership over)
            await self.partition_host.stop()
        if self.http_listener is not None:
            self.http_listener.close()  # accept no more connections
        if self._runner is not None:
            await self._hand_leadership_over()
            self.manager.end_waits()  # long polls answer now: the stop does not wait for them
            await session_channel.close_all(self.app)
            await self._runner.cleanup()  # shuts the open connections down
            self._runner = None
        if self.http_listener is not None:
            await self.http_listener.wait_closed()
            self.http_listener = None
        await self.manager.stop()
        await self.replicator.stop()

    async def _hand_leadership_over(self) -> None:
        """A leader with peers hands over before it stops; best effort, within HAND_OVER_ON_STOP_S."""
        if not self.manager.serving or len(self.replicator.members()) < 2:
            return
        try:
            async with asyncio.timeout(HAND_OVER_ON_STOP_S):
                answer = await self.app[MEMBERSHIP].transfer_leadership(None)
        except RcqError as exc:
            log.warning("stopping as the leader: leadership could not be handed over first (%s: %s)",
                        exc.code, exc.message)
            return
        except TimeoutError:
            log.warning("stopping as the leader: leadership was not handed over within %g s", HAND_OVER_ON_STOP_S)
            return
        log.info("handed leadership over to %s before stopping", answer["leader_id"])


async def run_node(config: NodeConfig) -> None:
    keep_heap_top()  # every Raft message compresses: see rcq.server.heap
    node = Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await node.start()
    print(f"rcq node {config.node_id} ready: {config.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await node.stop()
