"""Fixes installed on pysyncobj's TCP transport: what a peer's bytes and a busy host may cost a node.

Why over 400 lines: the fixes wrap the same few methods of pysyncobj's TCP transport (read, send, accept) and share their state.

* H13: the length a frame announces is checked before any of it is buffered: at most
  ``raft_handshake_frame_bytes_max`` until the connection has authenticated with the cluster
  secret, ``raft_frame_bytes_max`` after; a bigger (or negative) one closes the connection;
* H14: received bytes go to one bytearray consumed from the front: linear, where pysyncobj's
  ``bytes +=`` is quadratic (an entry sent in parts is reassembled likewise:
  rcq.server.raft.reassembly);
* H15: a listener whose ``accept()`` fails for lack of descriptors or memory pauses and retries,
  instead of closing for good.

Not fixes but costs and features: frames are compressed at level 1, and sealed with AES-GCM between
nodes that both offer it (``raft_fast_seal``, rcq.server.raft.wire_seal; Fernet otherwise);
H21: a dial nobody answers is dropped after the connection timeout and made again (pysyncobj's
stays connecting until the kernel gives up on it). ``raft_dial_addresses`` (:func:`set_dial_addresses`) lets a node reach
a peer at another ``host:port`` (a tunnel, a sidecar, the chaos harness's fault proxy) while the
peer keeps its one Raft address as its identity in the cluster's membership (docs/membership.md).

Explained in docs/raft-hazards.md (H13..H15) and tested in tests/integration/test_raft_transport.py,
each with a test showing what pysyncobj does without it (``REPLACED`` keeps pysyncobj's methods).
rcq.server.raft.patches.install() installs these after its own fixes.

Must not import: anything of rcq's but rcq.server.raft.internals and rcq.server.raft.wire_seal.
"""

from __future__ import annotations

import errno
import functools
import logging
import pickle
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection

from rcq.server.raft.internals import (
    Replaced,
    connect_node,
    connection_private,
    drop_unanswered_dial,
    replace_method,
    server_private,
    set_connection_private,
    transport_conf,
    transport_connection,
    transport_server,
)
from rcq.server.raft.wire_seal import Seal, is_sealed, offering_nonce, offers

logger = logging.getLogger(__name__)

# What install() replaced, by fix: pysyncobj's own methods, for the tests that show its behaviour.
REPLACED: dict[str, list[Replaced]] = {"read path": [], "accept": [], "dialling": [], "send": [], "seal": []}



@dataclass
class MessageCounts:
    """Raft messages this process sent and received whole (one SyncObj per process: a node's, or
    a partition process's): the metrics rcq_raft_messages_sent/_received, and what a partition's
    fixed cost is measured by (bench.partitions)."""

    sent: int = 0
    received: int = 0


MESSAGES = MessageCounts()

_DIAL_ADDRESSES = "_rcq_dial_addresses"  # on a SyncObjConf: peer Raft address -> (host, port) to dial


def set_dial_addresses(conf: Any, addresses: dict[str, str]) -> None:
    """Make the SyncObj built with ``conf`` dial peer ``address`` at ``addresses[address]``."""
    parsed = {}
    for address, dial in addresses.items():
        host, port = dial.rsplit(":", 1)
        parsed[address] = (host.strip("[]"), int(port))
    setattr(conf, _DIAL_ADDRESSES, parsed)


def _dialling_configured_addresses(original: Callable[..., Any]) -> Callable[..., Any]:
    def connect_if_necessary_single(self: Any, node: Any) -> Any:
        # H21: a dial left unanswered (a peer's old address, gone with its container) is dropped
        # after the connection timeout, so that this attempt dials the peer where it is now.
        if drop_unanswered_dial(self, node):
            logger.info("Raft: no answer from %s within the connection timeout; dialling it again", node)
        dial = getattr(transport_conf(self), _DIAL_ADDRESSES, {}).get(getattr(node, "address", None))
        if dial is None:
            return original(self, node)
        return connect_node(self, node, *dial)

    return connect_if_necessary_single


