"""Replication: the Replicator protocol (``protocol``), its pysyncobj implementation
(``replicator``) and the LMDB snapshots (``snapshots``). The only folder that imports pysyncobj
or lmdb; every pysyncobj hazard and rcq's answer to it is in docs/raft-hazards.md.
"""
