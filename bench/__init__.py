"""rcq's benchmarks, run from a checkout; not part of the installed package.

* ``python -m bench`` (:mod:`bench.__main__`, scenarios in :mod:`bench.scenarios`, ``--cpu`` in :mod:`bench.cpu`): throughput,
  latency, failover and memory figures of a cluster;
* ``python -m bench.soak``: fill a cluster's storage budget, drain it, watch memory;
* ``python -m bench.stall``: the apply stall of a state digest, in lock against forked;
* ``python -m bench.transfer``: rcq on the side-by-side harness's transfer workload (``./run bench-peers``);
* ``python -m bench.spark``: rows/s of the Spark connector next to rcq's own figures;
* ``python -m bench.isolation``: one partition's leader process frozen for 6 s, the other partitions'
  commit latency before and during it;
* ``python -m bench.threads``: each rcq process's and thread's share of a core over a window of a
  workload another program drives (the side-by-side harness's).

The benchmarks use rcq as a user does (the client, the Spark connector, the cluster harness of
``rcq.testing``); only ``bench.stall`` runs server code in process. Nothing in ``rcq`` imports them.

Must not import: chaos, tests.
"""
