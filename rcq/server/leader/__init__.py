"""The leader's volatile side: its verbs (``transactions``, the front door, and the parts it hands
them to: ``open_transactions``, ``dequeue``, ``commit_path``, ``queue_admin``), the state they share
for one epoch (``leader_state``), group commit (``group_commit``) and its view of the queues
(``queue_view``). Knows the Replicator protocol, never pysyncobj; never imports ``rcq.server.http``.
"""
