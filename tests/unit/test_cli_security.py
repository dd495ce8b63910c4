"""The security of the ``rcq`` command: serve's secrets, ``rcq token``, and the client verbs' tokens.

Secrets must leave serve's environment once read and never show in an error; token files are
private and hold hashes only; a client verb without the right token gets the server's 401/403
as a one-line error, not a traceback.
"""

from __future__ import annotations

import io
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rcq import cli
from rcq.cli import admin_token_entry, main, read_cluster_secret
from rcq.errors import InvalidRequest
from rcq.server.config import NodeConfig
from rcq.tokens import Grant, TokenEntry, new_token, parse_tokens_file, token_hash
from tests.helpers.cli import rcq
from tests.helpers.nodes import serving_node

SECRET = "s3cret-cluster-key-0123456789"


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- serve
def test_the_cluster_secret_leaves_the_environment_once_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RCQ_CLUSTER_SECRET", SECRET)
    assert read_cluster_secret(None) == SECRET
    assert "RCQ_CLUSTER_SECRET" not in os.environ

    monkeypatch.setenv("RCQ_CLUSTER_SECRET", "from-the-environment-too")
    secret_file = private_file(tmp_path / "secret", SECRET + "\n")
    assert read_cluster_secret(secret_file) == SECRET  # the file wins; the variable goes all the same
    assert "RCQ_CLUSTER_SECRET" not in os.environ


def test_a_secret_file_others_may_read_is_refused_with_the_chmod_to_run(tmp_path: Path):
    secret_file = private_file(tmp_path / "secret", SECRET, mode=0o644)
    with pytest.raises(InvalidRequest) as refused:
        read_cluster_secret(secret_file)
    assert f"chmod 600 {secret_file}" in refused.value.message and SECRET not in refused.value.message


def test_the_admin_token_variable_becomes_a_hashed_admin_entry(monkeypatch: pytest.MonkeyPatch):
    token = new_token()
    monkeypatch.setenv("RCQ_ADMIN_TOKEN", token)
    entry = admin_token_entry()
    assert "RCQ_ADMIN_TOKEN" not in os.environ
    assert entry is not None and (entry.name, entry.admin, entry.sha256) == ("admin", True, token_hash(token))
    assert token not in repr(entry)
    assert admin_token_entry() is None  # not set (any more)


def test_a_short_admin_token_is_refused_without_showing_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RCQ_ADMIN_TOKEN", "short-tok")
    with pytest.raises(InvalidRequest, match="at least 16") as refused:
        admin_token_entry()
    assert "short-tok" not in refused.value.message and "RCQ_ADMIN_TOKEN" not in os.environ


@pytest.fixture
def serve_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """cmd_serve's umask and run_node, recorded instead of done."""
    calls: dict[str, Any] = {}

    def umask(mask: int) -> int:
        calls["umask"] = mask
        return 0o022

    async def run_node(config: NodeConfig) -> None:
        calls["config"] = config

    monkeypatch.setattr(os, "umask", umask)
    monkeypatch.setattr("rcq.server.node.run_node", run_node)
    return calls


