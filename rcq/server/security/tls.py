"""The TLS context of a node's HTTP listener.

TLS 1.2 at least, Python's default ciphers; with ``tls_client_ca_file`` a client must present a
certificate signed by that CA (mutual TLS), checked before any HTTP is read.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import ssl

from rcq.errors import InvalidRequest
from rcq.private_files import check_private
from rcq.server.config import NodeConfig


def server_context(config: NodeConfig) -> ssl.SSLContext | None:
    """The listener's SSL context, or None when the node serves plain HTTP."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    check_private(config.tls_key_file, "TLS key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(config.tls_cert_file), str(config.tls_key_file))
        if config.tls_client_ca_file is not None:
            context.load_verify_locations(cafile=str(config.tls_client_ca_file))
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot use the TLS files ({config.tls_cert_file}, {config.tls_key_file}): "
                             f"{exc}") from None
    return context


def peer_context(config: NodeConfig) -> ssl.SSLContext | None:
    """How this node verifies the other nodes' HTTPS (the status page asks them): ``tls_peer_ca_file``,
    else the system's CAs; presenting its own certificate, for peers that require client certificates.
    None when this node serves plain HTTP (its peers do too)."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.create_default_context(cafile=str(config.tls_peer_ca_file) if config.tls_peer_ca_file else None)
    try:
        context.load_cert_chain(str(config.tls_cert_file), str(config.tls_key_file))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot use the TLS files for peer requests: {exc}") from None
    return context
