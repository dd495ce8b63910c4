"""The ``membership`` nemesis and its checker, without a cluster.

* where it cannot work it is refused, saying why (docker; a target without member_identity);
* against a fake target whose admin API behaves as the leader's does (removing itself hands over
  and answers not_leader; errors scripted per request), the fault picks the leader or a follower,
  follows the hand-over, retries each transient answer, records refusals as outcomes, re-adds the
  node kept or wiped, stops after the other faults, and the final heal re-adds every node left out;
* the checker counts what happened and fails when a node is left out or the digests differ.
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest

import chaos.__main__ as chaos_main
from chaos.checkers import check
from chaos.checkers.membership import check_membership
from chaos.checkers.report import summary_text
from chaos.faults import Fault, FaultRefused
from chaos.membership import READD_TIMEOUT_S, REMOVE_TIMEOUT_S, MembershipChanger, final_view
from chaos.nemesis import DOCKER_KINDS, KINDS, MIXABLE, Nemesis, check_target, parse_kinds


# ------------------------------------------------------------------ fakes
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FakeCluster:
    """What the nemesis sees of a local target: nodes, a leader, and an admin API that behaves as
    rcq's membership routes do. ``script[method]`` holds answers to give first, one per request of
    that method: an error code, ``"transport"`` (no answer), or ``"<code>+done"`` (the change is
    made but the answer is that code: an outcome the client cannot know)."""

    target = "local"

    def __init__(self, n: int = 5, leader: int | None = 0, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.nodes = [SimpleNamespace(node_id=f"node-{i}", paused=False, up=True, raft_address=f"127.0.0.1:{9500 + i}")
                      for i in range(n)]
        for node in self.nodes:
            node.running = lambda node=node: node.up
        self.client_urls = [f"http://127.0.0.1:{8000 + i}" for i in range(n)]
        self.leader_index = leader
        self.members = [node.node_id for node in self.nodes]
        self.script: dict[str, list[str]] = {"DELETE": [], "POST": [], "GET": []}
        self.requests: list[tuple[str, str, str]] = []  # (to, method, path)
        self.events: list[tuple[str, int]] = []
        self.applied = 42
        self.healed = 0

    # capabilities
    def link_faults(self) -> object:
        return object()

    def node_isolation(self) -> None:
        return None

    def member_identity(self, i: int) -> dict[str, str]:
        return {"node_id": self.nodes[i].node_id, "raft_address": self.nodes[i].raft_address,
                "url": self.client_urls[i]}

    # views and lifecycle
    def leader(self) -> int | None:
        return self.leader_index

    def kill_node(self, i: int) -> None:
        self.events.append(("kill", i))
        self.nodes[i].up = False

    def wipe_node(self, i: int) -> None:
        assert not self.nodes[i].up
        self.events.append(("wipe", i))

    def start_node(self, i: int, wait: bool = True, timeout_s: float | None = None) -> None:
        self.events.append(("start", i))
        self.nodes[i].up = True

    def heal(self, timeout_s: float | None = None) -> list[int]:
        self.healed += 1
        stopped = [i for i, n in enumerate(self.nodes) if not n.up]
        for i in stopped:
            self.start_node(i)
        return stopped

    # the admin API
    def _error(self, code: str, leader_url: str | None = None, **details: Any) -> dict[str, Any]:
        error: dict[str, Any] = {"code": code, "message": f"fake {code}", "leader_url": leader_url}
        if details:
            error["details"] = details
        return {"error": error}

    def _leader_url(self) -> str | None:
        return None if self.leader_index is None else self.client_urls[self.leader_index]

    def admin_request(self, i: int, path: str, method: str = "GET", body: dict[str, Any] | None = None,
                      timeout_s: float = 1.0) -> dict[str, Any]:
        self.requests.append((self.nodes[i].node_id, method, path))
        node_id = self.nodes[i].node_id
        if method == "GET" and path == "/v1/cluster":
            return {"node_id": node_id, "commit_index": self.applied, "last_applied": self.applied,
                    "member": node_id in self.members, "snapshots_received": 1}
        if method == "GET" and path == "/v1/cluster/members":
            leader = None if self.leader_index is None else self.nodes[self.leader_index].node_id
            return {"leader_id": leader, "members": [{"node_id": m} for m in self.members]}
        scripted = self.script[method].pop(0) if self.script[method] else None
        if scripted == "transport":
            raise OSError("connection reset by the fake")
        code, _, done = (scripted or "").partition("+")
        if code and not done:
            return self._error(code, self._leader_url() if code == "not_leader" else None)
        if i != self.leader_index:
            return self._error("not_leader", self._leader_url())
        answer = self._delete(i, path) if method == "DELETE" else self._post(body or {})
        return self._error(code) if code else answer

    def _delete(self, i: int, path: str) -> dict[str, Any]:
        target = path.rsplit("/", 1)[1]
        if target not in self.members:
            return self._error("member_not_found")
        if target == self.nodes[i].node_id:  # the leader removes itself: it hands over first
            self.leader_index = next(k for k, n in enumerate(self.nodes) if n.node_id in self.members and k != i)
            return self._error("not_leader", self._leader_url())
        self.members.remove(target)
        return {"removed": {"node_id": target}, "members": [{"node_id": m} for m in self.members]}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        if body["node_id"] in self.members:
            return self._error("member_exists", node_id=body["node_id"], raft_address=body["raft_address"])
        self.members.append(body["node_id"])
        return {"added": {"node_id": body["node_id"]}, "caught_up": True, "members": []}


class Recorder:
    """The history, as the nemesis writes it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lines: list[dict[str, Any]] = []

    def info(self, process: str, f: str, value: Any) -> Any:
        self.lines.append({"process": process, "type": "info", "f": f, "value": value, "time_s": self.clock.now})
        return SimpleNamespace(time_s=self.clock.now)

    def phases(self) -> list[tuple[str, str]]:
        return [(line["f"], line["value"]["phase"]) for line in self.lines]


