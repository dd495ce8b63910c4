"""What a local cluster keeps in its directory: the layout, the manifest, the TLS material, the tokens.

:class:`rcq.local.cluster.LocalCluster` decides what each node's config says and when files are
written; this module knows where each file goes and what it holds. Layout of ``base_dir``::

    cluster.json            what is needed to reopen the cluster (no secret)
    admin.token             the admin token, plain (mode 0600; with auth)
    tls/ca.pem, ca.key      the cluster's CA (with tls; every key mode 0600)
    tls/node-0.pem, .key    node 0's HTTPS certificate (127.0.0.1 and localhost) and key
    tls/client.pem, .key    a client certificate (with tls_client_certificates)
    node-0/config.json      NodeConfig of node 0 (mode 0600)
    node-0/tokens.json      the tokens node 0 accepts, hashed (mode 0600; with auth)
    node-0/data/            its Raft journal and LMDB snapshot
    node-0/node.log         its stdout and stderr, across restarts

Every file holding a secret (the configs hold the cluster secret) is written readable by its
owner only (:func:`rcq.private_files.write_private`).

Must not import: rcq.local.cluster (it builds on this), rcq.server (the token model, what a
tokens file holds, is rcq.tokens), pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from rcq.local.nodes import LocalNode
from rcq.local.tls import CA_NAME, CertFiles, write_ca, write_certificate
from rcq.private_files import read_private, write_private
from rcq.tokens import Grant, TokenEntry, new_token, parse_tokens_file, token_hash, tokens_file_text

MANIFEST_NAME = "cluster.json"
MANIFEST_VERSION = 1  # a manifest without "auth" and "tls" (made before them) is a cluster without either
ADMIN_TOKEN_NAME = "admin.token"
ADMIN_PRINCIPAL = "admin"
TLS_DIRECTORY = "tls"
CLIENT_CERT_NAME = "client"  # the client certificate of a cluster that requires them


# ------------------------------------------------------------------ the manifest
def read_manifest(base_dir: Path) -> dict[str, Any]:
    """The manifest of the cluster in ``base_dir``; ValueError if this version cannot read it."""
    manifest: dict[str, Any] = json.loads((base_dir / MANIFEST_NAME).read_text())
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{base_dir / MANIFEST_NAME}: unknown version {manifest.get('version')!r}")
    return manifest


def write_manifest(base_dir: Path, fields: Mapping[str, Any], nodes: Iterable[LocalNode]) -> None:
    """The manifest: ``fields`` (what the cluster was made with) and each node's id, ports and directory."""
    manifest = {
        "version": MANIFEST_VERSION, **fields,
        "nodes": [{"index": n.index, "node_id": n.node_id, "http_port": n.http_port,
                   "raft_port": n.raft_port, "directory": n.directory.name} for n in nodes],
    }
    write_private(base_dir / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")


def write_node_config(node: LocalNode, config: dict[str, Any]) -> None:
    """Node ``node``'s config file, in the fields its release knows (an older NodeConfig refuses others)."""
    node.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if node.release is not None:
        config = node.release.node_config(config)
    write_private(node.config_path, json.dumps(config, indent=2) + "\n")


# ------------------------------------------------------------------ TLS
def tls_files(base_dir: Path, name: str) -> CertFiles:
    """Where the certificate and key called ``name`` are (``ca``, a node id, ``client``)."""
    directory = base_dir / TLS_DIRECTORY
    return CertFiles(directory / f"{name}.pem", directory / f"{name}.key")


def make_certificates(base_dir: Path, node_ids: Iterable[str], client: bool) -> tuple[Path, CertFiles | None]:
    """A new CA, a certificate of it for each node, and one for a client if ``client``:
    (the CA's certificate, the client's certificate or None)."""
    ca = write_ca(base_dir / TLS_DIRECTORY)
    for node_id in node_ids:
        write_certificate(ca, ca.cert.parent, node_id)
    return ca.cert, write_certificate(ca, ca.cert.parent, CLIENT_CERT_NAME) if client else None


def add_node_certificate(base_dir: Path, node_id: str) -> None:
    """A certificate of the cluster's CA for a node added later, as the first nodes have."""
    ca = tls_files(base_dir, CA_NAME)
    write_certificate(ca, ca.cert.parent, node_id)


# ------------------------------------------------------------------ tokens
class ClusterTokens:
    """The tokens every node of the cluster accepts (their hashes go to each node's tokens file), and
    the plain tokens :meth:`add` made, which the files never hold."""

    def __init__(self, entries: Iterable[TokenEntry] = ()) -> None:
        self._entries = list(entries)
        self._issued: dict[str, str] = {}  # sha256 -> plain token, of those add made and not revoked
        self.issued_tokens: list[str] = []  # every token add made, revoked ones too

    @classmethod
    def for_admin(cls, token: str) -> ClusterTokens:
        return cls([TokenEntry(name=ADMIN_PRINCIPAL, sha256=token_hash(token), admin=True, grants=(),
                               expires_at=None)])

    @classmethod
    def read(cls, tokens_path: Path) -> ClusterTokens:
        """The tokens of a node's tokens file (a reopened cluster's)."""
        return cls(parse_tokens_file(read_private(tokens_path, "tokens"), tokens_path))

    def add(self, name: str, grants: Iterable[Grant | Mapping[str, Any]], admin: bool,
            expires_at: datetime | None) -> str:
        """A new token of principal ``name``; returns it (write the files next)."""
        token = new_token()
        entry = TokenEntry(name=name, sha256=token_hash(token), admin=admin, expires_at=expires_at,
                           grants=tuple(g if isinstance(g, Grant) else Grant.from_json(g) for g in grants))
        self._entries.append(entry)
        self._issued[entry.sha256] = token
        self.issued_tokens.append(token)
        return token

    def revoke(self, name: str) -> tuple[int, list[str]]:
        """Remove every token of principal ``name``: (how many, the plain ones :meth:`add` made)."""
        revoked = [e for e in self._entries if e.name == name]
        self._entries = [e for e in self._entries if e.name != name]
        return len(revoked), [self._issued.pop(e.sha256) for e in revoked if e.sha256 in self._issued]

    def write(self, nodes: Iterable[LocalNode]) -> None:
        """Each node's tokens file (nodes re-read it within a second)."""
        text = tokens_file_text(self._entries)
        for node in nodes:
            write_private(node.tokens_path, text)