# ---------------------------------------------------------------------------------------------
# H13: pysyncobj buffers whatever length a frame's 4-byte prefix announces, from anyone who
# reaches the Raft port and before they proved anything. With a password (H10), a connection
# proves the cluster secret with the first frame that carries the nonce this side chose for it
# (``recvRandKey``), sealed with the secret: the second frame on an incoming connection (the
# first is the peer's own nonce: sealed, but it could be a replay), the first on an outgoing one.
# Until then its frames are capped at the handshake size, whose frames are a nonce and an address.
# Without a password (``insecure``) there is nothing to prove and only the larger cap applies.
@dataclass(frozen=True)
class FrameLimits:
    """The largest frame a connection may announce; defaults are NodeConfig's."""

    handshake_bytes_max: int = 1 << 16
    authenticated_bytes_max: int = 1 << 30


_LIMITS = "_rcq_frame_limits"  # on a SyncObjConf (settings.build_conf), and on each TcpConnection
_AUTHENTICATED_BY = "_rcq_authenticated_by"  # on a TcpConnection: the nonce its peer proved
_HEADER = struct.Struct("i")  # pysyncobj's length prefix: native, signed
_REFUSED = -1


def set_frame_limits(conf: Any, limits: FrameLimits) -> None:
    """Give the connections of the SyncObj built with ``conf`` these limits."""
    setattr(conf, _LIMITS, limits)


