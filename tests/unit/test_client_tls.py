"""A node whose TLS certificate the client cannot verify: a CertificateError at once (retrying cannot
help) whose message says how to give the CA, in the client (HTTP and the session channel alike), in
the ``rcq`` command and in ``rcq backup``; given the CA, the same node answers (issue 35: a newcomer
met a bare "certificate verify failed")."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from rcq.cli.backup import save_backup
from rcq.client import CertificateError, RcqClient
from rcq.local.tls import CertFiles, write_ca, write_certificate
from tests.helpers.cli import rcq
from tests.helpers.fakes import MEMBERS, N1, N2, FakeNode

HINT = "pass the CA that signed it: --ca-file FILE or RCQ_CA_FILE with the rcq command, ca_file=FILE with RcqClient"


@asynccontextmanager
async def https_fake(certificate: CertFiles) -> AsyncIterator[FakeNode]:
    """A :class:`FakeNode` serving HTTPS with ``certificate`` on a loopback port."""
    node = FakeNode()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", node.handle)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate.cert, certificate.key)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    node.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield node
    finally:
        await runner.cleanup()


@pytest.fixture
def ca(tmp_path: Path) -> CertFiles:
    """A throwaway CA: its own certificate is self-signed."""
    return write_ca(tmp_path / "tls")


@pytest.fixture
async def self_signed(ca: CertFiles) -> AsyncIterator[FakeNode]:
    """A node presenting a self-signed certificate (the CA's own) that no client was given."""
    async with https_fake(ca) as node:
        node.answer("GET", MEMBERS, {"leader_id": "n1", "members": [N1, N2]})
        yield node


async def test_the_client_says_how_to_give_the_ca_over_http_and_over_the_channel(self_signed: FakeNode):
    async with RcqClient(self_signed.url, retry_timeout_s=5) as client:
        with pytest.raises(CertificateError) as over_http:
            await client.cluster_members()
        with pytest.raises(CertificateError) as over_the_channel:
            await client.enqueue("jobs", "x")
    for raised in (over_http, over_the_channel):
        message = raised.value.message
        assert message.startswith(f"cannot verify the TLS certificate of {self_signed.url}: ")
        assert "self-signed certificate" in message and message.endswith(f"{HINT} or SyncClient")
    assert self_signed.requests == []  # no request got through


async def test_the_rcq_command_prints_the_hint_and_the_ca_file_is_the_cure(
        self_signed: FakeNode, ca: CertFiles, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    code, out, err = await rcq(capsys, "cluster", "members", "--url", self_signed.url)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1
    assert err.startswith(f"rcq: certificate_error: cannot verify the TLS certificate of {self_signed.url}: ")
    assert HINT in err

    node = write_certificate(ca, tmp_path / "tls", "node")  # signed by the CA, naming 127.0.0.1
    async with https_fake(node) as verified:
        verified.answer("GET", MEMBERS, {"leader_id": "n1", "members": [N1, N2]})
        code, out, _ = await rcq(capsys, "cluster", "members", "--url", verified.url, "--ca-file", str(ca.cert))
        assert code == 0 and out.splitlines()[1].split()[0] == "n1"
        monkeypatch.setenv("RCQ_CA_FILE", str(ca.cert))
        code, _, _ = await rcq(capsys, "cluster", "members", "--url", verified.url)
        assert code == 0 and len(verified.requests) == 2


async def test_a_backup_fails_with_the_hint_rather_than_no_node_answered(self_signed: FakeNode, tmp_path: Path):
    with pytest.raises(CertificateError) as raised:
        await save_backup([self_signed.url], tmp_path / "backup.rcqb", token=None)
    assert HINT in raised.value.message
    assert not (tmp_path / "backup.rcqb").exists() and not (tmp_path / "backup.rcqb.part").exists()
