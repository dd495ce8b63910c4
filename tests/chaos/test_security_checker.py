"""The security checker on hand-written histories, and the intruder's parts on fakes.

The histories tell the intruder's story with the builder of test_checker: a worker's transaction
open while the intruder tries to commit it, refusals, answers that must not come. The intruder's
own code (its generator, how it judges an answer, the registry of open transactions) runs
against fake clients: no cluster here (tests/chaos/test_run.py runs the real thing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

import chaos.intruder as intruder_module
from chaos.checkers import check, check_security
from chaos.checkers.model import build_model
from chaos.checkers.report import summary_text
from chaos.executor import Executor, OpenTransactions
from chaos.generator import Generator, Spec
from chaos.history import HistoryWriter, read_history
from chaos.intruder import (
    GUEST_QUEUE,
    Intruder,
    IntruderGenerator,
)
from chaos.runner import INTRUDER_PROCESS, Progress, _intruder_token
from chaos.target import token_issuer
from rcq.errors import (
    CommitOutcomeUnknown,
    Forbidden,
    NoLeader,
    TooManyTransactions,
    TransactionAborted,
    TransactionNotFound,
)
from tests.helpers import FLOOD_PAUSE_WAIT_S
from tests.helpers.history import History
from tests.helpers.nodes import running_node, url_of

INTRUDER = INTRUDER_PROCESS
VICTIM_TX = "5.aaaaaaaaaaaaaaaaaaaaaaaa"  # term 5


class SecurityHistory(History):
    def intruder(self, **value: Any) -> SecurityHistory:
        self.checker_input("intruder", value or {"principal": "intruder", "process": INTRUDER})
        return self

    def attempt(self, f: str, type: str, error: str | None = None, **value: Any) -> SecurityHistory:
        self._line(INTRUDER, "invoke", f, value)
        self._line(INTRUDER, type, f, value, error)
        return self

    def begin_victim(self, transaction_id: str = VICTIM_TX) -> SecurityHistory:
        self._line(3, "invoke", "dequeue", {"queue": "q1", "max": 1})
        return self

    def end_victim(self, transaction_id: str = VICTIM_TX, *values: str) -> SecurityHistory:
        self._line(3, "ok", "dequeue", {"queue": "q1", "values": list(values), "transaction_id": transaction_id})
        return self

    def hijack(self, verb: str, type: str, error: str | None = None, transaction_id: str = VICTIM_TX,
               **value: Any) -> SecurityHistory:
        return self.attempt("intrude-hijack", type, error, verb=verb, transaction_id=transaction_id, victim=3,
                            victim_f="dequeue", step=verb, **value)


def security(h: History) -> dict[str, Any]:
    return check_security(build_model(h.lines), h.lines)


def refused_everywhere() -> SecurityHistory:
    """Every kind of intrusion refused as it must be, one hijack on an open transaction, guest work ok."""
    h = SecurityHistory().intruder()
    h.enqueue(0, "ok", "q1", "0-1")
    h.attempt("intrude-enqueue", "fail", "forbidden", queue="q1", via="request", values=["intruder-1"], step="enqueue")
    h.attempt("intrude-dequeue", "fail", "forbidden", queue="q1", via="transaction", max=2, step="dequeue")
    h.attempt("intrude-manage", "fail", "forbidden", queue="q0", verb="purge", step="purge")
    h.attempt("intrude-unread", "fail", "not_read", frames_max=1000, flood_s=1.0, step="flood", taken=500)
    h.begin_victim()
    h.hijack("commit", "fail", "transaction_not_found")
    h.end_victim(VICTIM_TX, "0-1")
    h.attempt("guest-enqueue", "ok", queue=GUEST_QUEUE, values=["intruder-2"], step="enqueue")
    h.attempt("guest-dequeue", "ok", queue=GUEST_QUEUE, max=1, values=["intruder-2"], step="commit")
    h.drain("q1")
    return h


def test_every_intrusion_refused_as_documented_is_valid() -> None:
    result = security(refused_everywhere())
    assert result["valid"] and result["checked"]
    assert (result["attempts_count"], result["refused_count"], result["allowed_count"], result["unexpected_count"]) == (
        5, 5, 0, 0)
    assert {f: kind["refused"] for f, kind in result["by_kind"].items()} == {
        "intrude-enqueue": 1, "intrude-dequeue": 1, "intrude-manage": 1, "intrude-hijack": 1, "intrude-unread": 1}
    assert (result["hijacks_count"], result["hijacks_on_open_count"], result["hijacks_open_throughout_count"]) == (1, 1, 1)
    assert result["hijack_verbs"] == {"commit": 1}
    assert result["guest"] == {"ok": 2, "fail": 0, "info": 0, "refused": 0}
    assert result["notes"] == []


def test_the_whole_check_stays_valid_and_the_summary_counts_the_refusals() -> None:
    results = check(refused_everywhere().lines)
    assert results["valid"], results["invalid_checkers"]
    assert "security" in results and results["total_queue"]["valid"]
    text = summary_text(results, seed=1)
    assert "ok      security: 5 intrusion attempts by 'intruder': 5 refused as expected" in text
    assert "1/1 hijacks on an open transaction" in text and "intrude-hijack: 1 attempts (refused 1)" in text


def test_the_intruders_ops_are_not_counted_in_the_workloads_availability() -> None:
    liveness = check(refused_everywhere().lines)["liveness"]
    assert liveness["overall"]["ops"] == 2  # the worker's enqueue and dequeue (the drain is left out, as ever)
    assert liveness["overall"]["ops"] == liveness["overall"]["ok"]


@pytest.mark.parametrize("f, value", [
    ("intrude-enqueue", {"queue": "q1", "via": "request", "values": ["intruder-1"], "step": "enqueue"}),
    ("intrude-dequeue", {"queue": "q1", "via": "request", "max": 1, "values": ["0-1"], "step": "dequeue"}),
    ("intrude-manage", {"queue": "q0", "verb": "configure", "step": "configure"}),
    ("intrude-unread", {"frames_max": 1000, "flood_s": 1.0, "step": "flood", "taken": 1000}),
])
def test_an_allowed_intrusion_on_a_workload_queue_is_invalid(f: str, value: dict[str, Any]) -> None:
    h = SecurityHistory().intruder().attempt(f, "ok", None, **value)
    result = security(h)
    assert not result["valid"]
    assert result["allowed_count"] == 1 and result["by_kind"][f]["allowed"] == 1
    assert result["allowed"][0]["f"] == f
    assert "INVALID security" in summary_text(check(h.lines), seed=1)


def test_an_intruder_value_that_got_into_a_workload_queue_is_unexpected_to_total_queue_too() -> None:
    h = SecurityHistory().intruder()
    h.attempt("intrude-enqueue", "ok", None, queue="q1", via="transaction", values=["intruder-1"], step="commit")
    h.drain("q1", "intruder-1")
    results = check(h.lines)
    assert results["invalid_checkers"] == ["total_queue", "security"]
    assert results["total_queue"]["unexpected"] == ["intruder-1"]


def test_a_value_an_allowed_intrusion_took_is_lost_to_total_queue_too() -> None:
    h = SecurityHistory().intruder().enqueue(0, "ok", "q1", "0-1")
    h.attempt("intrude-dequeue", "ok", None, queue="q1", via="request", max=1, values=["0-1"], step="dequeue")
    h.drain("q1")
    results = check(h.lines)
    assert results["total_queue"]["lost"] == ["0-1"] and not results["security"]["valid"]


@pytest.mark.parametrize("verb, extra", [("commit", {"duplicate": False}), ("abort", {"returned": 1}),
                                         ("extend", {}), ("enqueue", {"queue": GUEST_QUEUE, "values": ["intruder-3"]})])
def test_a_hijack_that_got_through_is_invalid(verb: str, extra: dict[str, Any]) -> None:
    h = SecurityHistory().intruder().begin_victim().hijack(verb, "ok", **extra).end_victim()
    result = security(h)
    assert not result["valid"] and result["by_kind"]["intrude-hijack"]["allowed"] == 1
    assert result["allowed"][0]["transaction_id"] == VICTIM_TX and result["allowed"][0]["verb"] == verb


@pytest.mark.parametrize("f, error", [
    ("intrude-enqueue", "transaction_not_found"),  # a refusal, but not the one the permission check gives
    ("intrude-manage", "internal_error"),
    ("intrude-dequeue", "unauthorized"),  # the intruder's token was not accepted: nothing was tested
])
def test_a_queue_intrusion_answered_with_another_code_is_invalid(f: str, error: str) -> None:
    h = SecurityHistory().intruder().attempt(f, "fail", error, queue="q2", via="request", step="x")
    result = security(h)
    assert not result["valid"]
    assert result["unexpected_count"] == 1 and result["unexpected"][0]["error"] == error


def test_a_hijack_refused_forbidden_is_invalid_since_it_may_use_the_guest_queue() -> None:
    h = SecurityHistory().intruder().begin_victim()
    h.hijack("enqueue", "fail", "forbidden", queue=GUEST_QUEUE, values=["intruder-1"]).end_victim()
    result = security(h)
    assert not result["valid"] and result["by_kind"]["intrude-hijack"]["unexpected"] == 1


def test_no_answer_is_acceptable_while_faults_run() -> None:
    h = SecurityHistory().intruder()
    h.attempt("intrude-enqueue", "info", "unavailable", queue="q1", via="request", values=["intruder-1"], step="enqueue")
    h.attempt("intrude-dequeue", "info", "TimeoutError", queue="q1", via="transaction", max=1, step="dequeue")
    h.attempt("intrude-manage", "fail", "no_leader", queue="q1", verb="delete", step="delete")
    h.hijack("commit", "info", "commit_outcome_unknown")
    h.attempt("intrude-enqueue", "fail", "too_many_transactions", queue="q1", via="transaction",
              values=["intruder-2"], step="begin")  # never sent: its own transaction could not begin
    h.invoke(INTRUDER, "intrude-manage", {"queue": "q0", "verb": "purge"})  # the run ended before it did
    result = security(h)
    assert result["valid"]
    assert (result["info_count"], result["not_sent_count"], result["refused_count"]) == (5, 1, 0)
    # the hijack's victim never ran in this history: it targeted no transaction known to be open
    assert result["hijacks_on_open_count"] == 0
    assert result["notes"] == ["no hijack targeted a transaction then open: ownership was not tested",
                               "no guest op succeeded: the intruder's token never showed it works"]


def test_a_hijack_after_the_victims_op_ended_does_not_count_as_on_an_open_transaction() -> None:
    h = SecurityHistory().intruder().begin_victim().end_victim().hijack("abort", "fail", "transaction_not_found")
    result = security(h)
    assert result["valid"] and result["refused_count"] == 1 and result["hijacks_on_open_count"] == 0
    assert "ownership was not tested" in result["notes"][0]


def test_leader_changed_answers_a_hijack_without_telling_anything() -> None:
    h = SecurityHistory().intruder().begin_victim().hijack("extend", "fail", "leader_changed").end_victim()
    result = security(h)
    assert result["valid"] and result["not_held_count"] == 1 and result["not_held"][0]["verb"] == "extend"


@pytest.mark.parametrize("later_term_at_s, valid", [(0.1, True), (None, False), (30.0, False)])
def test_an_outcome_answered_to_a_hijack_needs_a_later_leader_to_explain_it(later_term_at_s: float | None,
                                                                             valid: bool) -> None:
    """transaction_committed from the leader that began the transaction would leak its outcome;
    from a later leader (owners are not replicated) it is the documented answer."""
    h = SecurityHistory().intruder().begin_victim().end_victim()
    h.hijack("abort", "fail", "transaction_committed")
    h.hijack("commit", "ok", duplicate=True)
    samples = [{"time_s": 0.0, "node": "node-0", "term": 5}]
    if later_term_at_s is not None:
        samples.append({"time_s": later_term_at_s, "node": "node-1", "term": 6})
    h.checker_input("leaders", samples)
    result = security(h)
    assert result["valid"] is valid
    if valid:
        assert result["not_held_count"] == 2 and result["allowed_count"] == result["unexpected_count"] == 0
    else:
        assert (result["allowed_count"], result["unexpected_count"]) == (1, 1)


@pytest.mark.parametrize("later_term_at_s, valid", [(0.25, True), (None, False), (30.0, False)])
def test_an_unread_flood_taken_to_its_end_is_explained_only_by_a_leader_change_during_it(
        later_term_at_s: float | None, valid: bool) -> None:
    """A node that stops serving closes the channel, and aiohttp reads and drops what comes while
    it waits for the client's close frame: the flood is taken to its end, and nothing is kept."""
    h = SecurityHistory().intruder()
    h.attempt("intrude-unread", "ok", frames_max=1000, flood_s=1.0, step="flood", taken=1000)  # 0.2 to 0.3 s
    samples = [{"time_s": 0.0, "node": "node-0", "term": 5}]
    if later_term_at_s is not None:
        samples.append({"time_s": later_term_at_s, "node": "node-0", "term": 6})
    h.checker_input("leaders", samples)
    result = security(h)
    assert result["valid"] is valid, result
    assert (result["not_held_count"], result["allowed_count"]) == ((1, 0) if valid else (0, 1))


