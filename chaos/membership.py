"""Membership changes as the chaos harness makes them, through the admin HTTP API.

:class:`MembershipChanger` removes one voting member through the leader and re-adds it as itself
(same node id, Raft address and URL: :meth:`chaos.target.MembershipControl.member_identity`),
and reads the leader's view of the members. Each change follows the cluster as a client
would:

* it goes to the serving leader (:meth:`chaos.target.ChaosTarget.leader`); a ``not_leader``
  answer is followed to its ``leader_url`` at once (removing the leader itself answers so once
  it has handed leadership over; the removal is re-sent to the new leader);
* answers that a cluster being hurt or healed gives for a while are retried until a deadline:
  for a removal ``membership_conflict`` (a change in flight), ``no_leader``, ``not_ready``,
  ``unavailable``, ``commit_outcome_unknown`` and no answer at all; an addition also retries
  ``node_unreachable`` and ``would_lose_quorum`` (other faults are healing);
* a removal the leader refuses (``would_lose_quorum``, ``member_not_found``) is an outcome, not
  a failure; after an attempt whose outcome is unknown (no answer, ``commit_outcome_unknown``)
  ``member_not_found`` means that attempt removed it, and ``member_exists`` of the same identity
  means an addition did.

Every change returns an outcome dict for the history: what became of it, every attempt (to whom,
what it answered, when, capped), the answers counted by code, and timings. After an addition,
:meth:`MembershipChanger.wait_caught_up` measures how long the node took to apply what the leader
had committed by then (seen from the node itself, not the leader's match index).

Must not import: any rcq module (it speaks HTTP through the target), nor a target's module.
"""

from __future__ import annotations

import http.client
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos.target import ChaosTarget, MembershipControl

REMOVE_TIMEOUT_S = 30.0  # finding a leader and removing the node, all attempts
READD_TIMEOUT_S = 60.0  # restarting (and wiping) the node and adding it back, all attempts
CATCH_UP_WAIT_S = 15.0  # after the addition, for the node to apply what the leader had committed
SERVER_CATCH_UP_S = 5.0  # the addition's own catch_up_timeout_s: the leader answers once it is caught up
REQUEST_TIMEOUT_S = 10.0  # one query; a change gets CHANGE_EXTRA_S more, an addition SERVER_CATCH_UP_S too
CHANGE_EXTRA_S = 20.0  # the leader's hand-over, health probe, directory record and membership commit
CONFIRM_TIMEOUT_S = 5.0  # at the deadline, after an attempt of unknown outcome: one look at the leader's view
RETRY_PAUSE_S = (0.2, 2.0)  # first and largest pause between attempts
REDIRECTS_FOLLOWED_MAX = 5  # not_leader answers followed at once before pausing
ATTEMPTS_RECORDED_MAX = 30
FINAL_VIEW_TIMEOUT_S = 20.0
OWN_VIEW_TIMEOUT_S = 2.0

RETRYABLE = frozenset({"membership_conflict", "no_leader", "not_ready", "unavailable", "commit_outcome_unknown",
                       "request_timeout", "too_many_connections", "transport"})
ADD_RETRYABLE = RETRYABLE | {"node_unreachable", "would_lose_quorum"}
REMOVE_REFUSALS = frozenset({"would_lose_quorum", "member_not_found"})
UNCERTAIN = frozenset({"commit_outcome_unknown", "transport"})  # the change may have been made
TRANSPORT_ERRORS = (OSError, ValueError, http.client.HTTPException)