def test_serve_adds_the_admin_token_to_the_config_files_tokens_and_maps_the_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        serve_calls: dict[str, Any]):
    service = TokenEntry(name="svc", sha256=token_hash(new_token()), admin=False,
                         grants=(Grant(queues="jobs", actions=("produce",)),), expires_at=None)
    config_file = private_file(tmp_path / "node.json", json.dumps({
        "node_id": "n1", "http_port": 7001, "raft_address": "127.0.0.1:8001", "data_dir": str(tmp_path / "data"),
        "tokens": [service.to_json()]}))
    admin = new_token()
    monkeypatch.setenv("RCQ_ADMIN_TOKEN", admin)
    monkeypatch.setenv("RCQ_CLUSTER_SECRET", SECRET)
    code, _, err = run(capsys, "serve", "--config", str(config_file), "--http-host", "0.0.0.0",
                       "--tokens-file", str(tmp_path / "tokens.json"), "--insecure-http",
                       "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--tls-client-ca-file", "ca.pem",
                       "--tls-peer-ca-file", "peers.pem")
    assert (code, err) == (0, "")
    config: NodeConfig = serve_calls["config"]
    assert serve_calls["umask"] == 0o077
    assert [(t.name, t.admin) for t in config.tokens] == [("svc", False), ("admin", True)]
    assert config.tokens[1].sha256 == token_hash(admin) and config.cluster_secret == SECRET
    assert (config.tokens_file, config.insecure_http) == (tmp_path / "tokens.json", True)
    assert (config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file, config.tls_peer_ca_file) == (
        Path("c.pem"), Path("k.pem"), Path("ca.pem"), Path("peers.pem"))
    assert "RCQ_ADMIN_TOKEN" not in os.environ and "RCQ_CLUSTER_SECRET" not in os.environ


def test_serve_errors_show_no_secret_and_no_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        serve_calls: dict[str, Any]):
    admin = new_token()
    monkeypatch.setenv("RCQ_ADMIN_TOKEN", admin)
    monkeypatch.setenv("RCQ_CLUSTER_SECRET", SECRET)
    code, out, err = run(capsys, "serve", "--node-id", "bad id!", "--http-port", "7001",
                         "--raft-address", "127.0.0.1:8001", "--data-dir", str(tmp_path))
    assert code == 2 and out == "" and err.startswith("rcq: invalid_request: invalid node configuration: node_id")
    assert SECRET not in err and admin not in err and token_hash(admin) not in err
    assert "config" not in serve_calls and "RCQ_CLUSTER_SECRET" not in os.environ

    monkeypatch.setenv("RCQ_CLUSTER_SECRET", "too-short")  # pydantic would echo it: it must not show
    code, _, err = run(capsys, "serve", "--node-id", "n1", "--http-port", "7001",
                       "--raft-address", "127.0.0.1:8001", "--data-dir", str(tmp_path))
    assert code == 2 and "cluster_secret" in err and "too-short" not in err


