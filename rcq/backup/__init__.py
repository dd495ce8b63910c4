"""Backups of an rcq cluster: the file format (:mod:`.fileformat`), shared by the nodes that serve a
backup, the ``rcq backup`` command that saves one and ``rcq restore`` that reads one (docs/backup.md).

Must not import: rcq.server, pysyncobj, lmdb, aiohttp.
"""