def test_a_guest_op_refused_by_its_own_grant_is_invalid() -> None:
    h = SecurityHistory().intruder()
    h.attempt("guest-enqueue", "fail", "forbidden", queue=GUEST_QUEUE, values=["intruder-1"], step="enqueue")
    result = security(h)
    assert not result["valid"] and result["guest"]["refused"] == 1
    assert result["unexpected"][0]["f"] == "guest-enqueue"


def test_a_history_without_the_intruder_is_not_checked_and_a_skipped_one_says_why() -> None:
    plain = History().enqueue(0, "ok", "q1", "0-1").drain("q1", "0-1")
    assert security(plain) == {"valid": True, "checked": False, "skipped": "no intruder in this history"}
    skipped = SecurityHistory().intruder(skipped="the docker target's nodes accept only its admin token")
    results = check(skipped.lines)
    assert results["valid"] and not results["security"]["checked"]
    assert "security: not checked (the docker target's nodes accept only its admin token)" in summary_text(results, 1)


# ------------------------------------------------------------------ the intruder's side, on fakes
def test_the_intruders_attempts_are_a_function_of_the_seed_and_its_values_are_its_own() -> None:
    queues = ["q0", "q1", "q2"]
    a, b = IntruderGenerator(7, INTRUDER, queues), IntruderGenerator(7, INTRUDER, queues)
    specs = [a.next() for _ in range(300)]
    assert specs == [b.next() for _ in range(300)]
    assert specs != [IntruderGenerator(8, INTRUDER, queues).next() for _ in range(300)]
    assert {spec.f for spec in specs} == {"intrude-enqueue", "intrude-dequeue", "intrude-manage", "intrude-hijack",
                                          "guest-enqueue", "guest-dequeue", "intrude-unread"}
    values = [v for spec in specs for v in spec.value.get("values", [])]
    assert values and all(v.startswith("intruder-") for v in values) and len(set(values)) == len(values)
    assert {spec.value["queue"] for spec in specs if spec.f.startswith("intrude-") and "queue" in spec.value} == {
        *queues, GUEST_QUEUE}  # hijacks enqueue and dequeue in the guest queue, the rest hit the workload's
    assert all(spec.value["queue"] == GUEST_QUEUE for spec in specs if spec.f == "intrude-hijack" and "queue" in spec.value)
    workers = {v for spec in [Generator(7, w, queues).next() for w in range(6) for _ in range(50)]
               for write in spec.value.get("writes", []) for v in write["values"]}
    assert workers and workers.isdisjoint(values)
    assert a.target([]) is None and a.target([("1.ab", 3, "move")]) == ("1.ab", 3, "move")