def make(n: int = 5, leader: int | None = 0, kinds: list[str] | None = None
         ) -> tuple[FakeCluster, Nemesis, Recorder, Clock]:
    clock = Clock()
    cluster = FakeCluster(n, leader, clock)
    history = Recorder(clock)
    nemesis = Nemesis(cluster, history, seed=1, kinds=kinds or ["membership"])
    changer = nemesis.faults.membership
    assert changer is not None
    changer.clock, changer.sleep = clock, clock.sleep
    return cluster, nemesis, history, clock


def rig(monkeypatch: pytest.MonkeyPatch, variant: str, data: str, pick: float = 0.0) -> None:
    """The fault's draws: which member (leader or follower), kept or wiped, and which follower."""
    monkeypatch.setattr(random.Random, "choice",
                        lambda self, seq: variant if variant in seq else data if data in seq else seq[0])
    monkeypatch.setattr(random.Random, "random", lambda self: pick)


def start(nemesis: Nemesis) -> None:
    asyncio.run(nemesis._start("membership", random.Random(0)))


# ------------------------------------------------------------------ where it works
def test_membership_is_a_kind_mixed_with_the_others_and_in_all_on_the_local_target():
    assert "membership" in KINDS and "membership" in MIXABLE and "membership" not in DOCKER_KINDS
    assert "membership" in parse_kinds("all")
    check_target(["membership", "kill"], "local")


def test_docker_refuses_membership_saying_why(capsys):
    with pytest.raises(ValueError, match=r"nemesis membership not supported with --target docker: its nodes "
                                         r"advertise their published host ports"):
        check_target(["kill", "membership"], "docker")
    assert chaos_main.main(["--target", "docker", "--nemesis", "membership"]) == 2
    assert "membership changes need the local target" in capsys.readouterr().err
    assert "membership" in chaos_main.parser().format_help()


def test_a_target_that_cannot_re_add_a_node_as_itself_refuses_membership():
    target = SimpleNamespace(target="local", nodes=[0, 1, 2], link_faults=lambda: object(), node_isolation=lambda: None)
    with pytest.raises(ValueError, match="nemesis membership not supported with --target local: the target cannot "
                                         "re-add a removed node"):
        Nemesis(target, history=None, seed=1, kinds=["kill", "membership"])


