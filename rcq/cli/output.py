"""How ``rcq`` prints: items (one value a line for people, JSON with ``--json``) and tables.

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rcq.encoding import encode_item


def wire(value: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An item's value and encoding, and its headers when it has some."""
    text, used = encode_item(value)
    return {"value": text, "encoding": used, **({"headers": headers} if headers else {})}


def item_wire(item: Any) -> dict[str, Any]:
    """A dequeued Item for --json: its value (and headers, on an item that has some), then how it was
    delivered (dead_letter only on a dead item, expires_at_ms only on an item that expires)."""
    wired: dict[str, Any] = {**wire(item.value, item.headers), "delivery_count": item.delivery_count,
                             "priority": item.priority}
    if item.expires_at_ms is not None:
        wired["expires_at_ms"] = item.expires_at_ms
    if item.dead_letter is not None:
        dead = item.dead_letter
        wired["dead_letter"] = {"reason": dead.reason, "source_queue": dead.source_queue,
                                "delivery_count": dead.delivery_count}
    return wired


def print_items(args: argparse.Namespace, items: list[dict[str, Any]]) -> None:
    """``items``: wire dicts. For people, one value per line, so scripts can read it; an item with
    headers is followed by one indented ``  key: value`` line per header (scripts that meet headers
    want ``--json``)."""
    if args.json:
        print(json.dumps({"queue": args.queue, "items": items}))
        return
    for wired in items:
        print(wired["value"] if wired["encoding"] == "utf-8" else f"base64:{wired['value']}")
        for key, value in (wired.get("headers") or {}).items():
            print(f"  {key}: {value}")
    if not items:
        print(f"(queue {args.queue} is empty)", file=sys.stderr)


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
