"""The options of the ``rcq`` Spark data source: parsed and checked once, on the driver.

Spark hands a data source its options as a case-insensitive map of str -> str
(keys arrive lowercased). :func:`parse_options` turns them into a frozen,
picklable :class:`RcqOptions` or raises :class:`RcqOptionError` naming the
option and what is expected. Every limit has a default here and nowhere else.

Security options are resolved here too, on the driver, so that executors need neither the
files nor the environment: ``token`` (else the file of ``tokenFile``, which must be private,
else the driver's ``$RCQ_TOKEN``) and ``caFile`` (a PEM CA bundle to verify HTTPS nodes
with; its certificates travel in the options). The token is a secret: the connector never puts
it in a repr, an error message or a log line.

The sinks' per enqueue options (docs/queue-features.md) apply to every enqueue of a write:
``delayS`` (seconds >= 0 each item stays invisible; ``0``: none, whatever the queue's default)
and ``ttlS`` (seconds > 0 until an item not consumed expires); absent, the queue's defaults.
An item's priority comes from the DataFrame's ``priority`` column (:mod:`rcq.spark.schema`).

Must not import: pyspark (the executors unpickle this module), pysyncobj, lmdb.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rcq import limits
from rcq.errors import InvalidRequest
from rcq.limits import DELAY_MAX_S, TTL_MAX_S
from rcq.names import QUEUE_NAME_PATTERN
from rcq.private_files import read_private

ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
VALUE_TYPES = ("binary", "string")
DEQUEUE_ITEMS_MAX = limits.DEQUEUE_ITEMS_MAX
TRANSACTION_TIMEOUT_MAX_S = limits.TRANSACTION_TIMEOUT_MAX_S
TRANSACTION_BYTES_MAX = limits.TRANSACTION_BYTES_MAX  # per transaction
TOKEN_CHARACTERS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: it travels in a header
# Per enqueue options of the sink (docs/queue-features.md): the server's bounds, checked here first.


class RcqOptionError(ValueError):
    """An option of the rcq data source is missing or malformed."""


@dataclass(frozen=True, slots=True)
class RcqOptions:
    urls: tuple[str, ...]
    queue: str
    value_type: str = "binary"  # of the read schema's value column
    batch_size: int = 1000  # items per enqueue / dequeue request
    coalesce: bool = False  # writer tasks share HTTP requests among their in-flight enqueues (POST /v1/batch)
    requests_in_flight: int = 4  # enqueue requests a writer task has outstanding (1: rows keep their order)
    transaction_timeout_s: float = 600.0
    transaction_bytes_max: int = 4 << 20  # a writer task starts a new transaction past this
    request_timeout_s: float = 30.0
    retry_timeout_s: float = 30.0  # how long a request keeps retrying (covers a leader election)
    num_partitions: int = 2  # reader tasks per micro-batch / drain
    max_items_per_partition: int = 1000  # per reader task per micro-batch
    consumer_id: str | None = None  # stream reader: stable, unique per running query
    sink_id: str | None = None  # stream writer: stable across restarts
    max_items: int | None = None  # drain: at most this many items in all
    transaction_id: str | None = None  # drain: the driver's transaction (set by rcq.spark.drain; a spread
    # queue's drain: one per fragment, comma-separated)
    drain_shares: tuple[int, ...] | None = None  # a spread queue's drain: items to read in each one's fragment
    delay_s: float | None = None  # sink: every enqueued item invisible this long (None: the queue's default)
    ttl_s: float | None = None  # sink: every enqueued item expires this long after (None: the queue's default)
    token: str | None = field(default=None, repr=False)  # a secret: in no repr, message or log line
    ca_pem: str | None = field(default=None, repr=False)  # option caFile's certificates, read on the driver

    def tls_context(self) -> ssl.SSLContext | None:
        """How to verify HTTPS nodes: against option caFile's CAs; None: the system's."""
        return ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem is not None else None


def _int(options: Mapping[str, str], key: str, default: int, low: int, high: int | None = None) -> int:
    raw = options.get(key.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise RcqOptionError(f"option {key}={raw!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise RcqOptionError(f"option {key}={value} is out of range: use a value {bound}")
    return value


def _float(options: Mapping[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = options.get(key.lower())
    if raw is None:
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise RcqOptionError(f"option {key}={raw!r} is not a number") from None
    if not low < value <= high:
        raise RcqOptionError(f"option {key}={value} is out of range: use more than {low} and at most {high}")
    return value


def _seconds(options: Mapping[str, str], key: str, low: float, high: float, *, low_allowed: bool) -> float | None:
    """An optional number of seconds (None when absent): at least ``low`` (more than ``low`` unless
    ``low_allowed``) and at most ``high``."""
    raw = options.get(key.lower())
    if raw is None:
        return None
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise RcqOptionError(f"option {key}={raw!r} is not a number of seconds") from None
    if not ((low <= value) if low_allowed else (low < value)) or not value <= high:
        lowest = f"at least {low:g}" if low_allowed else f"more than {low:g}"
        raise RcqOptionError(f"option {key}={value:g} is out of range: use {lowest} and at most {high:g} seconds")
    return value


def _identifier(options: Mapping[str, str], key: str) -> str | None:
    raw = options.get(key.lower())
    if raw is None:
        return None
    if not ID_PATTERN.match(raw):
        raise RcqOptionError(f"option {key}={raw!r} is malformed: use 1 to 128 characters of [A-Za-z0-9._-]")
    return raw


def _urls(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = options.get("url") or options.get("urls")
    if not raw or not raw.strip():
        raise RcqOptionError("option url is required: one or more rcq nodes, comma-separated, "
                             "e.g. .option('url', 'http://127.0.0.1:7001,http://127.0.0.1:7002')")
    urls = tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())
    for url in urls:
        if not re.match(r"^https?://[^/\s]+$", url):
            raise RcqOptionError(f"option url: {url!r} is not http://host:port")
    return urls


def _queue(options: Mapping[str, str]) -> str:
    queue = options.get("queue")
    if not queue:
        raise RcqOptionError("option queue is required: the rcq queue to read or write")
    if not re.match(QUEUE_NAME_PATTERN, queue) or queue in (".", ".."):
        raise RcqOptionError(f"option queue={queue!r} is not a queue name: use 1 to 128 characters "
                             "of [A-Za-z0-9._-], not . or ..")
    return queue


def _token(options: Mapping[str, str]) -> str | None:
    """Option token, else the content of option tokenFile, else $RCQ_TOKEN (here: on the driver).
    Messages say where the token came from, never what it is."""
    token, path = options.get("token"), options.get("tokenfile")
    if token is not None and path is not None:
        raise RcqOptionError("options token and tokenFile exclude each other: give one")
    where = "option token"
    if path is not None:
        where = f"the file of option tokenFile ({path})"
        try:
            token = read_private(Path(path), "token")
        except InvalidRequest as exc:
            raise RcqOptionError(f"option tokenFile: {exc.message}") from None
    elif token is None:
        token, where = os.environ.get("RCQ_TOKEN") or None, "RCQ_TOKEN"
    if token is None:
        return None
    token = token.strip()
    if not TOKEN_CHARACTERS.match(token):
        raise RcqOptionError(f"{where} must be one token: printable characters, no spaces (the value is not shown)")
    return token


def _ca_pem(options: Mapping[str, str]) -> str | None:
    """The certificates of option caFile, checked now so that a bad file fails before any task runs."""
    path = options.get("cafile")
    if path is None:
        return None
    try:
        pem = Path(path).read_text()
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise ValueError("it holds no PEM certificate")
        ssl.create_default_context(cadata=pem)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise RcqOptionError(f"option caFile={path!r} cannot be used ({exc}): give a PEM file of CA certificates"
                             ) from None
    return pem


def _shares(options: Mapping[str, str]) -> tuple[int, ...] | None:
    """``drainShares`` (set by rcq.spark.drain for a spread queue): one count per transaction of ``transactionId``."""
    raw = options.get("drainshares")
    if raw is None:
        return None
    try:
        shares = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise RcqOptionError(f"option drainShares={raw!r} is not a comma-separated list of integers") from None
    if any(share < 0 for share in shares) or len(shares) != len((options.get("transactionid") or "").split(",")):
        raise RcqOptionError("option drainShares needs a count >= 0 for each transaction of option transactionId")
    return shares


def parse_options(options: Mapping[str, str]) -> RcqOptions:
    """Check every option the data source knows; unknown options are ignored (Spark adds its own)."""
    options = {str(k).lower(): str(v) for k, v in options.items()}
    value_type = options.get("valuetype", "binary").strip().lower()
    if value_type not in VALUE_TYPES:
        raise RcqOptionError(f"option valueType={value_type!r} is unknown: use binary or string")
    max_items_raw = options.get("maxitems")
    return RcqOptions(
        urls=_urls(options),
        queue=_queue(options),
        value_type=value_type,
        batch_size=_int(options, "batchSize", 1000, 1, DEQUEUE_ITEMS_MAX),
        coalesce=options.get("coalesce", "false").strip().lower() in ("true", "1", "yes"),
        requests_in_flight=_int(options, "requestsInFlight", 4, 1, 64),
        transaction_timeout_s=_float(options, "transactionTimeoutSeconds", 600.0, 0.0, TRANSACTION_TIMEOUT_MAX_S),
        transaction_bytes_max=_int(options, "transactionBytesMax", 4 << 20, 1024, TRANSACTION_BYTES_MAX),
        request_timeout_s=_float(options, "requestTimeoutSeconds", 30.0, 0.0, 3600.0),
        retry_timeout_s=_float(options, "retryTimeoutSeconds", 30.0, 0.0, 3600.0),
        num_partitions=_int(options, "numPartitions", 2, 1, 1000),
        max_items_per_partition=_int(options, "maxItemsPerPartition", 1000, 1, 10_000_000),
        consumer_id=_identifier(options, "consumerId"),
        sink_id=_identifier(options, "sinkId"),
        max_items=None if max_items_raw is None else _int(options, "maxItems", 0, 1),
        transaction_id=options.get("transactionid"),
        drain_shares=_shares(options),
        delay_s=_seconds(options, "delayS", 0.0, DELAY_MAX_S, low_allowed=True),
        ttl_s=_seconds(options, "ttlS", 0.0, TTL_MAX_S, low_allowed=False),
        token=_token(options),
        ca_pem=_ca_pem(options),
    )


def sink_id_of(options: RcqOptions, raw: Mapping[str, str]) -> str:
    """The stream sink's stable id: option sinkId, else derived from the query's checkpoint location."""
    if options.sink_id is not None:
        return options.sink_id
    checkpoint = {str(k).lower(): v for k, v in raw.items()}.get("checkpointlocation")
    if not checkpoint:
        raise RcqOptionError("the rcq stream sink needs option sinkId or a checkpointLocation: the id makes a "
                             "replayed micro-batch commit nothing twice, so it must be stable across restarts")
    return "cp-" + hashlib.sha256(checkpoint.encode("utf-8")).hexdigest()[:24]


def require_consumer_id(options: RcqOptions) -> str:
    if options.consumer_id is None:
        raise RcqOptionError("option consumerId is required for a streaming read: a stable id, unique per running "
                             "query (like a Kafka group id); a restarted query finds its open transactions by it")
    return options.consumer_id
