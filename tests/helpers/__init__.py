"""What the tests share, and the one home of the bounds they wait with.

Helpers live in this package, fixtures in conftest files (``tests/conftest.py`` for the whole
suite, one per folder for its own). A module of the suite imports from here or from a helper
module beside it (``tests/integration/workload.py``, ``tests/spark/helpers.py``, ...), never from
a test module or a conftest: ``tests/unit/test_suite_rules.py`` checks both rules.

* :mod:`tests.helpers.nodes`: in-process nodes (the HTTP app over the in-memory replicator), a
  node configuration, the leader's transaction manager driven directly;
* :mod:`tests.helpers.fakes`: a recording fake node and a wire recorder for the client's tests,
  and answers a real node gives;
* :mod:`tests.helpers.cli`: the ``rcq`` command run in a thread;
* :mod:`tests.helpers.state`: one replica's state machine fed encoded commands, and views of it;
* :mod:`tests.helpers.raft`: real pysyncobj nodes in this process;
* :mod:`tests.helpers.manual_raft`: one real node whose Raft a test steps by hand, playing its peers;
* :mod:`tests.helpers.cluster`: real multi-process clusters (``running_cluster``);
* :mod:`tests.helpers.node_logs`: no ERROR line or traceback in a cluster's node logs but those
  a test declares it causes (``@pytest.mark.expected_log_errors``);
* :mod:`tests.helpers.history`: hand-written chaos histories for the checkers;
* :mod:`tests.helpers.imports`: what a Python source imports (the architecture and suite rules).

The bounds below are for waits that end much sooner on a healthy run: generous, because the
machine running the suite may be small and shared; only a failing test waits them out.

Must not import: a test module or a conftest; anything heavy (the submodules import what they need).
"""

from __future__ import annotations

# Real clusters: separate processes on loopback (rcq.local.cluster.LocalCluster).
LEADER_TIMEOUT_S = 60.0  # a started, restarted or failed-over cluster has a serving leader
CLUSTER_WAIT_S = 60.0  # any other wait on a cluster that the test loads, kills or changes
QUIET_CLUSTER_WAIT_S = 30.0  # a wait on a cluster with no load but the test's own requests
BALANCE_WAIT_S = 120.0  # the balancer spreads partition leaders: a move at a time, each seen before the next
SPREAD_RECEIVE_WAIT_S = 20.0  # a long poll over a spread queue's fragments outlasts a commit into one of them
FRAGMENT_PASS_WAIT_S = 15.0  # a client's one-request verb is done with a dark fragment (its 5 s budget, loaded)
MEMBER_CHANGE_TIMEOUT_S = 90.0  # a partition's member added or removed, and every member caught up (seconds here)
TOKEN_RELOAD_TIMEOUT_S = 10.0  # nodes re-read a changed tokens file within about a second
FLOOD_REQUEST_TIMEOUT_S = 60.0  # one request of a client while the test floods the cluster
LAUNCHER_START_TIMEOUT_S = 90.0  # `python -m cluster up` prints a serving cluster
LAUNCHER_EXIT_TIMEOUT_S = 60.0  # the launcher and its nodes are gone after SIGTERM
STATUS_PAGE_WAIT_MS = 20_000  # the status page in a browser shows a change (Playwright counts in ms)

# This process: in-process nodes, forked children, local sockets.
NODE_SERVING_TIMEOUT_S = 5.0  # a node over the in-memory replicator serves (at once, but for the loop)
LOCAL_WAIT_S = 10.0  # a single node leads, a peer's message arrives, a digest child answers
FLOOD_PAUSE_WAIT_S = 60.0  # an in-process node stops reading a client that floods it and reads nothing
# (about 1.5 s alone; several times that beside the suite's other workers on 2 cores)
LOCAL_RAFT_WAIT_S = 30.0  # real pysyncobj nodes of this process (or its children) elect, replicate, compact, agree
FORKED_CHILD_WAIT_S = 30.0  # a forked child of this process (a snapshot writer) finishes its work
GATE_WAIT_S = 60.0  # a forked child held at a test's gate waits for it this long (the test's own waits come first)
HAND_OVER_SUBMIT_TIMEOUT_S = 30.0  # a proposal held while leadership is handed over
HAND_OVER_WAIT_S = 30.0  # a hand-over played step by step ends, polls, or reaches a step (tests/integration/test_hand_over.py)
PROXY_ANSWER_TIMEOUT_S = 5.0  # an answer through the chaos network proxy
EXPIRING_WAIT_S = 0.2  # a wait a test lets run out on purpose: the timeout is what it checks
NEVER_WAIT_S = 5.0  # a wait that must run out: what it waits for would have happened by then if it could
RAW_CASE_LISTEN_S = 0.3  # a fuzz case of raw bytes listens this long for the node's answer, then hangs up

# Containers: docker-compose.yml's cluster on Docker or Podman (tests/integration/test_compose.py,
# the chaos harness's docker target). The image's own build steps have their bounds in cluster/image.py.
COMPOSE_COMMAND_TIMEOUT_S = 120.0  # one compose or engine command (up, kill, start, down: seconds each here)
COMPOSE_READY_TIMEOUT_S = 90.0  # every node of a project started (or started again) answers /readyz
COMPOSE_FAILOVER_TIMEOUT_S = 30.0  # the leader's container killed: another leader, and a commit (about 3 s here)
COMPOSE_CONVERGED_TIMEOUT_S = 60.0  # a container started again has its peers' state digest (seconds here)
COMPOSE_HEALTHY_TIMEOUT_S = 60.0  # Docker reports a node's container healthy (its healthcheck: every 5 s)
CURL_TIMEOUT_S = 10.0  # one curl request to a published port
COMPOSE_PORTS_LOCK_TIMEOUT_S = 420.0  # another process's compose tests or docker chaos run release the fixed ports

# A scratch install of the package (a venv, pip).
INSTALL_TIMEOUT_S = 240.0  # a venv with pip, then build and install, on a loaded 2-core machine
INSTALLED_COMMAND_TIMEOUT_S = 60.0  # a command of the installed package

# Spark (JVMs).
SPARK_QUERY_TIMEOUT_S = 240.0  # a streaming query in local mode finishes
SPARK_STANDALONE_WAIT_S = 150.0  # a held task, a replacement executor, a job or a query on standalone JVMs