def _stamping_incoming(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_new_incoming_connection(self: Any, conn: Any) -> Any:
        _stamp(conn, transport_conf(self))
        return original(self, conn)

    return on_new_incoming_connection


def _stamping_outgoing(original: Callable[..., Any]) -> Callable[..., Any]:
    def add_node(self: Any, node: Any) -> Any:
        result = original(self, node)
        conn = transport_connection(self, node)
        if conn is not None:
            _stamp(conn, transport_conf(self))
        return result

    return add_node


def _stamp(conn: Any, conf: Any) -> None:
    setattr(conn, _LIMITS, getattr(conf, _LIMITS, FrameLimits()))
    setattr(conn, _SEAL_KEY, getattr(conf, _SEAL_KEY, None))


def _authenticated(conn: Any) -> bool:
    if not conn.encryptor:
        return True  # no password: nothing to prove (insecure mode, H10)
    nonce = conn.recvRandKey  # None again after a disconnect, a new one on the next connection
    return nonce is not None and getattr(conn, _AUTHENTICATED_BY, None) == nonce


def _peer(conn: Any) -> str:
    try:
        host, port = connection_private(conn, "socket").getpeername()[:2]
    except (OSError, AttributeError, ValueError):
        return "(address unknown)"
    return f"{host}:{port}"


def _front_frame(conn: Any, buffer: bytearray) -> int | None:
    """The length of the frame at the front of ``buffer``; None until its header is in; _REFUSED
    (and the connection closed, its buffer dropped) when it announces more than it may."""
    if len(buffer) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack_from(buffer)
    authenticated = _authenticated(conn)
    limits: FrameLimits = getattr(conn, _LIMITS, FrameLimits())
    limit = limits.authenticated_bytes_max if authenticated else limits.handshake_bytes_max
    if 0 <= length <= limit:
        return int(length)
    _warn_refused_frame(_peer(conn), length, limit, authenticated)
    conn.disconnect()
    return _REFUSED


REFUSED_FRAME_REPORT_INTERVAL_S = 10.0  # whoever connects in a loop cannot fill the log
_refused_frames = {"next_report": 0.0, "unreported": 0}


def _warn_refused_frame(peer: str, length: int, limit: int, authenticated: bool) -> None:
    now = time.monotonic()
    if now < _refused_frames["next_report"]:
        _refused_frames["unreported"] += 1
        return
    also = _refused_frames["unreported"]
    _refused_frames.update(next_report=now + REFUSED_FRAME_REPORT_INTERVAL_S, unreported=0)
    logger.warning("Raft connection with %s announced a frame of %d bytes, over the %d allowed %s: closing it%s",
                   peer, length, limit, "to a peer" if authenticated else "before authentication",
                   f" ({also} more refused since the last report)" if also else "")


# ---------------------------------------------------------------------------------------------
# H14: pysyncobj appends every recv() to a bytes object (``readBuffer += incoming``) and cuts each
# frame off the front with a slice of the rest: a copy of everything buffered, per recv and per
# frame, so a 64 MiB frame costs about 32 GiB of copying. Here the buffer is a bytearray, extended
# in place and consumed from the front (``del``, which CPython does without moving the rest).
# Reading stops once the frame at the front is whole, so that the next frame's header is checked
# (H13) only after the frames before it, the handshake's included, were handled; what follows
# waits in the socket (pysyncobj's poller is level-triggered).
def _read_buffer(conn: Any) -> bytearray:
    buffer = connection_private(conn, "readBuffer")
    if type(buffer) is not bytearray:  # pysyncobj resets it to bytes() on connect and disconnect
        buffer = bytearray(buffer)
        set_connection_private(conn, "readBuffer", buffer)
    return buffer


def _process_read(self: Any) -> bool:
    """TcpConnection.__processRead: one recv() into the buffer; True to read on."""
    sock = connection_private(self, "socket")
    try:
        incoming = sock.recv(connection_private(self, "recvBufferSize"))
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or not incoming:
        self.disconnect()
        return False
    buffer = _read_buffer(self)
    buffer += incoming
    length = _front_frame(self, buffer)
    if length is None:
        return True
    return length != _REFUSED and len(buffer) < _HEADER.size + length


def _process_parse_message(self: Any) -> Any:
    """TcpConnection.__processParseMessage: the message of the whole frame at the front, if any."""
    buffer = _read_buffer(self)
    length = _front_frame(self, buffer)
    if length is None or length == _REFUSED or len(buffer) < _HEADER.size + length:
        return None
    end = _HEADER.size + length
    with memoryview(buffer) as view:
        frame = bytes(view[_HEADER.size:end])
    nonce = self.recvRandKey
    try:
        message = _decode(self, frame)
    except Exception:
        self.disconnect()  # pysyncobj's answer to a frame it cannot read
        return None
    del buffer[:end]
    MESSAGES.received += 1
    if nonce:
        setattr(self, _AUTHENTICATED_BY, nonce)  # the frame carried it, sealed: the peer has the secret
    return message


def _decode(conn: Any, frame: bytes) -> Any:
    """pysyncobj's decoding of a frame, its two checks raised rather than asserted (python -O); or
    the AES-GCM seal's, on a connection whose two nonces agreed to it."""
    if is_sealed(frame):
        seal = _agreed_seal(conn)
        if seal is None:
            raise ValueError("an AES-GCM frame on a connection whose handshake did not agree to it")
        return pickle.loads(seal.open(frame))  # opened: sealed by a peer with the secret
    encryptor = conn.encryptor
    if encryptor:
        timestamp = encryptor.extract_timestamp(frame)
        if timestamp < conn.recvLastTimestamp:
            raise ValueError("a frame older than the previous one")
        conn.recvLastTimestamp = timestamp
        frame = encryptor.decrypt(frame)  # InvalidToken unless sealed with the cluster secret
    message = pysyncobj_pickle.loads(zlib.decompress(frame))
    if conn.recvRandKey:
        rand_key, message = message
        if rand_key != conn.recvRandKey:
            raise ValueError("a frame without this connection's nonce")
    return message


# ---------------------------------------------------------------------------------------------
# Not a fix, a cost: pysyncobj compresses every frame with zlib at level 3 before sealing it. On
# the frames Raft sends under load (append entries of a few kilobytes, their acknowledgements) a
# py-spy profile of a leader put ~15% of its samples in TcpConnection.send, and level 3 costs ~5x
# level 1 on a 2 KB entry for the same size on the wire. Level 1 is the same zlib stream format:
# every node, of any version, decompresses it exactly as before.
WIRE_COMPRESSION_LEVEL = 1


def _send(self: Any, message: Any) -> None:
    """TcpConnection.send, compressing at :data:`WIRE_COMPRESSION_LEVEL`; or sealing with AES-GCM
    (uncompressed below wire_seal.COMPRESS_FROM_BYTES) on a connection that agreed to it."""
    seal = _agreed_seal(self)
    if seal is not None:
        data = seal.seal(pickle.dumps(message, SEALED_PICKLE_PROTOCOL))
    else:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = zlib.compress(pysyncobj_pickle.dumps(message), WIRE_COMPRESSION_LEVEL)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(pysyncobj_monotonic()))
    set_connection_private(self, "writeBuffer", connection_private(self, "writeBuffer") + _HEADER.pack(len(data)) + data)
    MESSAGES.sent += 1
    connection_private(self, "trySendBuffer")()


