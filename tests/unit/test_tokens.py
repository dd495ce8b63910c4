"""API tokens: hashing, the constant-time check, permissions, expiry, the reloaded tokens file,
and the file format, checked with the standard library as pydantic checked it before."""

from __future__ import annotations

import hmac
import json
import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from rcq import tokens
from rcq.errors import Forbidden, InvalidRequest, TokenExpired, Unauthorized
from rcq.tokens import (
    OPEN,
    Grant,
    Principal,
    TokenEntry,
    TokenFormatError,
    TokenRegistry,
    match_token,
    new_token,
    parse_tokens_file,
    token_hash,
    tokens_file_text,
)


def entry(name: str, token: str, **fields: object) -> TokenEntry:
    return TokenEntry(name=name, sha256=token_hash(token), **fields)  # type: ignore[arg-type]


def write_tokens(path: Path, entries: list[TokenEntry], mode: int = 0o600) -> None:
    path.write_text(json.dumps({"tokens": [e.to_json() for e in entries]}))
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


# ------------------------------------------------------------------ the file format
HASH = "0" * 64


def test_an_entry_goes_to_json_and_back_unchanged():
    moment = datetime(2026, 11, 22, 12, 30, 5, 7, tzinfo=UTC)
    entry = TokenEntry(name="svc@eu", sha256=HASH, admin=False, expires_at=moment,
                       grants=(Grant(queues="orders.*", actions=("produce", "consume")),))
    assert entry.to_json() == {"name": "svc@eu", "sha256": HASH, "admin": False, "expires_at": "2026-11-22T12:30:05.000007Z",
                               "grants": [{"queues": "orders.*", "actions": ["produce", "consume"]}]}
    assert TokenEntry.from_json(json.loads(json.dumps(entry.to_json()))) == entry
    plus_two = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert TokenEntry(name="a", sha256=HASH, expires_at=plus_two).to_json()["expires_at"] == "2026-01-01T00:00:00+02:00"


def test_a_tokens_file_written_before_still_reads(tmp_path: Path):
    """The file the pydantic model wrote (rcq token create), and the harness's shorter one."""
    written_before = json.dumps({"tokens": [
        {"name": "ops", "sha256": HASH, "admin": True, "grants": [], "expires_at": None},
        {"name": "svc", "sha256": HASH, "admin": False, "grants": [{"queues": "q?", "actions": ["consume"]}],
         "expires_at": "2026-11-22T12:00:00Z"}]}, indent=2) + "\n"
    ops, svc = parse_tokens_file(written_before, tmp_path / "tokens.json")
    assert (ops.name, ops.admin, svc.grants, svc.expires_at) == (
        "ops", True, (Grant("q?", ("consume",)),), datetime(2026, 11, 22, 12, tzinfo=UTC))
    assert tokens_file_text([ops, svc]) == written_before
    short_form = json.dumps({"tokens": [{"name": "svc", "sha256": HASH}]})
    [short] = parse_tokens_file(short_form, tmp_path / "t.json")
    assert (short.admin, short.grants, short.expires_at) == (False, (), None)
    assert parse_tokens_file("{}", tmp_path / "t.json") == ()


def test_lenient_spellings_pydantic_accepted_are_still_accepted():
    entry = TokenEntry.from_json({"name": "a", "sha256": HASH, "admin": "yes", "expires_at": 1_700_000_000})
    assert entry.admin is True and entry.expires_at == datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert TokenEntry.from_json({"name": "a", "sha256": HASH, "admin": 0, "expires_at": 1_700_000_000_000}).expires_at \
        == entry.expires_at  # milliseconds, past 2e10