# ----------------------------------------------------------------------------- rcq token
def test_token_create_list_revoke_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    tokens_file = tmp_path / "tokens.json"
    code, out, err = run(capsys, "token", "create", "--tokens-file", str(tokens_file), "--name", "orders-svc",
                         "--grant", "produce,consume:orders.*", "--grant", "manage:orders.?", "--expires-in-days", "30",
                         "--json")
    created = json.loads(out)
    assert code == 0 and "store it now" in err and created["token"] not in err
    assert stat.S_IMODE(tokens_file.stat().st_mode) == 0o600
    [entry] = parse_tokens_file(tokens_file.read_text(), tokens_file)
    assert token_hash(created["token"]) == entry.sha256
    assert (created["name"], created["admin"], created["grants"]) == ("orders-svc", False, [
        {"queues": "orders.*", "actions": ["produce", "consume"]}, {"queues": "orders.?", "actions": ["manage"]}])
    assert entry.expires_at is not None and created["expires_at"] is not None

    code, out, _ = run(capsys, "token", "create", "--tokens-file", str(tokens_file), "--name", "ops", "--admin")
    ops_token = out.strip()
    assert code == 0 and ops_token.startswith("rcq_") and out == ops_token + "\n"
    code, out, _ = run(capsys, "token", "create", "--tokens-file", str(tokens_file), "--name", "ops", "--admin")
    assert code == 0  # a second token of the same name: rotation
    entries = parse_tokens_file(tokens_file.read_text(), tokens_file)
    assert [e.name for e in entries] == ["orders-svc", "ops", "ops"] and entries[1].sha256 == token_hash(ops_token)

    code, out, _ = run(capsys, "token", "list", "--tokens-file", str(tokens_file))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["NAME", "ADMIN", "GRANTS", "EXPIRES_AT", "EXPIRED"]
    assert lines[1].split()[:3] == ["orders-svc", "no", "produce,consume:orders.*"] and lines[1].split()[-1] == "no"
    assert lines[2].split() == ["ops", "yes", "-", "never", "no"]
    code, out, _ = run(capsys, "token", "list", "--tokens-file", str(tokens_file), "--json")
    listed = json.loads(out)["tokens"]
    assert code == 0 and [t["name"] for t in listed] == ["orders-svc", "ops", "ops"]
    assert all("sha256" not in t and not t["expired"] for t in listed)
    assert not any(e.sha256 in out for e in entries)

    code, out, _ = run(capsys, "token", "revoke", "--tokens-file", str(tokens_file), "--name", "ops")
    assert code == 0 and out.startswith("revoked 2 tokens of 'ops'")
    assert [e.name for e in parse_tokens_file(tokens_file.read_text(), tokens_file)] == ["orders-svc"]
    assert stat.S_IMODE(tokens_file.stat().st_mode) == 0o600
    code, _, err = run(capsys, "token", "revoke", "--tokens-file", str(tokens_file), "--name", "ops")
    assert code == 2 and err == f"rcq: invalid_request: no token of 'ops' in {tokens_file}\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["--name", "x", "--grant", "produce,publish:q"], "unknown action 'publish'"),
    (["--name", "x", "--grant", "produce:orders/eu"], "the queue pattern 'orders/eu' is malformed"),
    (["--name", "x", "--grant", "orders.*"], "expected ACTIONS:PATTERN"),
    (["--name", "x y", "--admin"], "is not a principal name"),
    (["--name", "x\n", "--admin"], "is not a principal name"),  # a pattern's $ must not match before a newline
    (["--name", "x", "--grant", "produce:q\n"], "the queue pattern 'q\\n' is malformed"),
    (["--name", "x"], "needs --admin or at least one --grant"),
    (["--name", "x", "--admin", "--expires-in-days", "-1"], "--expires-in-days must be more than 0"),
])
def test_a_bad_token_create_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str):
    tokens_file = tmp_path / "tokens.json"
    assert run(capsys, "token", "create", "--tokens-file", str(tokens_file), "--name", "a", "--admin")[0] == 0
    before = tokens_file.read_bytes()
    code, out, err = run(capsys, "token", "create", "--tokens-file", str(tokens_file), *argv)
    assert code == 2 and out == "" and message in err and err.startswith("rcq: invalid_request: ")
    assert tokens_file.read_bytes() == before
    fresh = tmp_path / "fresh.json"
    assert run(capsys, "token", "create", "--tokens-file", str(fresh), *argv)[0] == 2 and not fresh.exists()


def test_token_commands_refuse_a_tokens_file_others_may_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    tokens_file = private_file(tmp_path / "tokens.json", json.dumps({"tokens": []}), mode=0o640)
    for argv in (["create", "--name", "a", "--admin"], ["list"], ["revoke", "--name", "a"]):
        code, out, err = run(capsys, "token", *argv, "--tokens-file", str(tokens_file))
        assert code == 2 and out == "" and f"chmod 600 {tokens_file}" in err
    assert json.loads(tokens_file.read_text()) == {"tokens": []}


def test_token_hash_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    token = new_token()
    monkeypatch.setattr("sys.stdin", io.StringIO(token + "\n"))
    assert run(capsys, "token", "hash") == (0, token_hash(token) + "\n", "")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run(capsys, "token", "hash")
    assert code == 2 and "no token on stdin" in err


# ----------------------------------------------------------------------------- client verbs
PRODUCER, ADMIN = new_token(), new_token()


@pytest.fixture
async def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """An in-process node that requires tokens: an admin, and a producer on queues other.*."""
    monkeypatch.delenv("RCQ_TOKEN", raising=False)
    monkeypatch.delenv("RCQ_CA_FILE", raising=False)
    tokens = (TokenEntry(name="ops", sha256=token_hash(ADMIN), admin=True, grants=(), expires_at=None),
              TokenEntry(name="producer", sha256=token_hash(PRODUCER), admin=False,
                         grants=(Grant(queues="other.*", actions=("produce",)),), expires_at=None))
    config = NodeConfig(node_id="n1", http_port=0, raft_address="127.0.0.1:10001", data_dir=tmp_path / "data",
                        insecure=True, tokens=tokens)
    async with serving_node(config) as node_url:
        yield node_url