# ------------------------------------------------------------------ removal
def test_a_follower_is_removed_through_the_leader_and_recorded(monkeypatch):
    cluster, nemesis, history, _ = make(leader=1)
    rig(monkeypatch, "membership-follower", "kept", pick=0.5)
    start(nemesis)
    (fault_id, fault), = nemesis.active
    assert fault.f == "membership-follower" and fault.nodes == [3] and fault.stop_last  # followers 0,2,3,4: the 3rd
    assert "node-3" not in cluster.members
    assert ("node-1", "DELETE", "/v1/cluster/members/node-3") in cluster.requests
    (line,) = history.lines
    value = line["value"]
    assert (line["f"], value["phase"], value["nodes"], value["id"]) == ("membership-follower", "start", ["node-3"], fault_id)
    assert value["node"] == "node-3" and value["leader"] == "node-1" and value["was_leader"] is False
    assert value["readd"] == "kept"
    remove = value["remove"]
    assert remove["result"] == "removed" and remove["via"] == "node-1" and not remove["handed_over"]
    assert remove["attempts"] == [{"to": "node-1", "answer": "ok", "at_s": 0.0}]
    assert nemesis.windows == [{"id": fault_id, "f": "membership-follower", "nodes": ["node-3"], "start_s": 1000.0}]


def test_removing_the_leader_follows_its_hand_over_to_the_new_leader(monkeypatch):
    cluster, nemesis, history, _ = make(leader=2)
    rig(monkeypatch, "membership-leader", "wiped")
    start(nemesis)
    (_, fault), = nemesis.active
    assert fault.f == "membership-leader" and fault.nodes == [2]
    assert cluster.leader_index == 0 and "node-2" not in cluster.members
    deletes = [r for r in cluster.requests if r[1] == "DELETE"]
    assert deletes == [("node-2", "DELETE", "/v1/cluster/members/node-2"), ("node-0", "DELETE", "/v1/cluster/members/node-2")]
    value = history.lines[0]["value"]
    assert value["was_leader"] and value["remove"]["handed_over"] and value["remove"]["via"] == "node-0"
    assert [a["answer"] for a in value["remove"]["attempts"]] == ["not_leader", "ok"]
    assert value["readd"] == "wiped"


@pytest.mark.parametrize("code", ["membership_conflict", "no_leader", "not_ready", "unavailable", "transport",
                                  "commit_outcome_unknown"])
def test_a_removal_retries_transient_answers(code):
    cluster, nemesis, _, clock = make()
    cluster.script["DELETE"] = [code, code]
    changer = nemesis.faults.membership
    assert changer is not None
    outcome = changer.remove(3, clock() + REMOVE_TIMEOUT_S)
    assert outcome["removed"] and outcome["result"] == "removed"
    assert outcome["answers"] == {code: 2, "ok": 1} and outcome["attempts_count"] == 3
    assert clock.slept and "node-3" not in cluster.members


@pytest.mark.parametrize("code", ["commit_outcome_unknown", "transport"])
def test_a_removal_of_unknown_outcome_that_happened_is_confirmed_by_member_not_found(code):
    cluster, nemesis, _, clock = make()
    cluster.script["DELETE"] = [f"{code}+done"] if code != "transport" else []
    changer = nemesis.faults.membership
    assert changer is not None
    if code == "transport":  # the removal is made, its answer lost
        real = cluster.admin_request

        def lossy(i, path, method="GET", body=None, timeout_s=1.0):
            answer = real(i, path, method, body, timeout_s)
            if method == "DELETE" and "removed" in answer:
                raise TimeoutError("the answer was lost")
            return answer

        cluster.admin_request = lossy
    outcome = changer.remove(3, clock() + REMOVE_TIMEOUT_S)
    assert outcome["removed"] and outcome["confirmed"].startswith("absent")
    assert [a["answer"] for a in outcome["attempts"]] == [code, "member_not_found"]


def unanswered(cluster: FakeCluster, method: str) -> None:
    """``method`` requests never answered from now on; the first one is made all the same."""
    real = cluster.admin_request
    made: list[bool] = []

    def silent(i, path, method_="GET", body=None, timeout_s=1.0):
        if method_ != method:
            return real(i, path, method_, body, timeout_s)
        if not made:
            made.append(True)
            real(i, path, method_, body, timeout_s)
        raise TimeoutError("no answer")

    cluster.admin_request = silent


