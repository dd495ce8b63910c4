"""The token verbs: ``rcq token create|list|revoke|hash``, file operations on a node's tokens file.

No node is asked: nodes re-read their file on their own. A token is printed once, when it is made,
and never kept: the file holds its SHA-256. ``hash`` reads the token from stdin, not an argument
(process lists show arguments). Also here: the rules for a token's characters, and ``serve``'s
inline admin token (``RCQ_ADMIN_TOKEN``).

The token model comes from :mod:`rcq.tokens` (the one import of it in the CLI), which the client
side may import: ``rcq token`` needs no server.

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from rcq.cli.output import print_table
from rcq.errors import InvalidRequest
from rcq.private_files import read_private, write_private
from rcq.tokens import (
    ACTIONS,
    PRINCIPAL_PATTERN,
    QUEUE_PATTERN_PATTERN,
    Grant,
    TokenEntry,
    expiry_in,
    new_token,
    parse_tokens_file,
    token_hash,
    tokens_file_text,
)

ADMIN_TOKEN_MIN_CHARS = 16
TOKEN_CHARACTERS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: it travels in a header
EXPIRES_IN_DAYS_MAX = 36_500.0
TOKENS_HELP = ("Nodes re-read a changed tokens file within about a second: a created token works and a revoked "
               "one stops working without a restart. Each node reads its own file: copy it to every node.")


def add_token_parsers(commands: Any) -> None:
    token = commands.add_parser("token", help="create, list or revoke API tokens in a tokens file (no server needed)",
                                description="Edit a node's tokens file (NodeConfig.tokens_file, rcq serve --tokens-file). "
                                            + TOKENS_HELP)
    actions = token.add_subparsers(dest="token_command", required=True)
    tokens_file = argparse.ArgumentParser(add_help=False)
    tokens_file.add_argument("--tokens-file", type=Path, required=True,
                             help="the tokens file (created mode 0600; an existing one must be private)")
    create = actions.add_parser(
        "create", parents=[tokens_file], help="make a token, add its hash to the file, print it once",
        description="Make a random token, add its SHA-256 to the tokens file and print the token: it is not kept "
                    "anywhere, so store it now. " + TOKENS_HELP)
    create.add_argument("--name", required=True,
                        help="the principal (transactions belong to it); tokens may share a name, for rotation")
    create.add_argument("--admin", action="store_true", help="every permission, and the cluster's own routes")
    create.add_argument("--grant", action="append", default=[], metavar="ACTIONS:PATTERN",
                        help="actions (comma-separated: produce, consume, manage) on the queues matching PATTERN "
                             "('*' any run of characters, '?' one), e.g. produce,consume:orders.* (repeat)")
    create.add_argument("--expires-in-days", type=float, default=None, help="refused after this (default: never)")
    create.add_argument("--json", action="store_true", help="print JSON for machines")
    create.set_defaults(func=cmd_token_create)
    listing = actions.add_parser("list", parents=[tokens_file], help="the file's tokens, without their hashes")
    listing.add_argument("--json", action="store_true", help="print JSON for machines")
    listing.set_defaults(func=cmd_token_list)
    revoke = actions.add_parser("revoke", parents=[tokens_file], help="remove every token of a name",
                                description="Remove every token of NAME from the tokens file. " + TOKENS_HELP)
    revoke.add_argument("--name", required=True)
    revoke.set_defaults(func=cmd_token_revoke)
    hashing = actions.add_parser("hash", help="print the SHA-256 of a token read from stdin (for NodeConfig.tokens)")
    hashing.set_defaults(func=cmd_token_hash)


def admin_token_entry() -> TokenEntry | None:
    """``$RCQ_ADMIN_TOKEN`` (how docker-compose gives a node its first token) as an inline admin
    entry, hashed; the variable leaves the environment. None when it is not set. Errors never
    show the value."""
    token = (os.environ.pop("RCQ_ADMIN_TOKEN", None) or "").strip()
    if not token:
        return None
    if len(token) < ADMIN_TOKEN_MIN_CHARS or not TOKEN_CHARACTERS.match(token):
        raise InvalidRequest(f"RCQ_ADMIN_TOKEN must be at least {ADMIN_TOKEN_MIN_CHARS} printable characters "
                             "without spaces; make a random one, e.g. python3 -c "
                             "'import secrets; print(\"rcq_\" + secrets.token_urlsafe(32))'")
    return TokenEntry(name="admin", admin=True, sha256=token_hash(token), grants=(), expires_at=None)


def _grant(text: str) -> Grant:
    """``produce,consume:orders.*`` -> a Grant; a clear error for anything else."""
    actions_text, colon, pattern = text.partition(":")
    if not colon or not actions_text.strip() or not pattern:
        raise InvalidRequest(f"--grant {text!r}: expected ACTIONS:PATTERN, e.g. produce,consume:orders.*")
    actions = [a.strip() for a in actions_text.split(",")]
    unknown = [a for a in actions if a not in ACTIONS]
    if unknown:
        raise InvalidRequest(f"--grant {text!r}: unknown action {unknown[0]!r}: use produce, consume or manage, "
                             "comma-separated")
    if not re.fullmatch(QUEUE_PATTERN_PATTERN, pattern):
        raise InvalidRequest(f"--grant {text!r}: the queue pattern {pattern!r} is malformed: use 1 to 128 characters "
                             "of [A-Za-z0-9._-] and the wildcards * and ?")
    return Grant(queues=pattern, actions=tuple(dict.fromkeys(actions)))  # type: ignore[arg-type]  # checked above


def _read_tokens(path: Path, *, missing_ok: bool = False) -> list[TokenEntry]:
    """The entries of a tokens file (refused unless private); with ``missing_ok``, none for a
    file that does not exist yet or is empty."""
    if missing_ok and not os.path.lexists(path):
        return []
    text = read_private(path, "tokens")
    if missing_ok and not text:
        return []
    return list(parse_tokens_file(text, path))


def _write_tokens(path: Path, entries: list[TokenEntry]) -> None:
    try:
        write_private(path, tokens_file_text(entries))
    except OSError as exc:
        raise InvalidRequest(f"cannot write the tokens file {path}: {exc.strerror or exc}") from None


def _new_entry(args: argparse.Namespace, token: str) -> TokenEntry:
    """The entry of a new token, every flag checked first (a bad one changes nothing)."""
    if not re.fullmatch(PRINCIPAL_PATTERN, args.name):
        raise InvalidRequest(f"--name {args.name!r} is not a principal name: use 1 to 64 characters of "
                             "[A-Za-z0-9._@-]")
    grants = tuple(_grant(text) for text in args.grant)
    if not args.admin and not grants:
        raise InvalidRequest("a token needs --admin or at least one --grant ACTIONS:PATTERN: without either it "
                             "may touch no queue")
    days = args.expires_in_days
    if days is not None and not (math.isfinite(days) and 0 < days <= EXPIRES_IN_DAYS_MAX):
        raise InvalidRequest(f"--expires-in-days must be more than 0 and at most {EXPIRES_IN_DAYS_MAX:g}")
    return TokenEntry(name=args.name, sha256=token_hash(token), admin=args.admin, grants=grants,
                      expires_at=expiry_in(days))


def _described(entry: TokenEntry) -> dict[str, Any]:
    """An entry as people see it: everything but its hash."""
    return {key: value for key, value in entry.to_json().items() if key != "sha256"}


def cmd_token_create(args: argparse.Namespace) -> int:
    token = new_token()
    entry = _new_entry(args, token)
    entries = _read_tokens(args.tokens_file, missing_ok=True)
    _write_tokens(args.tokens_file, [*entries, entry])
    print(json.dumps({"name": entry.name, "token": token, **_described(entry)}) if args.json else token)
    print(f"rcq: token of {entry.name!r} added to {args.tokens_file}; store it now: it is not kept anywhere",
          file=sys.stderr)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    now = time.time()
    described = [{**_described(entry), "expired": entry.expires_at is not None and entry.expires_at.timestamp() <= now}
                 for entry in _read_tokens(args.tokens_file)]
    if args.json:
        print(json.dumps({"tokens": described}))
        return 0
    rows = [[d["name"], "yes" if d["admin"] else "no",
             " ".join(f"{','.join(g['actions'])}:{g['queues']}" for g in d["grants"]) or None,
             d["expires_at"] or "never", "yes" if d["expired"] else "no"] for d in described]
    print_table(["NAME", "ADMIN", "GRANTS", "EXPIRES_AT", "EXPIRED"], rows)
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    entries = _read_tokens(args.tokens_file)
    kept = [entry for entry in entries if entry.name != args.name]
    revoked = len(entries) - len(kept)
    if not revoked:
        raise InvalidRequest(f"no token of {args.name!r} in {args.tokens_file}")
    _write_tokens(args.tokens_file, kept)
    print(f"revoked {revoked} token{'s' if revoked != 1 else ''} of {args.name!r}; nodes stop accepting "
          f"{'them' if revoked != 1 else 'it'} within about a second")
    return 0


def cmd_token_hash(args: argparse.Namespace) -> int:
    """stdin, not an argument: process lists show arguments. A terminal is asked without echo."""
    token = (getpass.getpass("token: ") if sys.stdin.isatty() else sys.stdin.read()).strip()
    if not token:
        raise InvalidRequest("no token on stdin: e.g. rcq token hash < token-file")
    if not TOKEN_CHARACTERS.match(token):
        raise InvalidRequest("stdin must hold one token (printable characters, no spaces) and nothing else")
    print(token_hash(token))
    return 0
