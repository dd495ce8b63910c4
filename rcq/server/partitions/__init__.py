"""Partitions: the Raft groups of one cluster beyond p0, each run by a process of its own on
each of its member nodes (docs/partitions.md). The node's process supervises them.

Must not import: pysyncobj, lmdb (a partition process reaches them through rcq.server.node).
"""