def test_at_the_deadline_a_removal_of_unknown_outcome_is_looked_up_in_the_leaders_view():
    cluster, nemesis, _, clock = make()
    unanswered(cluster, "DELETE")
    changer = nemesis.faults.membership
    assert changer is not None
    outcome = changer.remove(3, clock() + REMOVE_TIMEOUT_S)
    assert outcome["removed"] and outcome["result"] == "removed" and "leader's view" in outcome["confirmed"]
    assert set(outcome["answers"]) == {"transport"} and clock.now >= 1000.0 + REMOVE_TIMEOUT_S


def test_at_the_deadline_a_re_add_of_unknown_outcome_is_looked_up_in_the_leaders_view():
    cluster, nemesis, _, clock = make()
    cluster.members.remove("node-2")
    unanswered(cluster, "POST")
    changer = nemesis.faults.membership
    assert changer is not None
    outcome = changer.readd(2, clock() + READD_TIMEOUT_S)
    assert outcome["added"] and outcome["result"] == "already_member" and "leader's view" in outcome["confirmed"]
    assert outcome["catch_up_index"] == 42  # the leader found anew for the catch-up


def test_a_removal_with_no_answer_ever_gives_up():
    cluster, nemesis, _, clock = make()
    cluster.script["DELETE"] = ["transport"] * 10_000
    changer = nemesis.faults.membership
    assert changer is not None
    outcome = changer.remove(3, clock() + REMOVE_TIMEOUT_S)
    assert not outcome["removed"] and outcome["result"] == "gave_up" and "node-3" in cluster.members


def test_a_refused_removal_is_an_outcome_not_a_fault(monkeypatch):
    cluster, nemesis, history, _ = make()
    progress: list[str] = []
    nemesis.progress = progress.append
    cluster.script["DELETE"] = ["would_lose_quorum"]
    rig(monkeypatch, "membership-follower", "kept")
    start(nemesis)
    assert nemesis.active == [] and nemesis.windows == []
    (line,) = history.lines
    value = line["value"]
    assert (line["f"], value["phase"], value["nodes"]) == ("membership-follower", "refused", ["node-1"])
    assert value["result"] == "refused" and value["reason"] == "would_lose_quorum"
    assert cluster.members == [f"node-{i}" for i in range(5)]
    assert progress == ["nemesis: membership-follower refused: would_lose_quorum"]


def test_no_leader_within_the_deadline_is_a_refusal(monkeypatch):
    _, nemesis, history, clock = make(leader=None)
    rig(monkeypatch, "membership-leader", "kept")
    start(nemesis)
    value = history.lines[0]["value"]
    assert value["phase"] == "refused" and value["reason"] == "no_leader"
    assert clock.now >= 1000.0 + REMOVE_TIMEOUT_S and nemesis.active == []


def test_a_node_still_out_is_not_followed_by_another_removal(monkeypatch):
    cluster, nemesis, history, _ = make()
    cluster.members.remove("node-4")
    rig(monkeypatch, "membership-follower", "kept")
    start(nemesis)
    value = history.lines[0]["value"]
    assert value["phase"] == "refused" and value["reason"] == "not_all_members" and value["nodes"] == ["node-4"]
    assert not [r for r in cluster.requests if r[1] == "DELETE"]


# ------------------------------------------------------------------ re-add
@pytest.mark.parametrize("data, events", [("kept", []), ("wiped", [("kill", 3), ("wipe", 3), ("start", 3)])])
def test_the_stop_re_adds_the_node_kept_or_wiped(monkeypatch, data, events):
    cluster, nemesis, history, _ = make()
    rig(monkeypatch, "membership-follower", data, pick=0.5)
    start(nemesis)
    asyncio.run(nemesis.stop_all())
    assert cluster.events == events
    assert cluster.members[-1] == "node-3" and len(cluster.members) == 5
    assert ("node-0", "POST", "/v1/cluster/members") in cluster.requests
    stop = history.lines[-1]["value"]
    assert history.phases() == [("membership-follower", "start"), ("membership-follower", "stop")]
    assert stop["readd"] == data and stop["added"] and stop["catch_up_s"] == 0.0 and "error" not in stop
    assert stop["add"]["result"] == "added" and stop["add"]["caught_up"] is True and stop["add"]["catch_up_index"] == 42
    assert stop["add"]["snapshots_received"] == 1
    assert "asked_at" not in stop["add"] and "leader" not in stop["add"]
    assert nemesis.windows[0]["stop_s"] == 1000.0


