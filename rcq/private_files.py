"""Reading files that hold secrets (the cluster secret, tokens): only if no one else may read them.

A secret in a file that its group or everyone can read is no longer a secret; rcq refuses such a
file with a message that says how to fix it (``chmod 600``) rather than use it. Shared by the
server (cluster secret, tokens file, a config file holding the secret) and the client (a token
file).

Must not import: aiohttp, pysyncobj, lmdb (clients import this module).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rcq.errors import InvalidRequest


def check_private(path: Path, what: str) -> None:
    """Raise InvalidRequest if ``path`` may be read or written by its group or others."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InvalidRequest(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidRequest(
            f"the {what} file {path} is accessible to its group or others (mode {stat.S_IMODE(mode):o}); "
            f"make it private first: chmod 600 {path}")


def read_private(path: Path, what: str) -> str:
    """The text of a secret-holding file, stripped; refused if it is not private (see above)."""
    path = Path(path)
    check_private(path, what)
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read the {what} file {path}: {type(exc).__name__}") from None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, replacing it atomically."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            descriptor = -1
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        if descriptor >= 0:
            os.close(descriptor)
    os.replace(temporary, path)
