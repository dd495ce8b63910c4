"""Queue names: the one rule, shared by the server, the client, the CLI and the Spark options.

A queue name is 1 to 128 characters of ``[A-Za-z0-9._-]``, and not ``.`` or ``..``
(they match the pattern but are path segments in ``/v1/queues/{queue}``).

Must not import: anything of rcq but rcq.errors (the client installs without the server).
"""

from __future__ import annotations

import re

from rcq.errors import InvalidQueueName

QUEUE_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
DOT_SEGMENTS = (".", "..")
_QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)


def check_queue_name(name: str) -> str:
    """``name`` if it is a queue name; :class:`InvalidQueueName` otherwise."""
    if not isinstance(name, str) or not _QUEUE_NAME_RE.match(name) or name in DOT_SEGMENTS:
        raise InvalidQueueName(f"bad queue name {name!r}: use 1 to 128 characters of [A-Za-z0-9._-], not . or ..")
    return name
