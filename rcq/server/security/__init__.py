"""Who may talk to a node and how: API tokens and permissions (:mod:`.tokens`), TLS (:mod:`.tls`).

Must not import: aiohttp, pysyncobj, lmdb.
"""
