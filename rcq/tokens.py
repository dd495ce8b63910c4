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

Shared by both sides: the server checks tokens (``rcq.server.http.auth``), the ``rcq token``
commands and the cluster harness write tokens files. So it uses the standard library only
(``pip install rcq`` installs aiohttp alone): the file format is checked here, field by field,
in the words pydantic used before (``tokens.0.sha256: String should match pattern ...``), and a
message never echoes a value.

Must not import: rcq.server, pydantic, aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from rcq.errors import Forbidden, InvalidRequest, TokenExpired, Unauthorized
from rcq.private_files import read_private

log = logging.getLogger(__name__)

TOKEN_PREFIX = "rcq_"
PRINCIPAL_PATTERN = r"^[A-Za-z0-9._@-]{1,64}$"
# Queue-name characters plus the two wildcards: '*' any run of characters, '?' exactly one.
QUEUE_PATTERN_PATTERN = r"^[A-Za-z0-9._*?-]{1,128}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
RELOAD_CHECK_INTERVAL_S = 1.0
PROBLEMS_SHOWN_MAX = 5  # a message lists this many problems, then counts the rest

Action = Literal["produce", "consume", "manage"]
ACTIONS: tuple[Action, ...] = ("produce", "consume", "manage")
# The spellings of a boolean accepted in a tokens file, as pydantic accepted them.
BOOLEAN_WORDS = {"true": True, "t": True, "yes": True, "y": True, "on": True, "1": True,
                 "false": False, "f": False, "no": False, "n": False, "off": False, "0": False}
# A number for expires_at is Unix time in seconds, or in milliseconds past this (pydantic's rule).
EPOCH_SECONDS_MAX = 2e10

Parsed = TypeVar("Parsed", "Grant", "TokenEntry")
Location = tuple[str | int, ...]
Problems = list[tuple[Location, str]]


