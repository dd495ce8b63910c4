"""The leader's volatile side: open transactions, dequeue locks and deadlines
(``transactions``), group commit (``group_commit``) and its view of the queues
(``queue_view``). Knows the Replicator protocol, never pysyncobj.
"""