# ---------------------------------------------------------------------------------------------
# Not a fix, a cost: Fernet (pysyncobj's seal) costs ~30 µs per frame sent and ~40 per frame
# received; AES-GCM ~1.3 either way (rcq.server.raft.wire_seal). The nonces of pysyncobj's
# handshake carry the offer: ``_onOutgoingConnected`` sends the dialling side's, the accepting side
# answers with its own in ``_onIncomingMessageReceived``, which the dialling side takes in
# ``_onOutgoingMessageReceived``. The frames carrying the nonces stay Fernet (the receiver does not
# know the keys before it has both); each side seals what it sends afterwards once both offered.
# Sealed frames are between nodes of this version only: they carry pickle's protocol 5, where
# pysyncobj's protocol 2 writes every bytes object (each entry) as a latin-1 str to be re-encoded
# on the other side: a message of 4 entries of 400 bytes pickles in 1.8 µs instead of 9.7,
# unpickles in 2.4 instead of 11.9, and is 1,759 bytes instead of 2,675.
SEALED_PICKLE_PROTOCOL = 5
_SEAL_KEY = "_rcq_seal_key"  # on a SyncObjConf (settings.build_conf) and each TcpConnection
_SEAL = "_rcq_seal"  # on a TcpConnection: its wire_seal.Seal, valid while its nonce is recvRandKey


def set_seal_key(conf: Any, key: bytes | None) -> None:
    """Connections of the SyncObj built with ``conf`` offer and accept the AES-GCM seal, keyed by
    ``key`` (wire_seal.master_key of the cluster secret); None: Fernet only."""
    setattr(conf, _SEAL_KEY, key)


def _agreed_seal(conn: Any) -> Seal | None:
    """The seal this connection's handshake agreed to, if it did (one made for an earlier connection
    of the same TcpConnection object belongs to another nonce)."""
    seal: Seal | None = getattr(conn, _SEAL, None)
    if seal is None or conn.recvRandKey is None or seal.own_nonce is not conn.recvRandKey:
        return None
    return seal


def _agree(conn: Any, peer_nonce: object) -> None:
    key, own_nonce = getattr(conn, _SEAL_KEY, None), conn.recvRandKey
    if key is not None and offers(peer_nonce) and offers(own_nonce):
        setattr(conn, _SEAL, Seal(key, own_nonce, peer_nonce))


