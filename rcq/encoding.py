"""Items on the wire: bytes inside rcq, a string plus its encoding in JSON.

``utf-8`` (the default, for text) or ``base64`` (for arbitrary bytes). The
server, the client and the CLI all encode and decode through these functions;
each caller turns a :class:`ValueError` into its own error (a 400 on the
server, an internal error in the client, a usage error in the CLI).

Must not import: anything of rcq (the client installs without the server).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Literal

Encoding = Literal["utf-8", "base64"]


def decode_item(text: str, encoding: Encoding) -> bytes:
    """One wire string -> item bytes; ValueError when ``text`` is not valid in ``encoding``."""
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error as exc:
            raise ValueError("not valid base64") from exc
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise ValueError("not valid UTF-8 text") from exc


def encode_item(value: bytes, preferred: Encoding = "utf-8") -> tuple[str, Encoding]:
    """Item bytes -> (wire string, its encoding): UTF-8 when asked for and possible, else base64."""
    if preferred == "utf-8":
        try:
            return value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(value).decode("ascii"), "base64"


def encode_items(values: Sequence[bytes]) -> tuple[list[str], Encoding]:
    """Several items sharing one encoding (a request has one): UTF-8 when all are, else base64."""
    try:
        return [v.decode("utf-8") for v in values], "utf-8"
    except UnicodeDecodeError:
        return [base64.b64encode(v).decode("ascii") for v in values], "base64"