@pytest.mark.parametrize("document, expected", [
    ([], "(whole): Input should be a valid dictionary"),
    ({"tokens": {}}, "tokens: Input should be a valid list"),
    ({"tokens": [], "more": 1}, "more: Extra inputs are not permitted"),
    ({"tokens": [7]}, "tokens.0: Input should be a valid dictionary"),
    ({"tokens": [{"sha256": HASH}]}, "tokens.0.name: Field required"),
    ({"tokens": [{"name": "a b", "sha256": HASH}]}, "tokens.0.name: String should match pattern '^[A-Za-z0-9._@-]{1,64}$'"),
    ({"tokens": [{"name": "a\n", "sha256": HASH}]}, "tokens.0.name: String should match pattern"),
    ({"tokens": [{"name": "a", "sha256": HASH, "owner": "x"}]}, "tokens.0.owner: Extra inputs are not permitted"),
    ({"tokens": [{"name": "a", "sha256": HASH, "admin": "maybe"}]}, "tokens.0.admin: Input should be a valid boolean"),
    ({"tokens": [{"name": "a", "sha256": HASH, "grants": {}}]}, "tokens.0.grants: Input should be a valid tuple"),
    ({"tokens": [{"name": "a", "sha256": HASH, "grants": [{"queues": "q"}]}]}, "tokens.0.grants.0.actions: Field required"),
    ({"tokens": [{"name": "a", "sha256": HASH, "grants": [{"queues": "q", "actions": []}]}]},
     "tokens.0.grants.0.actions: Tuple should have at least 1 item after validation, not 0"),
    ({"tokens": [{"name": "a", "sha256": HASH, "grants": [{"queues": "q", "actions": ["delete"]}]}]},
     "tokens.0.grants.0.actions.0: Input should be 'produce', 'consume' or 'manage'"),
    ({"tokens": [{"name": "a", "sha256": HASH, "grants": [{"queues": "q[12]", "actions": ["consume"]}]}]},
     "tokens.0.grants.0.queues: String should match pattern '^[A-Za-z0-9._*?-]{1,128}$'"),
    ({"tokens": [{"name": "a", "sha256": HASH, "expires_at": "2026-11-22T12:00:00"}]},
     "tokens.0.expires_at: Input should have timezone info"),
    ({"tokens": [{"name": "a", "sha256": HASH, "expires_at": "soon"}]}, "tokens.0.expires_at: Input should be a valid datetime"),
    ({"tokens": [{"name": "a", "sha256": HASH, "expires_at": True}]}, "tokens.0.expires_at: Input should be a valid datetime"),
])
def test_each_broken_rule_of_the_file_is_named_by_its_place(tmp_path: Path, document: object, expected: str):
    with pytest.raises(InvalidRequest) as raised:
        parse_tokens_file(json.dumps(document), tmp_path / "tokens.json")
    assert raised.value.message.startswith(f"tokens file {tmp_path / 'tokens.json'}: ")
    assert expected in raised.value.message, raised.value.message


def test_a_format_error_lists_five_problems_counts_the_rest_and_echoes_no_value(tmp_path: Path):
    secret = "s3cret " + new_token()  # a space: not a name either
    document = {"tokens": [{"name": secret, "sha256": secret, "admin": secret, "grants": secret, "expires_at": secret,
                            "owner": secret}]}
    with pytest.raises(InvalidRequest) as raised:
        parse_tokens_file(json.dumps(document), tmp_path / "tokens.json")
    assert raised.value.message.endswith("; and 1 more") and raised.value.message.count("; ") == 5
    assert "s3cret" not in raised.value.message


def test_constructing_a_malformed_entry_fails_like_reading_one():
    with pytest.raises(TokenFormatError) as raised:
        TokenEntry(name="a", sha256="not-hex", expires_at=datetime(2026, 1, 1))
    assert [".".join(map(str, where)) for where, _ in raised.value.problems] == ["sha256", "expires_at"]
    assert isinstance(raised.value, ValueError)
    converted = TokenEntry(name="a", sha256=HASH, grants=[{"queues": "q", "actions": ["produce"]}])
    assert converted.grants == (Grant(queues="q", actions=("produce",)),)