class FakeTransaction:
    def __init__(self, transaction_id: str, seen: list[list[str]], registry: OpenTransactions) -> None:
        self.transaction_id = transaction_id
        self._seen, self._registry = seen, registry

    async def enqueue_batch(self, queue: str, values: list[Any]) -> int:
        self._seen.append([tid for tid, _, _ in self._registry.snapshot()])
        return len(values)

    async def commit(self) -> None:
        return None

    async def abort(self) -> int:
        return 0


class FakeClient:
    """begin and the queue verbs; each verb answers or raises what ``answers`` says."""

    def __init__(self, registry: OpenTransactions | None = None, **answers: Any) -> None:
        self.registry = registry if registry is not None else OpenTransactions()
        self.answers = answers
        self.seen: list[list[str]] = []
        self.begun = 0

    async def _answer(self, verb: str) -> Any:
        answer = self.answers.get(verb)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def begin(self, timeout_s: float, label: str) -> Any:
        await self._answer("begin")
        self.begun += 1
        return FakeTransaction(f"1.{self.begun:024x}", self.seen, self.registry)

    async def enqueue(self, queue: str, *values: Any) -> Any:
        return await self._answer("enqueue")

    async def purge_queue(self, queue: str) -> int:
        return await self._answer("purge") or 0

    def attach(self, transaction_id: str, label: str) -> Any:
        return AttachedTransaction(transaction_id, self.answers.get("abort"))


