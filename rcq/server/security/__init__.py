"""Who may talk to a node: TLS (:mod:`.tls`). API tokens and permissions are :mod:`rcq.tokens`,
outside the server: the ``rcq token`` commands write tokens files with the client install alone.

Must not import: aiohttp, pysyncobj, lmdb.
"""