def test_a_killed_node_is_restarted_before_it_is_re_added(monkeypatch):
    cluster, nemesis, history, _ = make()
    rig(monkeypatch, "membership-follower", "kept", pick=0.0)
    start(nemesis)
    cluster.nodes[1].up = False  # killed by another fault, whose restart failed
    asyncio.run(nemesis.stop_all())
    assert cluster.events == [("start", 1)] and history.lines[-1]["value"]["restarted"]


@pytest.mark.parametrize("code", ["membership_conflict", "no_leader", "not_ready", "node_unreachable",
                                  "would_lose_quorum", "unavailable", "transport"])
def test_a_re_add_retries_while_the_other_faults_heal(code):
    cluster, nemesis, _, clock = make()
    cluster.members.remove("node-2")
    cluster.script["POST"] = [code] * 3
    changer = nemesis.faults.membership
    assert changer is not None
    outcome = changer.readd(2, clock() + READD_TIMEOUT_S)
    assert outcome["added"] and outcome["result"] == "added" and outcome["answers"] == {code: 3, "ok": 1}
    assert "node-2" in cluster.members


def test_a_re_add_follows_not_leader_to_the_leader():
    cluster, nemesis, _, clock = make(leader=3)
    cluster.members.remove("node-2")
    changer = nemesis.faults.membership
    assert changer is not None
    changer.cluster.leader = lambda: 0  # a stale view: node-0 answers not_leader, naming node-3
    outcome = changer.add(2, clock() + READD_TIMEOUT_S)
    assert outcome["added"] and [(a["to"], a["answer"]) for a in outcome["attempts"]] == [
        ("node-0", "not_leader"), ("node-3", "ok")]


@pytest.mark.parametrize("code", ["commit_outcome_unknown", "transport"])
def test_a_re_add_of_unknown_outcome_that_happened_is_confirmed_by_member_exists(code):
    cluster, nemesis, _, clock = make()
    cluster.members.remove("node-2")
    changer = nemesis.faults.membership
    assert changer is not None
    real = cluster.admin_request
    answers_lost = [1]  # the first addition is made, its answer lost

    def lossy(i, path, method="GET", body=None, timeout_s=1.0):
        answer = real(i, path, method, body, timeout_s)
        if method == "POST" and answers_lost:
            answers_lost.pop()
            if code == "transport":
                raise TimeoutError("the answer was lost")
            return cluster._error(code)
        return answer

    cluster.admin_request = lossy
    outcome = changer.add(2, clock() + READD_TIMEOUT_S)
    assert outcome["added"] and outcome["result"] == "already_member" and outcome["after_unknown_outcome"]
    assert [a["answer"] for a in outcome["attempts"]] == [code, "member_exists"]


def test_a_re_add_that_never_gets_through_gives_up_and_the_stop_says_so(monkeypatch):
    cluster, nemesis, history, clock = make()
    rig(monkeypatch, "membership-follower", "kept")
    start(nemesis)
    cluster.script["POST"] = ["would_lose_quorum"] * 10_000
    asyncio.run(nemesis.stop_all())
    stop = history.lines[-1]["value"]
    assert stop["added"] is False and stop["add"]["result"] == "gave_up"
    assert "not re-added: gave_up" in stop["error"]
    assert clock.now >= 1000.0 + READD_TIMEOUT_S and "node-1" not in cluster.members
    # the final heal brings it back
    cluster.script["POST"] = []
    asyncio.run(nemesis.heal())
    assert cluster.healed == 1 and "node-1" in cluster.members
    heal = history.lines[-1]
    assert heal["f"] == "membership-heal" and heal["value"]["phase"] == "readd" and heal["value"]["nodes"] == ["node-1"]
    assert heal["value"]["readd"] == "heal" and heal["value"]["added"] and heal["value"]["result"] == "added"