class AttachedTransaction:
    """A handle on someone else's transaction whose transport answers every request with ``answer``."""

    def __init__(self, transaction_id: str, answer: Any) -> None:
        self.transaction_id = transaction_id
        self._transport = self
        self._answer = answer

    def _request(self, verb: str, body: Any) -> tuple[str, str]:
        return verb, self.transaction_id

    async def request(self, request: tuple[str, str]) -> Any:
        if isinstance(self._answer, BaseException):
            raise self._answer
        return self._answer


def test_a_worker_lists_its_transaction_while_its_op_runs_and_no_longer() -> None:
    registry = OpenTransactions()
    client = FakeClient(registry)
    executor = Executor(client, registry, process=4)
    spec = Spec("enqueue", {"writes": [{"queue": "q1", "values": ["4-1"]}]})
    type_, value, _ = asyncio.run(executor.run(spec))
    assert type_ == "ok" and client.seen == [[value["transaction_id"]]]
    assert len(registry) == 0
    failing = Executor(FakeClient(registry, begin=NoLeader()), registry, process=4)
    assert asyncio.run(failing.run(spec))[0] == "fail" and len(registry) == 0


@pytest.mark.parametrize("answers, expected", [
    ({"enqueue": Forbidden()}, ("fail", "forbidden", "enqueue")),
    ({"enqueue": TransactionNotFound()}, ("fail", "transaction_not_found", "enqueue")),
    ({"enqueue": NoLeader()}, ("info", "no_leader", "enqueue")),
    ({"enqueue": CommitOutcomeUnknown()}, ("info", "commit_outcome_unknown", "enqueue")),
    ({"enqueue": OSError("reset")}, ("info", "OSError", "enqueue")),
    ({}, ("ok", None, "enqueue")),
])
def test_the_intruder_judges_each_answer(answers: dict[str, Any], expected: tuple[Any, ...]) -> None:
    spec = Spec("intrude-enqueue", {"queue": "q1", "via": "request", "values": ["intruder-1"]})
    type_, value, error = asyncio.run(Intruder(FakeClient(**answers)).run(spec))
    assert (type_, error, value["step"]) == expected and value["values"] == ["intruder-1"]