class TokenFormatError(ValueError):
    """A grant, token entry or tokens file that breaks the format. ``problems``: (where, what)
    pairs; no message holds the offending value (it may be a secret)."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        super().__init__(self.describe())

    def describe(self, limit: int = PROBLEMS_SHOWN_MAX) -> str:
        shown = [f"{'.'.join(str(p) for p in where) or '(whole)'}: {what}" for where, what in self.problems[:limit]]
        more = len(self.problems) - len(shown)
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


# ------------------------------------------------------------------ field checks
# Each reads one field (a JSON value, or the value given to a constructor), notes what is wrong
# with it in ``problems`` and returns it converted (a list becomes a tuple, a string a datetime).
FieldReader = Callable[[Any, Location, Problems], Any]


def _matching(pattern: str) -> FieldReader:
    def read(value: Any, where: Location, problems: Problems) -> Any:
        if not isinstance(value, str):
            problems.append((where, "Input should be a valid string"))
        elif re.fullmatch(pattern, value) is None:
            problems.append((where, f"String should match pattern '{pattern}'"))
        return value
    return read


def _boolean(value: Any, where: Location, problems: Problems) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in BOOLEAN_WORDS:
        return BOOLEAN_WORDS[value.lower()]
    problems.append((where, "Input should be a valid boolean"))
    return value


def _actions(value: Any, where: Location, problems: Problems) -> Any:
    if not isinstance(value, list | tuple):
        problems.append((where, "Input should be a valid tuple"))
        return value
    for position, action in enumerate(value):
        if not isinstance(action, str) or action not in ACTIONS:
            problems.append(((*where, position), "Input should be 'produce', 'consume' or 'manage'"))
    if not value:
        problems.append((where, "Tuple should have at least 1 item after validation, not 0"))
    return tuple(value)


def _grants(value: Any, where: Location, problems: Problems) -> Any:
    if not isinstance(value, list | tuple):
        problems.append((where, "Input should be a valid tuple"))
        return value
    return tuple(grant if isinstance(grant, Grant) else _read_object(Grant, grant, (*where, position), problems)
                 for position, grant in enumerate(value))


def _aware_datetime(value: Any, where: Location, problems: Problems) -> Any:
    moment = value
    with contextlib.suppress(OverflowError, OSError, ValueError):  # if so, it stays a string or number
        if isinstance(value, str):
            moment = datetime.fromisoformat(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            moment = datetime.fromtimestamp(value / 1000 if abs(value) > EPOCH_SECONDS_MAX else value, tz=UTC)
    if moment is not None and not isinstance(moment, datetime):
        problems.append((where, "Input should be a valid datetime"))
    elif moment is not None and moment.utcoffset() is None:
        problems.append((where, "Input should have timezone info"))
    return moment


def _read_object(kind: Any, data: Any, where: Location, problems: Problems) -> Any:
    """An instance of ``kind`` (Grant or TokenEntry) from a JSON object; None, with the problems
    noted, when the object breaks the format."""
    if not isinstance(data, Mapping):
        problems.append((where, "Input should be a valid dictionary"))
        return None
    before = len(problems)
    problems.extend(((*where, key), "Extra inputs are not permitted") for key in data if key not in kind.READERS)
    problems.extend(((*where, key), "Field required") for key in kind.REQUIRED if key not in data)
    values = {key: read(data[key], (*where, key), problems) for key, read in kind.READERS.items() if key in data}
    return kind(**values) if len(problems) == before else None


def _parsed(kind: type[Parsed], data: Any) -> Parsed:
    problems: Problems = []
    parsed: Parsed = _read_object(kind, data, (), problems)
    if problems:
        raise TokenFormatError(problems)
    return parsed


def _checked(instance: Any) -> None:
    """Check and convert a Grant's or TokenEntry's fields in place (they are frozen dataclasses)."""
    problems: Problems = []
    for key, read in instance.READERS.items():
        object.__setattr__(instance, key, read(getattr(instance, key), (key,), problems))
    if problems:
        raise TokenFormatError(problems)


# ------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Grant:
    """Some actions on the queues whose names match a pattern: ``queues`` ('*' matches any run of
    characters, '?' one character), ``actions`` produce (enqueue), consume (dequeue), manage
    (settings, purge, delete). A malformed one raises TokenFormatError (a ValueError)."""

    queues: str
    actions: tuple[Action, ...]

    READERS: ClassVar[dict[str, FieldReader]] = {"queues": _matching(QUEUE_PATTERN_PATTERN), "actions": _actions}
    REQUIRED: ClassVar[tuple[str, ...]] = ("queues", "actions")

    def __post_init__(self) -> None:
        _checked(self)

    @classmethod
    def from_json(cls, data: Any) -> Grant:
        return _parsed(cls, data)

    def to_json(self) -> dict[str, Any]:
        return {"queues": self.queues, "actions": list(self.actions)}

    def covers(self, action: Action, queue: str) -> bool:
        return action in self.actions and fnmatch.fnmatchcase(queue, self.queues)

    def touches(self, queue: str) -> bool:
        return fnmatch.fnmatchcase(queue, self.queues)


@dataclass(frozen=True)
class TokenEntry:
    """One token as a node stores it: its owner ``name`` (the principal: transactions belong to
    it), the hex SHA-256 of the token, ``admin`` (every permission on every queue, and the
    cluster's own routes: metrics, status page, digest, snapshots, storage), ``grants``
    (permissions on queue-name patterns) and ``expires_at`` (after this instant the token is
    refused). A malformed one raises TokenFormatError (a ValueError)."""

    name: str
    sha256: str = field(repr=False)
    admin: bool = False
    grants: tuple[Grant, ...] = ()
    expires_at: datetime | None = None

    READERS: ClassVar[dict[str, FieldReader]] = {
        "name": _matching(PRINCIPAL_PATTERN), "sha256": _matching(SHA256_PATTERN), "admin": _boolean,
        "grants": _grants, "expires_at": _aware_datetime}
    REQUIRED: ClassVar[tuple[str, ...]] = ("name", "sha256")

    def __post_init__(self) -> None:
        _checked(self)

    @classmethod
    def from_json(cls, data: Any) -> TokenEntry:
        return _parsed(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The entry as a tokens file holds it: every field, in this order; expires_at in ISO 8601
        with Z for UTC (as pydantic wrote it)."""
        return {"name": self.name, "sha256": self.sha256, "admin": self.admin,
                "grants": [grant.to_json() for grant in self.grants],
                "expires_at": None if self.expires_at is None else self.expires_at.isoformat().replace("+00:00", "Z")}


def read_tokens_document(data: Any) -> tuple[TokenEntry, ...]:
    """The entries of a parsed tokens file, ``{"tokens": [entry, ...]}``; TokenFormatError naming
    every problem's place (``tokens.0.sha256``) otherwise."""
    problems: Problems = []
    entries: list[TokenEntry] = []
    if not isinstance(data, Mapping):
        problems.append(((), "Input should be a valid dictionary"))
    else:
        problems.extend(((key,), "Extra inputs are not permitted") for key in data if key != "tokens")
        listed = data.get("tokens", [])
        if not isinstance(listed, list):
            problems.append((("tokens",), "Input should be a valid list"))
        else:
            entries = [_read_object(TokenEntry, item, ("tokens", position), problems)
                       for position, item in enumerate(listed)]
    if problems:
        raise TokenFormatError(problems)
    return tuple(entries)


def tokens_file_text(entries: Iterable[TokenEntry]) -> str:
    """What a tokens file holds: JSON, one entry per token, indented for people."""
    return json.dumps({"tokens": [entry.to_json() for entry in entries]}, indent=2) + "\n"


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
        return read_tokens_document(json.loads(text))
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"tokens file {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except TokenFormatError as exc:
        raise InvalidRequest(f"tokens file {path}: {exc.describe()}") from None


def load_tokens_file(path: Path) -> tuple[TokenEntry, ...]:
    """The entries of a tokens file; refused if others may read it, or if it is invalid."""
    return parse_tokens_file(read_private(path, "tokens"), path)


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