def test_a_wrong_identity_in_member_exists_is_an_error_not_a_success():
    cluster, nemesis, _, clock = make()
    cluster.members.remove("node-2")
    cluster.admin_request = lambda i, path, method="GET", body=None, timeout_s=1.0: cluster._error(
        "member_exists", node_id="node-9", raft_address="10.0.0.9:1")
    changer = nemesis.faults.membership
    assert changer is not None
    outcome = changer.add(2, clock() + READD_TIMEOUT_S)
    assert not outcome["added"] and outcome["result"] == "error" and outcome["reason"] == "member_exists"


def test_membership_stops_after_every_other_fault():
    _, nemesis, _, _ = make(kinds=["membership", "kill"])
    order: list[str] = []
    nemesis.active = [(0, Fault("membership-leader", [0], lambda: order.append("membership"), stop_last=True)),
                      (1, Fault("kill-follower", [1], lambda: order.append("kill"))),
                      (2, Fault("pause-follower", [2], lambda: order.append("pause")))]
    asyncio.run(nemesis.stop_all())
    assert order == ["pause", "kill", "membership"]


def test_the_final_heal_re_adds_every_node_left_out_and_nothing_else():
    cluster, nemesis, history, _ = make()
    cluster.members = ["node-0", "node-1", "node-3"]
    asyncio.run(nemesis.heal())
    assert sorted(cluster.members) == [f"node-{i}" for i in range(5)]
    assert [(line["f"], line["value"]["phase"], line["value"]["nodes"]) for line in history.lines] == [
        ("membership-heal", "readd", ["node-2"]), ("membership-heal", "readd", ["node-4"])]
    cluster.requests.clear()
    asyncio.run(nemesis.heal())
    assert not [r for r in cluster.requests if r[1] == "POST"] and len(history.lines) == 2


def test_the_final_view_is_the_leaders_and_each_nodes_own():
    cluster = FakeCluster(3, leader=1)
    cluster.members = ["node-0", "node-1"]
    view = final_view(cluster, cluster)
    assert view == {"nodes": ["node-0", "node-1", "node-2"], "leader": "node-1", "members": ["node-0", "node-1"],
                    "own_view": {"node-0": True, "node-1": True, "node-2": False}}
    cluster.leader_index = None
    clock = Clock()
    view = final_view(cluster, cluster, timeout_s=3.0, changer=MembershipChanger(cluster, cluster, clock=clock,
                                                                               sleep=clock.sleep))
    assert "no serving leader" in view["error"]


def test_fault_refused_names_its_reason():
    assert str(FaultRefused("membership-leader", [0], {"reason": "would_lose_quorum"})) == (
        "membership-leader refused: would_lose_quorum")


# ------------------------------------------------------------------ the checker
def nemesis_line(f: str, value: dict[str, Any], time_s: float) -> dict[str, Any]:
    return {"process": "nemesis", "type": "info", "f": f, "value": value, "time_s": time_s}


def checker_input(f: str, value: Any, time_s: float = 50.0) -> dict[str, Any]:
    return {"process": "checker-input", "type": "info", "f": f, "value": value, "time_s": time_s}


NODES = ["node-0", "node-1", "node-2"]


def membership_history(members: list[str] | None = None, digests: dict[str, Any] | None = None,
                       error: str | None = None) -> list[dict[str, Any]]:
    final: dict[str, Any] = {"nodes": NODES, "leader": "node-0", "members": members or list(NODES),
                             "own_view": dict.fromkeys(NODES, True)}
    if error:
        final = {"nodes": NODES, "own_view": {}, "error": error}
    return [
        nemesis_line("membership-leader", {"phase": "start", "nodes": ["node-1"], "id": 0, "node": "node-1",
                                           "was_leader": True, "readd": "wiped",
                                           "remove": {"result": "removed", "handed_over": True}}, 1.0),
        nemesis_line("membership-leader", {"phase": "stop", "nodes": ["node-1"], "id": 0, "readd": "wiped",
                                           "added": True, "catch_up_s": 2.5,
                                           "add": {"node": "node-1", "result": "added", "catch_up_s": 2.5,
                                                   "snapshots_received": 1}}, 5.0),
        nemesis_line("membership-follower", {"phase": "refused", "nodes": ["node-2"], "result": "refused",
                                             "reason": "would_lose_quorum"}, 6.0),
        nemesis_line("membership-follower", {"phase": "start", "nodes": ["node-2"], "id": 1, "node": "node-2",
                                             "was_leader": False, "readd": "kept",
                                             "remove": {"result": "removed", "handed_over": False}}, 7.0),
        nemesis_line("membership-follower", {"phase": "stop", "nodes": ["node-2"], "id": 1, "readd": "kept",
                                             "added": False, "catch_up_s": None, "error": "RuntimeError('gave up')",
                                             "add": {"node": "node-2", "result": "gave_up",
                                                     "answers": {"would_lose_quorum": 30}}}, 70.0),
        nemesis_line("membership-heal", {"phase": "readd", "nodes": ["node-2"], "readd": "heal", "node": "node-2",
                                         "result": "added", "added": True, "catch_up_s": 0.4}, 80.0),
        checker_input("digests", digests or dict.fromkeys(NODES, "abc@120"), 90.0),
        checker_input("members", final, 91.0),
    ]