def test_an_intrusion_whose_own_transaction_could_not_begin_was_never_sent() -> None:
    spec = Spec("intrude-enqueue", {"queue": "q1", "via": "transaction", "values": ["intruder-1"]})
    type_, value, error = asyncio.run(Intruder(FakeClient(begin=TooManyTransactions())).run(spec))
    assert (type_, error, value["step"]) == ("fail", "too_many_transactions", "begin")


def test_an_intrusion_allowed_inside_its_own_transaction_is_ok_and_committed() -> None:
    client = FakeClient()
    spec = Spec("intrude-enqueue", {"queue": "q1", "via": "transaction", "values": ["intruder-1"]})
    type_, value, error = asyncio.run(Intruder(client).run(spec))
    assert (type_, error, value["step"]) == ("ok", None, "commit") and client.begun == 1


@pytest.mark.parametrize("answer, expected", [
    # Transaction.abort() would take this for success; the intruder must see it was only told "closed"
    (TransactionAborted(), ("fail", "transaction_aborted", None)),
    (TransactionNotFound(), ("fail", "transaction_not_found", None)),
    ({"aborted": True, "returned": 2}, ("ok", None, 2)),
])
def test_a_hijacked_abort_records_what_the_server_answered(answer: Any, expected: tuple[Any, ...]) -> None:
    spec = Spec("intrude-hijack", {"verb": "abort", "transaction_id": VICTIM_TX, "victim": 3, "victim_f": "move"})
    type_, value, error = asyncio.run(Intruder(FakeClient(abort=answer)).run(spec))
    assert (type_, error, value.get("returned")) == expected and value["step"] == "abort"


