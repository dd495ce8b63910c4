"""API tokens: hashing, the constant-time check, permissions, expiry, the reloaded tokens file."""

from __future__ import annotations

import hmac
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rcq.errors import Forbidden, InvalidRequest, TokenExpired, Unauthorized
from rcq.server.security import tokens
from rcq.server.security.tokens import (
    OPEN,
    Grant,
    Principal,
    TokenEntry,
    TokenRegistry,
    match_token,
    new_token,
    token_hash,
)


def entry(name: str, token: str, **fields: object) -> TokenEntry:
    return TokenEntry.model_validate({"name": name, "sha256": token_hash(token), **fields})


def write_tokens(path: Path, entries: list[TokenEntry], mode: int = 0o600) -> None:
    path.write_text(json.dumps({"tokens": [e.model_dump(mode="json") for e in entries]}))
    path.chmod(mode)


def test_tokens_are_random_prefixed_and_stored_as_sha256():
    first, second = new_token(), new_token()
    assert first != second and first.startswith("rcq_") and len(first) >= 40
    assert len(token_hash(first)) == 64 and token_hash(first) != token_hash(second)


def test_match_compares_with_every_entry_whatever_the_token(monkeypatch: pytest.MonkeyPatch):
    """The check's work must not depend on the presented value: every stored digest is compared
    with hmac.compare_digest (constant time), with no early exit at a match or at a mismatch."""
    stored = [new_token() for _ in range(5)]
    entries = [entry(f"p{i}", t) for i, t in enumerate(stored)]
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", counting)
    for presented, expected in [(stored[0], "p0"), (stored[4], "p4"), ("rcq_wrong", None),
                                (stored[2][:-1], None), ("", None)]:
        calls.clear()
        found = match_token(presented, entries)
        assert (found.name if found else None) == expected
        assert len(calls) == len(entries)
        # Equal-length digests only: compare_digest's time then depends on the length alone.
        assert {len(a) for a, _ in calls} == {len(b) for _, b in calls} == {64}


def test_a_grant_covers_its_actions_on_matching_queues_only():
    principal = Principal("orders-svc", admin=False, grants=(
        Grant(queues="orders.*", actions=("produce", "consume")), Grant(queues="audit", actions=("produce",))))
    assert principal.may("produce", "orders.eu") and principal.may("consume", "orders.")
    assert not principal.may("manage", "orders.eu")
    assert not principal.may("consume", "audit") and principal.may("produce", "audit")
    assert not principal.may("produce", "orders") and not principal.may("produce", "other")
    assert principal.may_see("audit") and not principal.may_see("payroll")
    with pytest.raises(Forbidden) as raised:
        principal.require("consume", "payroll")
    assert raised.value.http_status == 403 and raised.value.details == {"action": "consume", "queue": "payroll"}
    with pytest.raises(Forbidden):
        principal.require_admin("read metrics")
    admin = Principal("root", admin=True)
    assert admin.may("manage", "anything") and admin.may_see("x")
    admin.require_admin("read metrics")


def test_question_mark_matches_one_character_and_brackets_are_not_patterns():
    assert Grant(queues="q?", actions=("consume",)).covers("consume", "q1")
    assert not Grant(queues="q?", actions=("consume",)).covers("consume", "q12")
    with pytest.raises(ValueError):
        Grant(queues="q[12]", actions=("consume",))
    with pytest.raises(ValueError):
        Grant(queues="q", actions=())
    with pytest.raises(ValueError):
        Grant(queues="q", actions=("delete",))  # type: ignore[arg-type]


def test_registry_without_tokens_is_open():
    registry = TokenRegistry()
    assert not registry.enabled and registry.authenticate(None) is OPEN and not OPEN.authenticated


def test_registry_refuses_missing_unknown_and_expired_tokens():
    good, old = new_token(), new_token()
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    registry = TokenRegistry((entry("svc", good), entry("old", old, expires_at=now - timedelta(seconds=1))),
                             clock=now.timestamp)
    assert registry.authenticate(good) == Principal("svc", admin=False, grants=())
    for presented in (None, "", "rcq_unknown", good + "x", good.upper()):
        with pytest.raises(Unauthorized) as raised:
            registry.authenticate(presented)
        assert raised.value.http_status == 401 and good not in raised.value.message
    with pytest.raises(TokenExpired) as expired:
        registry.authenticate(old)
    assert expired.value.code == "token_expired" and expired.value.http_status == 401


def test_the_tokens_file_must_be_private_and_valid(tmp_path: Path):
    path = tmp_path / "tokens.json"
    write_tokens(path, [entry("svc", new_token())], mode=0o640)
    with pytest.raises(InvalidRequest, match="chmod 600"):
        TokenRegistry(path=path)
    path.chmod(0o600)
    path.write_text('{"tokens": [{"name": "svc", "sha256": "not-hex"}]}')
    with pytest.raises(InvalidRequest) as raised:
        TokenRegistry(path=path)
    assert "tokens.0.sha256" in raised.value.message and "not-hex" not in raised.value.message


def test_a_changed_tokens_file_is_reread_and_a_broken_one_keeps_the_old_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "tokens.json"
    first, second = new_token(), new_token()
    monkeypatch.setattr(tokens, "RELOAD_CHECK_INTERVAL_S", 0.0)
    write_tokens(path, [entry("a", first)])
    registry = TokenRegistry(path=path)
    assert registry.authenticate(first).name == "a"
    write_tokens(path, [entry("b", second)])  # first revoked, second added
    os.utime(path, ns=(1, 1))  # a distinct stamp even within one mtime tick
    assert registry.authenticate(second).name == "b"
    with pytest.raises(Unauthorized):
        registry.authenticate(first)
    path.write_text("{not json")
    assert registry.authenticate(second).name == "b"  # the broken file is logged and ignored
    path.chmod(0o644)
    write_tokens(path, [entry("c", first)], mode=0o644)
    with pytest.raises(Unauthorized):
        registry.authenticate(first)  # a file others may read is not used
