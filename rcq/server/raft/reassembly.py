"""A large log entry received in parts: reassembled in one buffer (H14), taken only when whole (H20).

pysyncobj's leader sends an entry of at least ``appendEntriesBatchSizeBytes`` (64 KiB) as its
pickle cut in parts, one append_entries message each, marked 'start', 'process'... 'finish'. The
follower gathers them in one buffer (``__recvTransmission``) and unpickles it at 'finish'. Two
fixes on the follower's message handler:

* H14: the buffer is a bytearray extended in place, where pysyncobj's ``bytes +=`` copies all the
  parts so far at each part (quadratic);
* H20: a part marked 'finish' ends the entry only once the parts so far unpickle; pysyncobj's
  sender marks parts 'finish' too early (it compares with the command's length, not the pickle's),
  and the follower failed a tick on each, with a traceback in the log.

Explained in docs/raft-hazards.md (H14, H20) and tested in tests/integration/test_raft_transport.py,
each with a test showing what pysyncobj does without it (``REPLACED`` keeps pysyncobj's methods).
rcq.server.raft.patches.install() installs these after its own fixes: they wrap its message handler.

Must not import: anything of rcq's but rcq.server.raft.internals.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from rcq.server.raft.internals import Replaced, end_reassembly, reassembled_so_far, replace_method, replace_pickle_to_bytes

# What install() replaced, by fix: pysyncobj's own methods, for the tests that show its behaviour.
REPLACED: dict[str, list[Replaced]] = {"reassembly": [], "whole entries": []}


def _part(message: Any) -> str | None:
    """'start', 'process' or 'finish' for a part of a large entry; None for any other message."""
    if isinstance(message, dict) and message.get("type") == "append_entries" and "prevLogIdx" in message:
        return message.get("transmission")
    return None


# ---------------------------------------------------------------------------------------------
# H14: pysyncobj reassembles with ``self.__recvTransmission += message['data']``: a copy of
# everything so far per part. Handing it the 'start' part as a bytearray makes its own ``+=``
# extend in place, under its own rules (which messages count, when it starts over); its
# ``pickle.loads`` then only has to take the bytearray as it is.
def _reassembling_in_place(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_message_received(self: Any, node: Any, message: Any) -> Any:
        if _part(message) == "start" and type(message.get("data")) is bytes:
            message = {**message, "data": bytearray(message["data"])}
        return original(self, node, message)

    return on_message_received


def _passing_bytearrays(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def to_bytes(data: Any) -> Any:
        return data if isinstance(data, bytearray) else original(data)  # pickle reads a bytearray as is

    return to_bytes


# ---------------------------------------------------------------------------------------------
# H20: pysyncobj's sender cuts ``pickle.dumps(entry)`` into parts but marks a part 'finish' when
# ``pos + part_bytes >= len(command)``: the pickle is longer than the command it holds (the
# index, the term, pickle's framing; protocol 2 writes bytes as latin-1 text, about 1.5 times
# their length for binary data), so every part from the one reaching the command's length on says
# 'finish'. At each early one the follower unpickled a prefix: "pickle data was truncated",
# raised out of the tick ("failed _onTick" and a traceback in the log, then a tick period's
# sleep), and only the last part gave the entry. Here a 'finish' ends the entry only when what
# came so far unpickles (a prefix fails at the first missing byte, without reading the rest);
# otherwise it is what it really is, one more part. A whole entry reaches pysyncobj as a regular
# append_entries message carrying it, which is what pysyncobj makes of a 'finish' (the same
# consistency check, the same answer), unpickled once.
def _taking_whole_entries_only(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_message_received(self: Any, node: Any, message: Any) -> Any:
        # pysyncobj ignores an append_entries of an older term, its parts included: so does this.
        if _part(message) == "finish" and message["term"] >= self.raftCurrentTerm:
            message = _finish_if_whole(self, message)
        return original(self, node, message)

    return on_message_received


def _finish_if_whole(sync_obj: Any, message: dict[str, Any]) -> dict[str, Any]:
    received = reassembled_so_far(sync_obj)
    if not isinstance(received, bytearray):
        # No 'start' since the last entry, which pysyncobj's sender never does: it sends all of an
        # entry's parts on one connection, and after a cut it starts the entry over. pysyncobj's.
        return message
    received += message["data"]
    try:
        entry = pickle.loads(received)
    except (pickle.UnpicklingError, EOFError):  # truncated: more parts follow
        return {**message, "transmission": "process", "data": b""}
    except Exception:  # anything else is pysyncobj's to handle (it retries with Python's own unpickler)
        return {**message, "data": b""}
    end_reassembly(sync_obj)
    regular = {key: value for key, value in message.items() if key not in ("transmission", "data")}
    return {**regular, "entries": [entry]}


# Class-level patches: pysyncobj binds its message handler when it builds a SyncObj.
def install() -> None:
    """Patch SyncObj's message handler once (idempotent), after rcq.server.raft.patches' own fixes:
    REPLACED["reassembly"] then holds their handler (putting it back removes both fixes here),
    REPLACED["whole entries"] the H14 one (putting it back removes H20 only)."""
    if REPLACED["reassembly"]:
        return
    REPLACED["reassembly"] += [
        replace_method("SyncObj", "onMessageReceived", _reassembling_in_place),
        replace_pickle_to_bytes(_passing_bytearrays),
    ]
    REPLACED["whole entries"] += [replace_method("SyncObj", "onMessageReceived", _taking_whole_entries_only)]
