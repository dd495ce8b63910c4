"""NodeConfig: defaults, cross-field rules whose messages name both fields, renamed fields."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rcq import limits
from rcq.errors import InvalidRequest
from rcq.server.config import RENAMED_FIELDS, NodeConfig, load_config

BASE = {"node_id": "n0", "http_port": 0, "raft_address": "127.0.0.1:7100", "data_dir": "/tmp/rcq-n0",
        "cluster_secret": "a-secret-of-sixteen-or-more"}


def test_defaults_come_from_one_place():
    config = load_config(None, **BASE)
    assert (config.dequeue_items_max, config.transaction_timeout_max_s, config.transaction_bytes_max,
            config.commit_entry_bytes_max) == (limits.DEQUEUE_ITEMS_MAX, limits.TRANSACTION_TIMEOUT_MAX_S,
                                               limits.TRANSACTION_BYTES_MAX, limits.COMMIT_ENTRY_BYTES_MAX)
    assert config.leader_fallback_timeout_s < config.raft_timeout_min_s < config.raft_timeout_max_s


@pytest.mark.parametrize(("overrides", "both_fields"), [
    ({"raft_timeout_min_s": 2.0, "raft_timeout_max_s": 1.0}, ("raft_timeout_min_s", "raft_timeout_max_s")),
    ({"leader_fallback_timeout_s": 0.9}, ("leader_fallback_timeout_s", "raft_timeout_min_s")),
    ({"connection_timeout_s": 1.0}, ("connection_timeout_s", "raft_timeout_max_s")),
    ({"item_bytes_max": 2048, "body_bytes_max": 1024}, ("item_bytes_max", "body_bytes_max")),
])
def test_a_cross_field_error_names_both_fields(overrides, both_fields):
    with pytest.raises(InvalidRequest) as raised:
        load_config(None, **{**BASE, **overrides})
    assert all(field in raised.value.message for field in both_fields), raised.value.message


def test_a_renamed_field_says_what_it_is_called_now(tmp_path: Path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({**BASE, "raft_min_timeout_s": 0.8, "commands_queue_size": 100}))
    path.chmod(0o600)
    with pytest.raises(InvalidRequest) as raised:
        load_config(path)
    assert "raft_min_timeout_s is now raft_timeout_min_s" in raised.value.message
    assert "commands_queue_size is now commands_queued_max" in raised.value.message


def test_every_renamed_field_exists_under_its_new_name():
    assert set(RENAMED_FIELDS.values()) <= set(NodeConfig.model_fields)
    assert not set(RENAMED_FIELDS) & set(NodeConfig.model_fields)


def test_no_cluster_secret_needs_insecure():
    fields = {k: v for k, v in BASE.items() if k != "cluster_secret"}
    with pytest.raises(InvalidRequest, match="cluster_secret is required"):
        load_config(None, **fields)
    assert load_config(None, **fields, insecure=True).insecure


def test_durability_is_fsync_unless_asked_and_picks_the_log_file():
    config = load_config(None, **BASE)
    assert config.durability == "fsync" and config.journal_path.name == "raft.wal"
    assert load_config(None, **BASE, durability="os").journal_path.name == "raft.journal"
    with pytest.raises(InvalidRequest, match="journal_flush_interval_s applies to durability=os only"):
        load_config(None, **BASE, journal_flush_interval_s=0.05)
    with pytest.raises(InvalidRequest):
        load_config(None, **BASE, durability="sometimes")


SECRET = "sixteen-plus-characters-SECRET-7f3a9c"


@pytest.mark.parametrize("overrides", [
    {"raft_timeout_min_s": 2.0, "raft_timeout_max_s": 1.0},  # a cross-field rule (model validator)
    {"http_port": "not-a-port"},  # a field error
    {"cluster_secret": "short"},  # an error about the secret itself
    {"tokens": [{"name": "svc", "sha256": SECRET}]},  # a token hash that is not one
])
def test_no_configuration_error_echoes_a_value(overrides):
    """pydantic puts the input (the whole config, secret included) into its messages; ours never do."""
    with pytest.raises(InvalidRequest) as raised:
        load_config(None, **{**BASE, "cluster_secret": SECRET, **overrides})
    message = raised.value.message
    assert SECRET not in message and SECRET[-8:] not in message and "short" not in message, message
    assert "input_value" not in message


def test_a_config_file_holding_the_secret_must_be_private(tmp_path: Path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(BASE))
    path.chmod(0o644)
    with pytest.raises(InvalidRequest, match="chmod 600") as raised:
        load_config(path)
    assert BASE["cluster_secret"] not in raised.value.message
    path.chmod(0o600)
    assert load_config(path).cluster_secret == BASE["cluster_secret"]
    public = tmp_path / "public.json"  # no secret in it (it comes from elsewhere): any mode will do
    public.write_text(json.dumps({k: v for k, v in BASE.items() if k != "cluster_secret"}))
    public.chmod(0o644)
    assert load_config(public, cluster_secret=SECRET).cluster_secret == SECRET


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "rcq.example"])
def test_a_non_loopback_listener_needs_tokens_or_insecure_http(host: str):
    with pytest.raises(InvalidRequest, match="insecure_http"):
        load_config(None, **BASE, http_host=host)
    assert load_config(None, **BASE, http_host=host, insecure_http=True).insecure_http
    hashed = {"name": "svc", "sha256": "0" * 64}
    assert load_config(None, **BASE, http_host=host, tokens=[hashed]).auth_enabled


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"])
def test_loopback_listeners_may_run_without_tokens(host: str):
    assert not load_config(None, **BASE, http_host=host).auth_enabled


def test_tls_files_go_together_and_make_the_url_https(tmp_path: Path):
    with pytest.raises(InvalidRequest, match="tls_cert_file and tls_key_file"):
        load_config(None, **BASE, tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(InvalidRequest, match="tls_client_ca_file"):
        load_config(None, **BASE, tls_client_ca_file=tmp_path / "ca.pem")
    config = load_config(None, **BASE, tls_cert_file=tmp_path / "c.pem", tls_key_file=tmp_path / "k.pem")
    assert config.url.startswith("https://")


def test_previous_cluster_secrets_are_checked_and_never_shown():
    previous = "an-older-secret-of-16-plus"
    config = load_config(None, **BASE, cluster_secrets_previous=[previous])
    assert config.cluster_secrets_previous == (previous,) and previous not in repr(config)
    for bad, problem in ([["short"], "at least 16"], [[BASE["cluster_secret"]], "must not repeat"]):
        with pytest.raises(InvalidRequest, match=problem) as raised:
            load_config(None, **BASE, cluster_secrets_previous=bad)
        assert BASE["cluster_secret"] not in raised.value.message
    fields = {k: v for k, v in BASE.items() if k != "cluster_secret"}
    with pytest.raises(InvalidRequest, match="needs cluster_secret"):
        load_config(None, **fields, insecure=True, cluster_secrets_previous=[previous])


def test_a_renamed_setting_is_read_as_its_new_names_with_a_warning_naming_them(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="rcq.server.config"):
        config = load_config(None, **BASE, commit_batch_bytes_max=4 << 20)
    assert (config.transaction_bytes_max, config.commit_entry_bytes_max) == (4 << 20, 4 << 20)
    (record,) = [r for r in caplog.records if "commit_batch_bytes_max" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "transaction_bytes_max" in record.getMessage() and "commit_entry_bytes_max" in record.getMessage()


def test_a_new_name_given_beside_the_old_one_wins():
    config = load_config(None, **BASE, commit_batch_bytes_max=4 << 20, commit_entry_bytes_max=2 << 20)
    assert (config.transaction_bytes_max, config.commit_entry_bytes_max) == (4 << 20, 2 << 20)
