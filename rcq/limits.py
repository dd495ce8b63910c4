"""The server's default limits that clients check before they ask, defined once.

``NodeConfig`` takes its defaults from here, and the Spark data source validates its options
against the same values (a node configured lower still refuses with a clear error).

Must not import: anything of rcq (the client installs without the server).
"""

DEQUEUE_ITEMS_MAX = 10_000  # most items one dequeue may return
TRANSACTION_TIMEOUT_MAX_S = 3600.0  # longest deadline a transaction may ask for
TRANSACTION_BYTES_MAX = 8 << 20  # most item bytes one transaction may enqueue (headers included)
COMMIT_ENTRY_BYTES_MAX = 8 << 20  # most item bytes the group committer puts into one Raft entry
PRIORITY_MAX = 255  # highest priority an enqueue may carry (a queue's max_priority may be lower)
DELAY_MAX_S = 7 * 86400.0  # longest delay_s / default_delay_s
TTL_MAX_S = 365 * 86400.0  # longest ttl_s / default_ttl_s
MAX_DELIVERIES_MAX = 1000  # highest max_deliveries a queue may set
# Item headers (docs/limits.md): per item, at most this many, keys and values at most this many
# UTF-8 bytes each, and all keys and values together at most HEADERS_BYTES_MAX.
HEADERS_PER_ITEM_MAX = 64
HEADER_KEY_BYTES_MAX = 256
HEADER_VALUE_BYTES_MAX = 4096
HEADERS_BYTES_MAX = 16 * 1024
# An idempotency key beginning with this is a retry key (docs/limits.md): the client library's
# own keys, which only its retries use. A cluster at feature level 3 remembers them 10 minutes
# (at least 2 when its table is full) instead of a user's key's 24 hours (at least 15 minutes).
RETRY_KEY_PREFIX = "rcq-retry:"
