"""The ``backup`` nemesis's check (chaos.backups.ProbeHistory.verdict) and the backups checker:
what a restored backup must hold at its index, what it must not, and what may go either way;
that the kind is named only (not in ``all``); and that a run whose faults left no backup
restored takes one after the heal (a real run, one node set up to have none under the faults)."""

from __future__ import annotations

import asyncio
import random

import pytest

import chaos.__main__ as chaos_main
from chaos.backups import BACKUP_EVERY_S, BackupNemesis, ProbeHistory
from chaos.checkers import CHECKER_NAMES, check
from chaos.checkers.backups import check_backups
from chaos.checkers.report import summary_text
from chaos.nemesis import DOCKER_KINDS, KINDS, MIXABLE, parse_kinds
from chaos.runner import Progress, RunConfig, run
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.chaos_runs import describe, require_valid


def history() -> ProbeHistory:
    probe = ProbeHistory()
    probe.enqueued.update({"a": 5, "b": 5, "c": 9, "d": 12, "e": 3})
    probe.dequeued.update({"e": 8, "c": 15})
    probe.unknown.add("u")
    probe.maybe_dequeued.add("b")
    probe.in_flight.add("f")
    return probe


def test_a_backup_at_its_index_is_valid_and_undecided_items_go_either_way():
    # at index 10: a, c there (c dequeued later); e dequeued at 8: gone; d enqueued at 12: not yet
    assert history().verdict(10, ["a", "c"]) == {"probe_checked": 2, "probe_restored": 2, "valid": True}
    assert history().verdict(10, ["a", "c", "b", "u", "f"])["valid"]  # outcomes unknown or in flight


def test_missing_duplicated_late_reappeared_and_unknown_items_are_named():
    verdict = history().verdict(10, ["c", "c", "d", "e", "zzz"])
    assert not verdict["valid"]
    assert verdict["missing"] == ["a"] and verdict["duplicated"] == ["c"] and verdict["from_after"] == ["d"]
    assert verdict["reappeared"] == ["e"] and verdict["unknown_items"] == ["zzz"]


def line(f: str, value: dict) -> dict:
    return {"index": 0, "time_s": 1.0, "process": "nemesis", "type": "info", "f": f, "value": value, "error": None}


def test_the_checker_fails_a_run_only_for_a_restore_that_was_not_valid():
    lines = [line("backup", {"phase": "taken", "index": 7}), line("backup", {"phase": "failed", "error": "x"}),
             line("backup-restore", {"phase": "checked", "index": 7, "valid": True, "probe_checked": 4})]
    result = check_backups(lines)
    assert result["valid"] and (result["backups_taken"], result["backups_failed"], result["restores_checked"]) == (1, 1, 1)
    assert result["probe_items_checked"] == 4
    bad = check_backups([*lines, line("backup-restore", {"phase": "checked", "index": 9, "valid": False})])
    assert not bad["valid"] and bad["invalid_restores"][0]["index"] == 9
    assert "backups" in CHECKER_NAMES and check([])["backups"]["valid"]


def test_a_backup_behind_a_commit_acknowledged_before_it_was_asked_for_fails_the_run():
    assert history().highest_index() == 15 and ProbeHistory().highest_index() == 0
    on_time = line("backup", {"phase": "taken", "number": 0, "index": 15, "acknowledged_before": 15})
    assert check_backups([on_time])["valid"]
    late = line("backup", {"phase": "taken", "number": 1, "index": 14, "acknowledged_before": 15, "node_id": "n2"})
    result = check_backups([on_time, late])
    assert not result["valid"]
    assert result["behind"] == [{"number": 1, "index": 14, "acknowledged_before": 15, "node_id": "n2"}]


def test_backup_is_a_background_kind_named_only():
    assert "backup" in KINDS and "backup" not in MIXABLE and "backup" not in DOCKER_KINDS
    assert "backup" not in parse_kinds("all") and parse_kinds("backup,kill") == ["backup", "kill"]


def test_all_with_backup_beside_it_is_every_kind_of_all_and_backup():
    assert parse_kinds("all,backup") == [*parse_kinds("all"), "backup"] == parse_kinds("backup,all,kill,backup")
    assert parse_kinds("all,backup", power_fs=True) == [*parse_kinds("all", power_fs=True), "backup"]
    with pytest.raises(ValueError, match="unknown nemesis bakup"):
        parse_kinds("all,bakup")


def test_the_cli_runs_all_and_backup_with_partitions_as_all_is_run(monkeypatch, tmp_path):
    """With partitions, ``all`` leaves out ``upgrade`` (it needs level 1); ``all,backup`` too."""
    configs: list[RunConfig] = []
    monkeypatch.setattr(chaos_main, "run", lambda config, progress: configs.append(config) or {"valid": True})
    for nemesis in ("all", "all,backup"):
        assert chaos_main.main(["--nemesis", nemesis, "--partitions", "3", "--seed", "3", "--quiet",
                                "--out", str(tmp_path / nemesis)]) == 0
    plain, with_backup = configs
    assert "upgrade" not in plain.nemesis and "kill-partition-process" in plain.nemesis
    assert with_backup.nemesis == [*plain.nemesis, "backup"]