class MembershipChanger:
    """Membership changes on ``cluster`` (a target with ``control``, chaos.target.membership_control).
    ``clock`` and ``sleep`` are injectable for tests."""

    def __init__(self, cluster: ChaosTarget, control: MembershipControl, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.cluster = cluster
        self.control = control
        self.clock = clock
        self.sleep = sleep

    # ------------------------------------------------------------ helpers
    def node_id(self, i: int) -> str:
        return self.cluster.nodes[i].node_id

    def index_of_url(self, url: object) -> int | None:
        """The node advertising ``url`` (a ``leader_url``), or None."""
        if not isinstance(url, str) or not url:
            return None
        wanted = url.rstrip("/")
        return next((i for i, u in enumerate(self.cluster.client_urls) if u.rstrip("/") == wanted), None)

    def ask(self, i: int, path: str, method: str = "GET", body: dict[str, Any] | None = None,
            timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[str, dict[str, Any]]:
        """(code, body): ``"ok"`` and the answer, an error's code and its ``error`` object, or
        ``"transport"`` when there was no answer."""
        try:
            answer = self.control.admin_request(i, path, method, body, timeout_s)
        except TRANSPORT_ERRORS as exc:
            return "transport", {"message": f"{type(exc).__name__}: {exc}"[:300]}
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, dict):
            return str(error.get("code") or "error"), error
        return "ok", answer if isinstance(answer, dict) else {}

    def _leader(self) -> int | None:
        try:
            return self.cluster.leader()
        except TRANSPORT_ERRORS:
            return None

    def _timeout(self, deadline: float, cap: float) -> float:
        return max(1.0, min(cap, deadline - self.clock()))

    def leader_view(self, deadline: float) -> dict[str, Any] | None:
        """The serving leader's ``GET /v1/cluster/members``, as ``{"leader": index, "leader_id",
        "members": [node ids]}``, waiting for a leader that answers as one until ``deadline``;
        None when none did."""
        pause = _Pause(self)
        while True:
            leader = self._leader()
            if leader is not None:
                code, answer = self.ask(leader, "/v1/cluster/members", timeout_s=self._timeout(deadline, REQUEST_TIMEOUT_S))
                members = answer.get("members") if code == "ok" else None
                if isinstance(members, list) and answer.get("leader_id") == self.node_id(leader):
                    return {"leader": leader, "leader_id": self.node_id(leader),
                            "members": [str(m.get("node_id")) for m in members if isinstance(m, dict)]}
            if self.clock() >= deadline:
                return None
            pause.wait(deadline)

    def is_member(self, i: int, timeout_s: float = CONFIRM_TIMEOUT_S) -> bool | None:
        """Whether node ``i`` votes in the leader's view; None when no leader answered."""
        view = self.leader_view(self.clock() + timeout_s)
        return None if view is None else self.node_id(i) in view["members"]

    # ------------------------------------------------------------ remove
    def remove(self, i: int, deadline: float) -> dict[str, Any]:
        """Remove node ``i`` through the leader, retrying until ``deadline``; the outcome
        (``removed`` true or false, ``result``: removed, refused, gave_up or error)."""
        log = _Attempts(self, self.node_id(i))
        uncertain = handed_over = False
        pause = _Pause(self)
        route = _Route(self, pause)
        while True:
            if self.clock() >= deadline:
                if uncertain and self.is_member(i) is False:
                    return log.outcome("removed", removed=True, handed_over=handed_over,
                                       confirmed="absent from the leader's view after an attempt of unknown outcome")
                return log.outcome("gave_up", removed=False, handed_over=handed_over)
            leader = route.next()
            if leader is None:
                log.note(None, "no_leader")
                pause.wait(deadline)
                continue
            code, answer = self.ask(leader, f"/v1/cluster/members/{self.node_id(i)}", "DELETE",
                                    timeout_s=self._timeout(deadline, REQUEST_TIMEOUT_S + CHANGE_EXTRA_S))
            log.note(leader, code)
            if code == "ok" and "removed" in answer:
                return log.outcome("removed", removed=True, handed_over=handed_over, via=self.node_id(leader))
            if code == "not_leader":
                handed_over = handed_over or leader == i  # the leader removed itself: it handed over first
                route.redirected(leader, answer, deadline)
                continue
            route.answered()
            if code == "member_not_found" and uncertain:  # an attempt with no answer removed it
                return log.outcome("removed", removed=True, handed_over=handed_over, via=self.node_id(leader),
                                   confirmed="absent after an attempt of unknown outcome")
            if code in REMOVE_REFUSALS:
                return log.outcome("refused", removed=False, handed_over=handed_over, reason=code,
                                   message=str(answer.get("message", ""))[:300])
            if code in RETRYABLE:
                uncertain = uncertain or code in UNCERTAIN
                pause.wait(deadline)
                continue
            return log.outcome("error", removed=False, handed_over=handed_over, reason=code,
                               message=str(answer.get("message", ""))[:300])

    # ------------------------------------------------------------ add
    def add(self, i: int, deadline: float) -> dict[str, Any]:
        """Re-add node ``i`` as itself through the leader, retrying until ``deadline``; the
        outcome (``added`` true or false, ``result``: added, already_member, gave_up or error),
        with ``asked_at`` (the clock when the attempt that made it was sent) for the catch-up."""
        identity = self.control.member_identity(i)
        body = {**identity, "catch_up_timeout_s": SERVER_CATCH_UP_S}
        log = _Attempts(self, identity["node_id"])
        uncertain_since: float | None = None
        pause = _Pause(self)
        route = _Route(self, pause)
        while True:
            if self.clock() >= deadline:
                if uncertain_since is not None and self.is_member(i):
                    return log.outcome("already_member", added=True, leader=None, asked_at=uncertain_since,
                                       after_unknown_outcome=True,
                                       confirmed="in the leader's view after an attempt of unknown outcome")
                return log.outcome("gave_up", added=False)
            leader = route.next()
            if leader is None:
                log.note(None, "no_leader")
                pause.wait(deadline)
                continue
            sent = self.clock()
            code, answer = self.ask(leader, "/v1/cluster/members", "POST", body,
                                    timeout_s=self._timeout(deadline, REQUEST_TIMEOUT_S + SERVER_CATCH_UP_S
                                                            + CHANGE_EXTRA_S))
            log.note(leader, code)
            if code == "ok" and "added" in answer:
                return log.outcome("added", added=True, caught_up=answer.get("caught_up"), via=self.node_id(leader),
                                   leader=leader, asked_at=sent)
            if code == "not_leader":
                route.redirected(leader, answer, deadline)
                continue
            route.answered()
            if code == "member_exists":
                found = answer.get("details")
                details: dict[str, Any] = found if isinstance(found, dict) else {}
                if (details.get("node_id"), details.get("raft_address")) in (
                        (identity["node_id"], identity["raft_address"]), (None, None)):
                    return log.outcome("already_member", added=True, via=self.node_id(leader), leader=leader,
                                       asked_at=uncertain_since if uncertain_since is not None else sent,
                                       after_unknown_outcome=uncertain_since is not None)
                return log.outcome("error", added=False, reason=code, message=str(answer.get("message", ""))[:300])
            if code in ADD_RETRYABLE:
                if code in UNCERTAIN and uncertain_since is None:
                    uncertain_since = sent
                pause.wait(deadline)
                continue
            return log.outcome("error", added=False, reason=code, message=str(answer.get("message", ""))[:300])

    def wait_caught_up(self, i: int, added: dict[str, Any], timeout_s: float = CATCH_UP_WAIT_S) -> dict[str, Any]:
        """After ``add`` made node ``i`` a member again: the leader's commit index then, how long
        (from the attempt that added it) until node ``i`` itself had applied it, and how many
        snapshots it had installed by then (since its last start)."""
        leader = added.get("leader")
        deadline = self.clock() + timeout_s
        if not isinstance(leader, int):  # confirmed from a view, not from the leader's answer
            leader = self._leader()
        target: int | None = None
        if isinstance(leader, int):
            code, status = self.ask(leader, "/v1/cluster", timeout_s=self._timeout(deadline, REQUEST_TIMEOUT_S))
            if code == "ok" and status.get("commit_index") is not None:
                target = int(status["commit_index"])
        if target is None:
            return {"catch_up_s": None, "catch_up": "the leader's commit index was not read"}
        pause = _Pause(self, first_s=0.1, largest_s=0.5)
        while True:
            code, status = self.ask(i, "/v1/cluster", timeout_s=self._timeout(deadline, REQUEST_TIMEOUT_S))
            applied = status.get("last_applied") if code == "ok" else None
            if applied is not None and int(applied) >= target:
                # Since its (re)start: a wiped node that shows one caught up from a snapshot install.
                return {"catch_up_s": round(self.clock() - float(added["asked_at"]), 3), "catch_up_index": target,
                        "snapshots_received": status.get("snapshots_received")}
            if self.clock() >= deadline:
                return {"catch_up_s": None, "catch_up_index": target,
                        "catch_up": f"not applied within {timeout_s} s (last {applied})"}
            pause.wait(deadline)

    def readd(self, i: int, deadline: float) -> dict[str, Any]:
        """``add`` then ``wait_caught_up``: the outcome of both."""
        outcome = self.add(i, deadline)
        if outcome["added"]:
            outcome.update(self.wait_caught_up(i, outcome))
        outcome.pop("asked_at", None)  # this process's clock and the leader's index: not for the history
        outcome.pop("leader", None)
        return outcome

    def readd_missing(self, timeout_s: float = READD_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every node missing from the leader's view re-added (each with ``timeout_s``); one
        outcome per node (``node`` is its index), or one ``{"error"}`` when no leader answered."""
        view = self.leader_view(self.clock() + FINAL_VIEW_TIMEOUT_S)
        if view is None:
            return [{"error": f"no serving leader answered GET /v1/cluster/members within {FINAL_VIEW_TIMEOUT_S} s"}]
        outcomes = []
        for i in range(len(self.cluster.nodes)):
            if self.node_id(i) not in view["members"]:
                outcomes.append({"index": i, **self.readd(i, self.clock() + timeout_s)})
        return outcomes


def final_view(cluster: ChaosTarget, control: MembershipControl, timeout_s: float = FINAL_VIEW_TIMEOUT_S,
               changer: MembershipChanger | None = None) -> dict[str, Any]:
    """The membership checker's input: the leader's view of the voting members (``leader``,
    ``members``), every node (``nodes``) and what each says of itself (``member`` in its
    ``/v1/cluster``: None when it did not answer); ``error`` when no leader answered."""
    changer = changer or MembershipChanger(cluster, control)
    nodes = [node.node_id for node in cluster.nodes]
    own: dict[str, bool | None] = {}
    for i, node_id in enumerate(nodes):
        code, status = changer.ask(i, "/v1/cluster", timeout_s=OWN_VIEW_TIMEOUT_S)
        own[node_id] = bool(status["member"]) if code == "ok" and "member" in status else None
    view = changer.leader_view(changer.clock() + timeout_s)
    if view is None:
        return {"nodes": nodes, "own_view": own,
                "error": f"no serving leader answered GET /v1/cluster/members within {timeout_s} s"}
    return {"nodes": nodes, "leader": view["leader_id"], "members": view["members"], "own_view": own}


class _Pause:
    """Growing pauses between attempts, never past a deadline."""

    def __init__(self, changer: MembershipChanger, first_s: float = RETRY_PAUSE_S[0],
                 largest_s: float = RETRY_PAUSE_S[1]) -> None:
        self.changer = changer
        self.next_s = first_s
        self.largest_s = largest_s

    def wait(self, deadline: float) -> None:
        left = deadline - self.changer.clock()
        if left > 0:
            self.changer.sleep(min(self.next_s, left))
        self.next_s = min(self.largest_s, self.next_s * 2)


class _Route:
    """Whom to ask next: the node a ``not_leader`` answer named (followed up to
    REDIRECTS_FOLLOWED_MAX times in a row), else the leader the harness finds."""

    def __init__(self, changer: MembershipChanger, pause: _Pause) -> None:
        self.changer = changer
        self.pause = pause
        self.redirect: int | None = None
        self.redirects = 0

    def next(self) -> int | None:
        leader = self.redirect if self.redirect is not None else self.changer._leader()
        self.redirect = None
        return leader

    def redirected(self, asked: int, answer: dict[str, Any], deadline: float) -> None:
        self.redirect = self.changer.index_of_url(answer.get("leader_url"))
        self.redirects += 1
        if self.redirect is None or self.redirect == asked or self.redirects > REDIRECTS_FOLLOWED_MAX:
            self.redirect, self.redirects = None, 0
            self.pause.wait(deadline)

    def answered(self) -> None:
        self.redirects = 0


class _Attempts:
    """The attempts of one change, for its outcome: to whom, what was answered, when."""

    def __init__(self, changer: MembershipChanger, node_id: str) -> None:
        self.changer = changer
        self.node_id = node_id
        self.started = changer.clock()
        self.attempts: list[dict[str, Any]] = []
        self.codes: Counter[str] = Counter()
        self.count = 0

    def note(self, to: int | None, code: str) -> None:
        self.count += 1
        self.codes[code] += 1
        if len(self.attempts) < ATTEMPTS_RECORDED_MAX:
            self.attempts.append({"to": None if to is None else self.changer.node_id(to), "answer": code,
                                  "at_s": round(self.changer.clock() - self.started, 3)})

    def outcome(self, result: str, **extra: Any) -> dict[str, Any]:
        return {"node": self.node_id, "result": result, **extra, "attempts_count": self.count,
                "answers": dict(self.codes), "elapsed_s": round(self.changer.clock() - self.started, 3),
                "attempts": self.attempts}
