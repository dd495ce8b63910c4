"""API tokens: what a token grants, how it is stored (hashed), and how a presented one is checked.

A token is ``rcq_`` followed by 43 url-safe characters (256 random bits). Nodes never store it:
the node config (``tokens``) and the tokens file (``tokens_file``) hold its SHA-256. A slow
password hash would buy nothing here: the token is random, not chosen by a person, so there is no
dictionary to slow down, and a fast hash keeps each request cheap.

Checking a presented token hashes it and compares the digest with *every* stored digest using
:func:`hmac.compare_digest`, without stopping at a match: how long the check takes depends on
the number of tokens, never on how much of a stored digest the presented one shares.

The tokens file is re-read when it changes (checked at most once a second), so adding or
revoking a token needs no restart; a changed file that does not parse, or that became readable
by others, is refused with an error in the log and the tokens read before stay in force.

Must not import: aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from rcq.errors import Forbidden, InvalidRequest, TokenExpired, Unauthorized
from rcq.private_files import read_private

log = logging.getLogger(__name__)

TOKEN_PREFIX = "rcq_"
PRINCIPAL_PATTERN = r"^[A-Za-z0-9._@-]{1,64}$"
# Queue-name characters plus the two wildcards: '*' any run of characters, '?' exactly one.
QUEUE_PATTERN_PATTERN = r"^[A-Za-z0-9._*?-]{1,128}$"
RELOAD_CHECK_INTERVAL_S = 1.0

Action = Literal["produce", "consume", "manage"]
ACTIONS: tuple[Action, ...] = ("produce", "consume", "manage")


class Grant(BaseModel):
    """Some actions on the queues whose names match a pattern."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queues: str = Field(pattern=QUEUE_PATTERN_PATTERN,
                        description="queue-name pattern: '*' matches any run of characters, '?' one character")
    actions: tuple[Action, ...] = Field(min_length=1, description="produce (enqueue), consume (dequeue), "
                                                                  "manage (settings, purge, delete)")

    def covers(self, action: Action, queue: str) -> bool:
        return action in self.actions and fnmatch.fnmatchcase(queue, self.queues)

    def touches(self, queue: str) -> bool:
        return fnmatch.fnmatchcase(queue, self.queues)


class TokenEntry(BaseModel):
    """One token as a node stores it: its owner, its SHA-256, what it grants, until when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=PRINCIPAL_PATTERN, description="the principal: transactions belong to it")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False, description="hex SHA-256 of the token")
    admin: bool = Field(False, description="every permission on every queue, and the cluster's own routes "
                                           "(metrics, status page, digest, snapshots, storage)")
    grants: tuple[Grant, ...] = Field((), description="permissions on queue-name patterns")
    expires_at: AwareDatetime | None = Field(None, description="after this instant the token is refused")


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenEntry] = Field(default_factory=list)


@dataclass(frozen=True)
class Principal:
    """Who a request comes from and what they may do. ``authenticated`` False: tokens are off on
    this node (loopback only), so every request may do everything, as one anonymous principal."""

    name: str
    admin: bool
    grants: tuple[Grant, ...] = ()
    authenticated: bool = True

    def may(self, action: Action, queue: str) -> bool:
        return self.admin or any(g.covers(action, queue) for g in self.grants)

    def may_see(self, queue: str) -> bool:
        """Whether the queue is the principal's business at all (listing, count, stats)."""
        return self.admin or any(g.touches(queue) for g in self.grants)

    def require(self, action: Action, queue: str) -> None:
        if not self.may(action, queue):
            raise Forbidden(f"principal {self.name!r} may not {action} queue {queue!r}",
                            details={"action": action, "queue": queue})

    def require_see(self, queue: str) -> None:
        if not self.may_see(queue):
            raise Forbidden(f"principal {self.name!r} has no permission on queue {queue!r}",
                            details={"queue": queue})

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise Forbidden(f"principal {self.name!r} may not {what}: it needs an admin token",
                            details={"action": "admin"})


OPEN = Principal(name="", admin=True, authenticated=False)


# ------------------------------------------------------------------ tokens
def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def match_token(presented: str, entries: Iterable[TokenEntry]) -> TokenEntry | None:
    """The entry whose hash is the presented token's, comparing with every entry in constant time
    (no early exit: the work depends on the number of entries, not on the presented value)."""
    digest = token_hash(presented).encode()
    found = None
    for entry in entries:
        if hmac.compare_digest(entry.sha256.encode(), digest):
            found = entry
    return found


def parse_tokens_file(text: str, path: Path) -> tuple[TokenEntry, ...]:
    try:
        return tuple(TokensFile.model_validate(json.loads(text)).tokens)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"tokens file {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except ValidationError as exc:
        raise InvalidRequest(f"tokens file {path}: {safe_validation_message(exc)}") from None


def load_tokens_file(path: Path) -> tuple[TokenEntry, ...]:
    """The entries of a tokens file; refused if others may read it, or if it is invalid."""
    return parse_tokens_file(read_private(path, "tokens"), path)


def safe_validation_message(exc: ValidationError, limit: int = 5) -> str:
    """A pydantic error as 'field: problem' pairs, never echoing the input (which may be a secret)."""
    problems = [f"{'.'.join(str(p) for p in e['loc']) or '(whole)'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False, include_context=False)[:limit]]
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


class TokenRegistry:
    """The tokens a node accepts: those of its config plus those of its tokens file (re-read when
    it changes). ``enabled`` False when neither is configured: the node is open (loopback only)."""

    def __init__(self, inline: tuple[TokenEntry, ...] = (), path: Path | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._inline = inline
        self._path = path
        self._clock = clock
        self._from_file: tuple[TokenEntry, ...] = ()
        self._file_stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        if path is not None:
            self._from_file = load_tokens_file(path)  # at start, an invalid file is an error
            self._file_stamp = self._stamp()

    @property
    def enabled(self) -> bool:
        return bool(self._inline) or self._path is not None

    def entries(self) -> tuple[TokenEntry, ...]:
        self._maybe_reload()
        return self._inline + self._from_file

    def authenticate(self, presented: str | None) -> Principal:
        if not self.enabled:
            return OPEN
        if not presented:
            raise Unauthorized()
        entry = match_token(presented, self.entries())
        if entry is None:
            raise Unauthorized("the token is not valid on this node")
        if entry.expires_at is not None and entry.expires_at.timestamp() <= self._clock():
            raise TokenExpired(f"the token of {entry.name!r} expired at {entry.expires_at.isoformat()}")
        return Principal(name=entry.name, admin=entry.admin, grants=entry.grants)

    def _stamp(self) -> tuple[int, int, int] | None:
        assert self._path is not None
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + RELOAD_CHECK_INTERVAL_S
        stamp = self._stamp()
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        try:
            self._from_file = load_tokens_file(self._path)
        except InvalidRequest as exc:
            log.error("tokens file changed but cannot be used (the tokens read before stay in force): %s", exc)
            return
        log.info("tokens file %s re-read: %d token(s)", self._path, len(self._from_file))


def expiry_in(days: float | None) -> datetime | None:
    if days is None:
        return None
    return datetime.fromtimestamp(time.time() + days * 86400.0, tz=UTC).replace(microsecond=0)