def _offering_when_dialling(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_outgoing_connected(self: Any, conn: Any) -> Any:
        if not (self._syncObj.encryptor and getattr(conn, _SEAL_KEY, None)):
            return original(self, conn)
        conn.setOnMessageReceivedCallback(functools.partial(self._onOutgoingMessageReceived, conn))
        conn.recvRandKey = offering_nonce()  # pysyncobj's: os.urandom(32)
        conn.send(conn.recvRandKey)
        return None

    return on_outgoing_connected


def _offering_when_accepting(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_incoming_message_received(self: Any, conn: Any, message: Any) -> Any:
        if not (self._syncObj.encryptor and not conn.sendRandKey and getattr(conn, _SEAL_KEY, None)):
            return original(self, conn, message)
        conn.sendRandKey = message  # the dialling side's nonce; then ours, as pysyncobj answers
        conn.recvRandKey = offering_nonce()
        conn.send(conn.recvRandKey)
        _agree(conn, message)
        return None

    return on_incoming_message_received


def _agreeing_when_dialled_back(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_outgoing_message_received(self: Any, conn: Any, message: Any) -> Any:
        if not conn.sendRandKey:  # the accepting side's nonce: what follows may be sealed
            _agree(conn, message)
        return original(self, conn, message)

    return on_outgoing_message_received


# ---------------------------------------------------------------------------------------------
# H15: when accept() fails with anything but EAGAIN, pysyncobj's TcpServer closes its listening
# socket, and nothing ever binds it again: one moment without a free descriptor (EMFILE) and the
# node never accepts a Raft connection again. Here running out of descriptors or memory only
# stops accepting: the socket stays bound (connections wait in its backlog), the poller forgets
# it (a pending connection would make it readable on every poll), and the transport's next tick
# after ACCEPT_RETRY_S subscribes it again. Logged once per episode; other errors are pysyncobj's.
ACCEPT_RETRY_S = 0.1
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() errors about the one connection being accepted (it was reset before we got to it, a
# protocol error, a firewall rule): the listener is fine, the next connection is accepted as usual.
_THIS_CONNECTION_ONLY = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})
_RESUME_AT = "_rcq_accept_resume_at"
_FAILING_SINCE = "_rcq_accept_failing_since"


def _on_new_connection(self: Any, descr: int, event: int) -> None:
    """TcpServer.__onNewConnection, except for accept() failing for lack of resources."""
    if event & POLL_EVENT_TYPE.READ:
        try:
            sock, _address = server_private(self, "socket").accept()
        except OSError as exc:
            if exc.errno in _OUT_OF_RESOURCES:
                _pause_accepting(self, exc)
                return
            if exc.errno in _THIS_CONNECTION_ONLY:
                return
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.unbind()  # pysyncobj's answer to any other error
                return
        else:
            _accepting_again(self)
            try:
                _hand_over(self, sock)
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.unbind()  # pysyncobj's answer, as above
                    return
    if event & POLL_EVENT_TYPE.ERROR:
        self.unbind()


def _hand_over(server: Any, sock: socket.socket) -> None:
    """What pysyncobj does with an accepted socket."""
    send_size, receive_size = server_private(server, "sendBufferSize"), server_private(server, "recvBufferSize")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_size)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    conn = TcpConnection(poller=server_private(server, "poller"), socket=sock,
                         timeout=server_private(server, "connectionTimeout"), sendBufferSize=send_size,
                         recvBufferSize=receive_size, keepalive=server_private(server, "keepalive"))
    server_private(server, "onNewConnectionCallback")(conn)


def _listener(server: Any) -> str:
    return f"{server_private(server, 'host')}:{server_private(server, 'port')}"


def _pause_accepting(server: Any, error: OSError) -> None:
    server_private(server, "poller").unsubscribe(server_private(server, "fileno"))
    setattr(server, _RESUME_AT, time.monotonic() + ACCEPT_RETRY_S)
    if getattr(server, _FAILING_SINCE, None) is None:
        setattr(server, _FAILING_SINCE, time.monotonic())
        logger.warning("Raft listener %s cannot accept a connection (%s: %s); it keeps its port and tries "
                       "again every %.1f s", _listener(server), errno.errorcode.get(error.errno or 0, error.errno),
                       error.strerror, ACCEPT_RETRY_S)


def _accepting_again(server: Any) -> None:
    since = getattr(server, _FAILING_SINCE, None)
    if since is not None:
        setattr(server, _FAILING_SINCE, None)
        logger.info("Raft listener %s accepts connections again, after %.1f s", _listener(server),
                    time.monotonic() - since)


def _resume_accepting_if_due(server: Any) -> None:
    resume_at = getattr(server, _RESUME_AT, None)
    if resume_at is None or time.monotonic() < resume_at:
        return
    setattr(server, _RESUME_AT, None)
    fileno = server_private(server, "fileno")
    if fileno is not None:  # None: unbound meanwhile (the node is stopping)
        server_private(server, "poller").subscribe(fileno, server_private(server, "onNewConnection"),
                                                   POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)


def _resuming_accepts(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_tick(self: Any) -> Any:
        server = transport_server(self)
        if server is not None:
            _resume_accepting_if_due(server)  # first: the rest of the tick may fail while descriptors lack
        return original(self)

    return on_tick


# Class-level patches: pysyncobj binds the tick callback and the accept handler when it builds
# its transport and its listener; they must be in place before.
def install() -> None:
    """Patch pysyncobj's transport once (idempotent)."""
    if getattr(TcpConnection, "_rcq_transport_fixes_installed", False):
        return
    REPLACED["read path"] += [
        replace_method("TcpConnection", "processRead", lambda _pysyncobj: _process_read),
        replace_method("TcpConnection", "processParseMessage", lambda _pysyncobj: _process_parse_message),
        replace_method("TCPTransport", "_onNewIncomingConnection", _stamping_incoming),
        replace_method("TCPTransport", "addNode", _stamping_outgoing),
    ]
    REPLACED["accept"] += [
        replace_method("TcpServer", "onNewConnection", lambda _pysyncobj: _on_new_connection),
        replace_method("TCPTransport", "_onTick", _resuming_accepts),
    ]
    REPLACED["send"].append(Replaced(TcpConnection, "send", TcpConnection.send))
    TcpConnection.send = _send
    REPLACED["seal"] += [
        replace_method("TCPTransport", "_onOutgoingConnected", _offering_when_dialling),
        replace_method("TCPTransport", "_onIncomingMessageReceived", _offering_when_accepting),
        replace_method("TCPTransport", "_onOutgoingMessageReceived", _agreeing_when_dialled_back),
    ]
    REPLACED["dialling"] += [
        replace_method("TCPTransport", "_connectIfNecessarySingle", _dialling_configured_addresses),
    ]
    TcpConnection._rcq_transport_fixes_installed = True
