"""The logger the node gives aiohttp's HTTP server: a request the peer broke is logged at INFO, in
one line, not at ERROR with a traceback.

aiohttp logs a request it cannot parse with ``logger.exception`` — ``ERROR aiohttp.server: Error
handling request`` and the parser's traceback — except ``BadHttpMethod`` on a connection's first
request (aiohttp 3.14 logs that one at DEBUG). Garbage after a complete request on a keep-alive
connection, after a refused WebSocket upgrade, a broken chunk size, a bad status line or URL: all
were ERROR tracebacks that anyone, without a token, could write into a node's log as often as they
liked (issue: the session channel tried as an attacker would). Operators alert on ERROR; a
request the peer broke is the peer's fault, and the node answered it 400 already.

So: every record of this logger whose exception is one of aiohttp's ``HttpProcessingError`` (the
parser's refusals: the peer's bytes), or a ``RequestPayloadError`` raised from one (a body that
does not decode), becomes an INFO line naming the peer and the refusal. Any
other exception — a fault of the node — stays an ERROR with its traceback. The node passes
:data:`SERVER_LOGGER` to ``web.AppRunner`` (``logger=``); ``docs/dependency-workarounds.md`` says
why, and ``tests/integration/test_network_input_logs.py`` fails without it.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

MESSAGE_BYTES_MAX = 200  # of the refusal's text, in the INFO line


def peer_fault(error: BaseException | None) -> HttpProcessingError | None:
    """The parser's refusal behind ``error``, if the peer's bytes caused it: the error itself, or
    what it was raised from (aiohttp raises ``RequestPayloadError`` from a body it cannot decode)."""
    while isinstance(error, HttpProcessingError | RequestPayloadError):
        if isinstance(error, HttpProcessingError):
            return error
        error = error.__cause__
    return None


class _PeerFaultsAtInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        fault = peer_fault(record.exc_info[1] if record.exc_info else None)
        if fault is not None and record.levelno > logging.INFO:
            refusal = " ".join(str(fault.message).split())[:MESSAGE_BYTES_MAX]
            record.msg = f"{record.getMessage()}: refused {fault.code} {type(fault).__name__}: {refusal}"
            record.args = ()
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.exc_info, record.exc_text = None, None
        return True


SERVER_LOGGER = logging.getLogger("rcq.server.http.requests")
SERVER_LOGGER.addFilter(_PeerFaultsAtInfo())
