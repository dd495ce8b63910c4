"""Parsing JSON text from the other end of a connection, for the client and the server alike.

orjson parses a request frame or an answer in ~1 µs where json takes ~3.5; where orjson refuses
(NaN and the infinities, numbers beyond 64 bits, lone surrogates, deep nesting) json parses it, so
every text means what it meant with json alone, and json's errors (ValueError, RecursionError)
are the ones callers see.

Must not import: anything of rcq (the client installs without the server).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(text: str | bytes) -> Any:
    """``text`` parsed: orjson's parse, or json's where orjson refuses."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
