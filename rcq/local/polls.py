"""What a cluster's nodes say over HTTP, and the bounded waits built on it.

:class:`PolledCluster` is the part of a cluster harness that only asks: each node's
``/v1/cluster``, ``/v1/cluster/digest`` and ``/healthz``, polled in parallel with a short
socket timeout; who leads; and the waits (nodes answering, a serving leader, every node has
applied, every node has the same state digest). Every wait is bounded by a deadline and
fails with a ``TimeoutError`` showing what each node said last. Subclasses supply the nodes
and how to reach them: :class:`rcq.local.cluster.LocalCluster` (processes on loopback) and
the chaos harness's docker-compose target.

Everything is synchronous (``urllib``, one thread per node polled), so it works from plain
pytest fixtures, scripts and the worker threads of an asyncio program alike. Only *live*
nodes (running, not paused, reachable) are polled: asking a SIGSTOPped node would only
cost a socket timeout per poll.

Nodes that need a token are polled with the cluster's admin token (:attr:`PolledCluster.token`:
the digest and snapshots are admin routes, and ``/v1/cluster`` shows the indices the waits
need only to an admin); nodes serving HTTPS are verified against the cluster's CA
(:attr:`PolledCluster.ca_file`), as any client would verify them, and are shown its client
certificate (:attr:`PolledCluster.client_cert`) when they require one.

Must not import: rcq.server, pysyncobj, lmdb, aiohttp (standard-library HTTP only).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")

POLL_TIMEOUT_S = 1.0  # socket timeout of one poll: a stuck node must not stall a wait
# A digest is computed over the node's whole state (in a forked child): a state of 100,000s of
# items or idempotency keys takes seconds on a loaded machine, and a digest asked again after a
# 1 s timeout only queues another one behind it (the abuse suite's 120k keys never converged
# beside the suite's parallel workers).
DIGEST_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.05
START_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 30.0
# Keys of /v1/cluster worth showing in a TimeoutError (the whole body is noisy).
STATUS_SUMMARY_KEYS = ("role", "term", "leader_id", "serving", "commit_index", "last_applied", "has_quorum")


class NodeStartError(RuntimeError):
    """A node exited while the harness waited for it to answer (its log tail is in the message)."""


# ------------------------------------------------------------------ HTTP
# No proxy: an http_proxy variable in the environment must not route loopback polls elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, timeout_s: float = POLL_TIMEOUT_S, method: str = "GET", *,
              token: str | None = None, context: ssl.SSLContext | None = None,
              body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request straight to a node, decoding its JSON body; error statuses with a JSON body
    (``/readyz``'s 503, say) are answers too. ``token`` is sent as ``Authorization: Bearer``;
    ``context`` verifies an HTTPS node (default: the system's CAs)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else b"{}" if method == "POST" else None
    request = urllib.request.Request(url, method=method, data=data, headers=headers)
    opener = _OPENER if context is None else _https_opener(context)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        answer = exc.read()
        try:
            return dict(json.loads(answer))
        except ValueError:
            raise exc from None


@functools.lru_cache(maxsize=16)
def _https_opener(context: ssl.SSLContext) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))


def ca_context(ca_file: Path | str | None, client_cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """An SSL context that verifies servers against ``ca_file`` (None: the system's CAs),
    presenting ``client_cert`` (certificate file, key file) to servers that ask for one."""
    context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    if client_cert is not None:
        context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
    return context


# ------------------------------------------------------- decisions (pure, tested)
def majority(size: int) -> int:
    return size // 2 + 1


def leader_from_views(views: dict[int, dict[str, Any]], urls: Sequence[str]) -> int | None:
    """The node that says it is leader and serving, whose URL a majority of the cluster names as
    leader in ``views`` (index -> /v1/cluster body); else None.

    ``urls`` are the URLs the nodes advertise (what they put in ``leader_url``). The cluster is
    the membership the candidate reports (its ``peers`` and itself: membership changes make it
    differ from the harness's nodes), or every node of ``urls`` for a view without ``peers``. The
    majority is of that membership, not of the nodes that answered, and only members' views
    count: a node cut off from the others may still call itself leader for a while, and its own
    view alone must not count.
    """
    for index, view in views.items():
        if view.get("role") != "leader" or not view.get("serving"):
            continue
        peers = view.get("peers")
        if isinstance(peers, list):
            members = {str(p.get("url")) for p in peers if isinstance(p, dict)} | {urls[index]}
        else:
            members = set(urls)
        agreeing = sum(1 for i, other in views.items()
                       if urls[i] in members and other.get("leader_url") == urls[index])
        if agreeing >= majority(len(members)):
            return index
    return None


def converged(digests: dict[int, dict[str, Any] | None], wanted: Iterable[int]) -> bool:
    """True when every wanted node answered, all with the same digest at the same applied index,
    and so did each partition's processes on them (``partitions`` of a node's digest, where a
    process that did not answer is null; docs/partitions.md)."""
    answers = [digests.get(i) for i in wanted]
    if not answers or any(a is None for a in answers):
        return False
    if len({(a["digest"], a["applied_index"]) for a in answers if a is not None}) != 1:
        return False
    return all(len(states) == 1 and None not in states for states in _partition_states(answers).values())


def _partition_states(answers: list[dict[str, Any] | None]) -> dict[str, set[tuple[str, int] | None]]:
    """partition -> the (digest, applied index) its processes on these nodes answered."""
    states: dict[str, set[tuple[str, int] | None]] = {}
    for answer in answers:
        for name, part in ((answer or {}).get("partitions") or {}).items():
            states.setdefault(name, set()).add(None if part is None else (part["digest"], part["applied_index"]))
    return states


# ------------------------------------------------------------------ deadlines
def deadline_loop(timeout_s: float, interval_s: float = POLL_INTERVAL_S) -> Iterator[None]:
    """Yield until ``timeout_s`` has passed (always at least once), sleeping between iterations."""
    deadline = time.monotonic() + timeout_s
    while True:
        yield
        if time.monotonic() >= deadline:
            return
        time.sleep(interval_s)


# ------------------------------------------------------------------ the nodes
class PolledNode(Protocol):
    """What polling needs to know of a node besides its URL."""

    @property
    def node_id(self) -> str: ...

    def running(self) -> bool: ...

    def live(self) -> bool: ...

    def describe(self) -> str: ...


N = TypeVar("N", bound=PolledNode)


class PolledCluster(Generic[N]):
    """HTTP views of ``nodes`` and the waits on them; see the module docstring.

    A subclass sets ``nodes`` and implements :attr:`urls`, :meth:`poll_url` and :meth:`log_tail`.
    """

    nodes: list[N]
    start_timeout_s: float = START_TIMEOUT_S  # a node's start, up to answering /healthz
    poll_interval_s: float = POLL_INTERVAL_S
    token: str | None = None  # the admin token every poll sends (None: the nodes need none)
    ca_file: Path | None = None  # the CA of the nodes' HTTPS certificates (None: plain HTTP or the system's CAs)
    client_cert: tuple[Path, Path] | None = None  # (certificate, key) presented to nodes that require one
    _poll_context_cache: tuple[Path, ssl.SSLContext] | None = None

    @property
    def urls(self) -> list[str]:
        """The URL each node advertises: clients use them, and a node names its leader by one."""
        raise NotImplementedError

    def poll_url(self, i: int) -> str:
        """Where the harness itself asks node ``i`` (straight to it, past anything clients cross)."""
        raise NotImplementedError

    def log_tail(self, i: int) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------- HTTP
    def poll_json(self, url: str, timeout_s: float = POLL_TIMEOUT_S, method: str = "GET",
                  body: dict[str, Any] | None = None) -> dict[str, Any]:
        """:func:`http_json` with the cluster's admin token, verifying HTTPS against its CA."""
        return http_json(url, timeout_s, method, token=self.token, context=self._poll_context(), body=body)

    def _poll_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        # One context per CA file, reused by every poll (loading the CA costs more than the poll).
        cached = self._poll_context_cache
        if cached is None or cached[0] != self.ca_file:
            cached = (self.ca_file, ca_context(self.ca_file, self.client_cert))
            self._poll_context_cache = cached
        return cached[1]

    # ------------------------------------------------------------- views
    def live_indices(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.live()]

    def running_indices(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.running()]

    def status(self, i: int, timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
        """Node ``i``'s GET /v1/cluster (raises OSError if it does not answer)."""
        return self.poll_json(self.poll_url(i) + "/v1/cluster", timeout_s)

    def digest(self, i: int, timeout_s: float = DIGEST_TIMEOUT_S) -> dict[str, Any]:
        """Node ``i``'s GET /v1/cluster/digest: ``digest`` and ``applied_index``."""
        return self.poll_json(self.poll_url(i) + "/v1/cluster/digest", timeout_s)

    def request_snapshot(self, i: int, timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
        """Ask node ``i`` to snapshot and compact its log now (POST /v1/admin/snapshot)."""
        return self.poll_json(self.poll_url(i) + "/v1/admin/snapshot", timeout_s, method="POST")

    def poll(self, fetch: Callable[[int], T], indices: Sequence[int]) -> tuple[dict[int, T], dict[int, str]]:
        """Call ``fetch`` on each node in parallel: (answers, errors) by index."""
        answers: dict[int, T] = {}
        errors: dict[int, str] = {}
        if not indices:
            return answers, errors
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(indices)) as pool:
            futures = {i: pool.submit(fetch, i) for i in indices}
            for i, future in futures.items():
                try:
                    answers[i] = future.result()
                except (OSError, ValueError) as exc:  # refused, timed out, garbled
                    errors[i] = f"{type(exc).__name__}: {exc}"
        return answers, errors

    def statuses(self, indices: Sequence[int] | None = None) -> dict[int, dict[str, Any]]:
        """/v1/cluster of the given nodes (default: the live ones) that answered."""
        return self.poll(self.status, self.live_indices() if indices is None else indices)[0]

    def digests(self, indices: Sequence[int] | None = None) -> dict[int, dict[str, Any]]:
        """/v1/cluster/digest of the given nodes (default: the live ones) that answered."""
        return self.poll(self.digest, self.live_indices() if indices is None else indices)[0]

    def leader(self) -> int | None:
        """The serving leader a majority of the cluster names, from one poll of the live nodes."""
        return leader_from_views(self.statuses(), self.urls)

    def describe_seen(self, answers: dict[int, dict[str, Any]], errors: dict[int, str],
                      keys: Sequence[str] = STATUS_SUMMARY_KEYS) -> str:
        """One line per node: its state here and what it answered last (for a TimeoutError)."""
        lines = []
        for i, node in enumerate(self.nodes):
            if i in answers:
                seen = ", ".join(f"{k}={answers[i].get(k)!r}" for k in keys)
            elif i in errors:
                seen = f"no answer: {errors[i]}"
            else:
                seen = "not polled"
            lines.append(f"  {node.node_id} {self.poll_url(i)} [{node.describe()}]: {seen}")
        return "\n".join(lines)

    # ------------------------------------------------------------- waits
    def wait_for_http(self, indices: Iterable[int] | None = None, timeout_s: float | None = None) -> None:
        """Wait until the given nodes (default: the live ones) answer GET /healthz.

        Raises NodeStartError at once if one of them is no longer running, with its log tail.
        """
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        pending = set(self.live_indices() if indices is None else indices)
        errors: dict[int, str] = {}
        for _ in deadline_loop(timeout_s, self.poll_interval_s):
            for i in sorted(pending):
                node = self.nodes[i]
                if not node.running():
                    raise NodeStartError(f"{node.node_id} {node.describe()} while starting; its log:\n"
                                         + self.log_tail(i))
            answers, errors = self.poll(lambda i: self.poll_json(self.poll_url(i) + "/healthz"), sorted(pending))
            pending -= set(answers)
            if not pending:
                return
        raise TimeoutError(f"nodes {sorted(pending)} did not answer /healthz within {timeout_s} s:\n"
                           + self.describe_seen({}, errors))

    def wait_for_leader(self, timeout_s: float = WAIT_TIMEOUT_S) -> int:
        """Index of the node that is leader *and* serving, named as leader by a majority of the
        cluster among the live nodes' /v1/cluster views. Paused and stopped nodes are not asked.
        """
        answers: dict[int, dict[str, Any]] = {}
        errors: dict[int, str] = {}
        for _ in deadline_loop(timeout_s, self.poll_interval_s):
            answers, errors = self.poll(self.status, self.live_indices())
            leader = leader_from_views(answers, self.urls)
            if leader is not None:
                return leader
        raise TimeoutError(f"no serving leader agreed by {majority(len(self.nodes))} of {len(self.nodes)} "
                           f"nodes within {timeout_s} s; last seen:\n" + self.describe_seen(answers, errors))

    def wait_for_applied(self, timeout_s: float = WAIT_TIMEOUT_S) -> int:
        """Wait until every live node has applied the commit index the leader reported when it
        was first found by this call; returns that index. Finding the leader counts against the
        same deadline.
        """
        target: int | None = None
        answers: dict[int, dict[str, Any]] = {}
        errors: dict[int, str] = {}
        for _ in deadline_loop(timeout_s, self.poll_interval_s):
            live = self.live_indices()
            answers, errors = self.poll(self.status, live)
            if target is None:
                leader = leader_from_views(answers, self.urls)
                if leader is None:
                    continue
                target = int(answers[leader]["commit_index"])
            if all(i in answers and int(answers[i]["last_applied"]) >= target for i in live):
                return target
        what = "no serving leader was found" if target is None else f"live nodes did not apply index {target}"
        raise TimeoutError(f"{what} within {timeout_s} s; last seen:\n" + self.describe_seen(answers, errors))

    def wait_for_convergence(self, timeout_s: float = WAIT_TIMEOUT_S,
                             indices: Iterable[int] | None = None) -> dict[str, Any]:
        """Wait until the given nodes (default: every live one, whichever they are at each poll)
        report the same state digest at the same applied index, and each partition's processes on
        them too; returns ``{"digest", "applied_index"}`` (and ``partitions``: name -> the same, for
        a cluster with partitions). A given node that is not live counts as not converged yet.
        """
        fixed = None if indices is None else sorted(indices)
        answers: dict[int, dict[str, Any]] = {}
        errors: dict[int, str] = {}
        wanted: list[int] = []
        for _ in deadline_loop(timeout_s, self.poll_interval_s):
            live = self.live_indices()
            wanted = live if fixed is None else fixed
            answers, errors = self.poll(self.digest, [i for i in wanted if i in live])
            if converged(dict(answers), wanted):
                first = answers[wanted[0]]
                partitions = {name: {"digest": state[0], "applied_index": state[1]}
                              for name, states in _partition_states([answers[i] for i in wanted]).items()
                              for state in states if state is not None}
                return {"digest": first["digest"], "applied_index": first["applied_index"],
                        **({"partitions": partitions} if partitions else {})}
        who = "live nodes" if fixed is None else f"nodes {wanted}"
        raise TimeoutError(f"{who} did not converge within {timeout_s} s; last seen:\n"
                           + self.describe_seen(answers, errors, ("applied_index", "digest")))