def test_the_checker_counts_what_the_nemesis_did_and_passes_a_whole_converged_end():
    result = check_membership(membership_history())
    assert result["valid"] and result["checked"]
    assert (result["removals_count"], result["removals_of_leader_count"], result["handed_over_count"]) == (2, 1, 1)
    assert result["refused_by_reason"] == {"would_lose_quorum": 1} and result["failed_removals_count"] == 0
    assert result["readds"] == {"kept": 0, "wiped": 1, "heal": 1} and result["readd_failures_count"] == 1
    assert result["readds_from_snapshot"] == {"kept": 0, "wiped": 1, "heal": 0}
    assert result["readd_failures"][0]["result"] == "gave_up"
    assert result["catch_up_s"]["wiped"] == {"count": 1, "median": 2.5, "max": 2.5}
    assert result["final"]["digests_equal"] and result["final"]["missing"] == []
    text = summary_text(check(membership_history()), seed=68000)
    assert ("ok      membership: 2 removals (1 of the leader, 1 handed over), 1 refused (would_lose_quorum 1), "
            "0 failed; re-added 0 with data kept, 1 wiped (1 from a snapshot), 1 at the final heal, 1 re-adds failed"
            ) in text
    assert "at the end 3/3 voting members in node-0's view, digests equal" in text


def test_a_node_left_out_of_the_membership_is_invalid():
    history = membership_history(members=["node-0", "node-1"])
    result = check_membership(history)
    assert not result["valid"] and result["final"]["missing"] == ["node-2"]
    results = check(history)
    assert "membership" in results["invalid_checkers"] and not results["valid"]
    assert "not voting members in node-0's view: node-2" in summary_text(results, seed=1)


def test_different_digests_at_the_end_are_invalid():
    result = check_membership(membership_history(digests={"node-0": "abc@120", "node-1": "abc@120",
                                                          "node-2": "def@118"}))
    assert not result["valid"] and not result["final"]["digests_equal"]
    assert result["final"]["problems"] == ["2 distinct states among the nodes"]
    result = check_membership(membership_history(digests={"node-0": "abc@120", "node-1": "abc@120", "node-2": None}))
    assert not result["valid"] and result["final"]["problems"] == ["no digest from node-2"]


def test_no_leader_to_read_the_members_from_is_invalid():
    result = check_membership(membership_history(error="no serving leader answered"))
    assert not result["valid"] and result["final"]["missing"] == NODES


def test_without_a_member_list_it_is_valid_only_if_the_nemesis_did_nothing():
    acted = [line for line in membership_history() if line["f"] != "members"]
    result = check_membership(acted)
    assert not result["valid"] and not result["checked"]
    result = check_membership([checker_input("digests", dict.fromkeys(NODES, "abc@1"))])
    assert result["valid"] and not result["checked"]
    assert "membership: not checked" in summary_text(check([]), seed=1)


def test_a_run_without_membership_changes_still_checks_that_every_node_votes():
    history = [checker_input("digests", dict.fromkeys(NODES, "abc@1")),
               checker_input("members", {"nodes": NODES, "leader": "node-2", "members": NODES, "own_view": {}})]
    result = check_membership(history)
    assert result["valid"] and result["checked"] and result["removals_count"] == 0