async def test_a_verb_without_a_token_gets_401_and_works_with_token_file(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    code, out, err = await rcq(capsys, "enqueue", "--url", url, "jobs", "x")
    assert code == 2 and out == "" and err.startswith("rcq: unauthorized: ") and "Traceback" not in err
    assert "--token-file" in err

    token_file = private_file(tmp_path / "token", ADMIN + "\n")
    assert (await rcq(capsys, "enqueue", "--token-file", str(token_file), "--url", url, "jobs", "x"))[0] == 0
    assert await rcq(capsys, "count", "--token-file", str(token_file), "--url", url, "jobs") == (0, "1\n", "")
    code, out, err = await rcq(capsys, "status", "--token-file", str(token_file), "--url", url)
    assert code == 0 and err == "" and out.splitlines()[1].split()[:3] == [url, "n1", "leader"]

    monkeypatch.setenv("RCQ_TOKEN", ADMIN)
    assert await rcq(capsys, "count", "--url", url, "jobs") == (0, "1\n", "")
    monkeypatch.setenv("RCQ_TOKEN", new_token())
    code, _, err = await rcq(capsys, "count", "--url", url, "jobs")
    assert code == 2 and err.startswith("rcq: unauthorized: the token is not valid on this node")


async def test_a_verb_the_token_does_not_grant_gets_403(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    token_file = private_file(tmp_path / "token", PRODUCER)
    assert (await rcq(capsys, "enqueue", "--token-file", str(token_file), "--url", url, "other.q", "x"))[0] == 0
    code, out, err = await rcq(capsys, "enqueue", "--token-file", str(token_file), "--url", url, "jobs", "x")
    assert code == 2 and out == "" and err == "rcq: forbidden: principal 'producer' may not produce queue 'jobs'\n"


async def test_a_token_file_must_be_private_and_hold_one_token(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    token_file = private_file(tmp_path / "token", ADMIN, mode=0o644)
    code, _, err = await rcq(capsys, "count", "--token-file", str(token_file), "--url", url, "jobs")
    assert code == 2 and f"chmod 600 {token_file}" in err and ADMIN not in err
    token_file = private_file(tmp_path / "two", f"{ADMIN}\n{PRODUCER}\n")
    code, _, err = await rcq(capsys, "count", "--token-file", str(token_file), "--url", url, "jobs")
    assert code == 2 and "must hold one token" in err and ADMIN not in err and PRODUCER not in err


async def test_unusable_tls_files_are_a_clear_error(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    missing = tmp_path / "missing-ca.pem"
    code, _, err = await rcq(capsys, "count", "--ca-file", str(missing), "--url", url, "jobs")
    assert code == 2 and err.startswith(f"rcq: invalid_request: cannot use the TLS files ({missing})")
    code, _, err = await rcq(capsys, "count", "--client-key", str(missing), "--url", url, "jobs")
    assert code == 2 and "--client-key goes with --client-cert" in err


def test_the_client_gets_the_token_ca_and_certificate_of_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RCQ_CA_FILE", "/etc/rcq/ca.pem")
    key = private_file(tmp_path / "client.key", "key")
    token_file = private_file(tmp_path / "token", ADMIN)
    args = cli.build_parser().parse_args(["count", "q", "--token-file", str(token_file),
                                          "--client-cert", "client.pem", "--client-key", str(key)])
    assert cli.client_security(args) == {"token": ADMIN, "ca_file": "/etc/rcq/ca.pem",
                                          "client_cert": (Path("client.pem"), key)}
    key.chmod(0o644)
    with pytest.raises(InvalidRequest, match="chmod 600"):
        cli.client_security(args)