def test_a_set_part_behind_its_own_partitions_probe_fails_the_run():
    parts = [{"partition": "p0", "index": 15, "acknowledged_before": 15, "node_id": "n1"},
             {"partition": "p1", "index": 40, "acknowledged_before": 40, "node_id": "n2"}]
    on_time = line("backup", {"phase": "taken", "number": 0, "index": 15, "acknowledged_before": 15, "parts": parts})
    result = check_backups([on_time])
    assert result["valid"] and result["sets_taken"] == 1
    # p0 on time, p1's part behind a probe commit of p1 acknowledged before the set was asked for
    late_parts = [parts[0], {**parts[1], "index": 39}]
    late = line("backup", {"phase": "taken", "number": 1, "index": 15, "acknowledged_before": 15, "parts": late_parts})
    result = check_backups([on_time, late])
    assert not result["valid"]
    assert result["behind"] == [{"number": 1, "partition": "p1", "index": 39, "acknowledged_before": 40,
                                 "node_id": "n2"}]


def test_the_checker_counts_a_backup_after_the_heal_and_samples_the_failures():
    lines = [line("backup", {"phase": "failed", "error": "BackupFailed: partition p1: no leader"}),
             line("backup", {"phase": "failed", "error": "BackupFailed: partition p1: no leader"}),
             line("backup", {"phase": "failed", "error": "TimeoutError: "}),
             line("backup", {"phase": "taken", "index": 7, "after_heal": True}),
             line("backup-restore", {"phase": "checked", "index": 7, "valid": True, "probe_checked": 4})]
    result = check_backups(lines)
    assert result["valid"] and result["taken_after_heal"] == 1 and result["backups_failed"] == 3
    assert result["failure_samples"] == ["BackupFailed: partition p1: no leader", "TimeoutError: "]
    assert check_backups(lines[3:])["failure_samples"] == []


def test_the_report_names_what_an_invalid_restore_held_against_its_history():
    lines = [line("backup", {"phase": "taken", "number": 0, "index": 7}),
             line("backup-restore", {"phase": "checked", "number": 0, "index": 7, "valid": False,
                                     "probe_checked": 4, "unknown_items": ["p0-b1-6"], "identity_new": False}),
             line("backup", {"phase": "taken", "number": 1, "index": 9, "parts": []}),
             line("backup-restore", {"phase": "checked", "number": 1, "index": 9, "valid": False, "probe_checked": 2,
                                     "partitions": {"p1": {"valid": False, "missing": ["p1-b0-3"]}}})]
    text = summary_text({"backups": check_backups(lines)}, seed=1)
    assert "2 not as the history says" in text
    assert "backup 0 at index 7: unknown_items ['p0-b1-6']; the restored cluster kept the backed-up" in text
    assert "backup 1 at index 9: p1 missing ['p1-b0-3']" in text


class Recording(BackupNemesis):
    """A nemesis whose backups are only counted: what ``after_heal`` asks for."""

    def __init__(self, restored: int) -> None:  # no cluster: _one_backup is replaced
        self.probes, self.restored, self.random, self.progress = {"p0": ProbeHistory()}, restored, random.Random(0), print
        self.asked: list[bool] = []

    async def _one_backup(self, stop: asyncio.Event, after_heal: bool = False) -> None:
        assert not stop.is_set()
        self.asked.append(after_heal)


def test_after_the_heal_one_backup_only_when_none_was_restored_under_the_faults():
    none_restored, one_restored = Recording(0), Recording(1)
    asyncio.run(none_restored.after_heal())
    asyncio.run(one_restored.after_heal())
    assert none_restored.asked == [True] and one_restored.asked == []


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_run_too_short_for_a_backup_under_faults_checks_one_after_the_heal(tmp_path):
    """The time limit ends before the first backup is due (BACKUP_EVERY_S): the one after the heal
    is a single file (no partitions), restored into a scratch node and checked."""
    time_limit_s = 2.0
    assert time_limit_s < BACKUP_EVERY_S[0]
    config = RunConfig(nodes=3, time_limit_s=time_limit_s, nemesis=["backup"], seed=20240611, out=tmp_path,
                       workers=2)
    document = run(config, Progress(quiet=True))
    backups = document["results"]["backups"]
    assert (backups["backups_taken"], backups["taken_after_heal"], backups["restores_checked"]) == (1, 1, 1), \
        describe(document)
    assert backups["sets_taken"] == 0 and backups["probe_items_checked"] > 0, describe(document)
    assert "1 after the heal (none checked under the faults)" in document["summary"], describe(document)
    require_valid(document, ("total_queue", "backups"))


class CommitsThenHangs:
    """A client whose enqueue reaches the node (it commits there) and whose answer never comes."""

    def __init__(self) -> None:
        self.committed: list[str] = []
        self.reached = asyncio.Event()

    async def enqueue(self, _queue: str, *values: bytes) -> None:
        self.committed.extend(v.decode() for v in values)
        self.reached.set()
        await asyncio.Event().wait()


def test_an_enqueue_cancelled_at_the_stop_is_undecided_not_unsent():
    """The probe's workers are cancelled when the run stops; a backup after the heal then holds an
    enqueue whose answer the cancel cut off: an item of unknown outcome, not one never sent."""
    nemesis, client = Recording(0), CommitsThenHangs()

    async def cancelled_mid_enqueue() -> None:
        task = asyncio.create_task(nemesis._producer(client, "p0", "b0", asyncio.Event()))  # type: ignore[arg-type]
        await asyncio.wait_for(client.reached.wait(), LOCAL_WAIT_S)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancelled_mid_enqueue())
    assert client.committed and nemesis.probe.unknown == set(client.committed)
    assert nemesis.probe.verdict(10, client.committed)["valid"]