def test_only_a_target_that_can_issue_tokens_gets_an_intruder_and_the_history_says_why(tmp_path: Path) -> None:
    class Docker:
        target = "docker"

    class Local:
        target = "local"

        def add_token(self, name: str, grants: list[dict[str, Any]], admin: bool = False) -> str:
            self.issued = (name, grants)
            return "rcq_intruder"

    assert token_issuer(Docker()) is None
    local = Local()
    assert token_issuer(local) is local
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        assert asyncio.run(_intruder_token(Docker(), history, Progress(quiet=True))) is None
        assert asyncio.run(_intruder_token(local, history, Progress(quiet=True))) == "rcq_intruder"
    assert local.issued == ("intruder", [{"queues": "guest*", "actions": ["produce", "consume"]}])
    skipped, issued = (line["value"] for line in read_history(tmp_path / "history.jsonl"))
    assert skipped == {"skipped": "the docker target's nodes accept only its admin token"}
    assert issued["principal"] == "intruder" and issued["process"] == INTRUDER
    assert check_security(build_model([]), read_history(tmp_path / "history.jsonl"))["checked"]


# ------------------------------------------------------------------ intrude-unread, against a real node
async def test_an_unread_flood_is_refused_not_read_by_a_node_with_the_bound(tmp_path: Path) -> None:
    # The flood ends once the node stops reading: about a second here idle, but its answers must
    # first fill the node's socket buffers, which a loaded machine's slower flood takes longer to do
    # (33,000 frames in the chaos run's 10 s, not yet enough, in a CI run with 4 workers).
    async with running_node(tmp_path, session_unsent_bytes_max=4096) as node:
        intruder = Intruder(cast(Any, None), [url_of(node)], None)
        outcome, value, error = await intruder.run(
            Spec("intrude-unread", {"frames_max": 10_000_000, "flood_s": FLOOD_PAUSE_WAIT_S}))
    assert (outcome, error) == ("fail", "not_read"), (outcome, value, error)
    assert value["step"] == "flood"


async def test_an_unread_flood_a_node_keeps_reading_is_allowed(tmp_path: Path) -> None:
    # a node that reads what it is sent (its bound far above the flood): the intruder says so
    async with running_node(tmp_path, session_unsent_bytes_max=1 << 30) as node:
        intruder = Intruder(cast(Any, None), [url_of(node)], None)
        outcome, value, error = await intruder.run(Spec("intrude-unread", {"frames_max": 2_000, "flood_s": 10.0}))
    assert (outcome, error) == ("ok", None), (outcome, value, error)
    assert value["taken"] == 2_000


async def test_an_unread_flood_that_runs_out_of_time_too_early_to_tell_has_no_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a loaded machine's flood: too few frames written for the node's bound to show, never stalled
    async def slow_flood(writer: Any, frames_max: int, flood_s: float) -> tuple[int, bool]:
        return 33_000, False

    monkeypatch.setattr(intruder_module, "write_unread", slow_flood)
    async with running_node(tmp_path, session_unsent_bytes_max=4096) as node:
        intruder = Intruder(cast(Any, None), [url_of(node)], None)
        outcome, _value, error = await intruder.run(
            Spec("intrude-unread", {"frames_max": 1_000_000, "flood_s": 10.0}))
    assert (outcome, error) == ("info", "request_timeout"), (outcome, error)


async def test_an_unread_flood_with_no_node_to_open_a_channel_has_no_answer() -> None:
    intruder = Intruder(cast(Any, None), ["http://127.0.0.1:9"], None)
    outcome, _value, error = await intruder.run(Spec("intrude-unread", {"frames_max": 10, "flood_s": 1.0}))
    assert (outcome, error) == ("info", "unavailable")
