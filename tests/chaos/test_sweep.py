"""chaos.sweep: seed lists, the verdict table, and a run that left no results."""

from __future__ import annotations

import pytest

from chaos.sweep import main, parse_seeds, table


def test_seed_lists_take_ranges_and_repeats():
    assert parse_seeds("1-3, 7,7") == [1, 2, 3, 7, 7]


@pytest.mark.parametrize("text", ["", "5-3", "x"])
def test_bad_seed_lists_are_refused(text):
    with pytest.raises(ValueError):
        parse_seeds(text)


def test_the_table_names_failed_checkers_and_counts_valid_runs():
    rows = [{"seed": 1, "out": "seed-1-0", "ops": 10, "verdict": "valid", "wall_s": 5,
             "checkers": {"total_queue": True}},
            {"seed": 2, "out": "seed-2-1", "ops": 12, "verdict": "INVALID", "wall_s": 6,
             "checkers": {"total_queue": False, "convergence": True}, "why": ["INVALID total_queue: lost 3"]}]
    text = table(rows)
    assert "| 2 | seed-2-1 | 12 | INVALID | total_queue | 6 |" in text
    assert "1 of 2 runs valid." in text
    assert "- seed 2 (seed-2-1): INVALID total_queue: lost 3" in text


def test_a_sweep_whose_runs_cannot_start_is_not_valid(tmp_path, capsys):
    # --nodes 0 makes every run exit before it writes results: the sweep must say so, not pass.
    assert main(["--seeds", "1", "--out", str(tmp_path), "--nodes", "0", "--time-limit-s", "1"]) == 1
    assert "NO RESULT" in (tmp_path / "sweep.md").read_text()


def test_a_run_row_reads_the_results_document(tmp_path, monkeypatch):
    from chaos import sweep

    def fake_run(command, stdout, stderr, check):
        out = tmp_path / "seed-3-0"
        out.mkdir()
        (out / "results.json").write_text(
            '{"valid": false, "seed": 3, "parameters": {}, "results": {"valid": false, "stats": {"client_ops": 42},'
            ' "total_queue": {"valid": false}, "convergence": {"valid": true}}}')
        (out / "summary.txt").write_text("rcq chaos run: INVALID\n  INVALID total_queue: lost 1\n")
        return type("Done", (), {"returncode": 1})()

    monkeypatch.setattr(sweep.subprocess, "run", fake_run)
    row = sweep.run_one(3, tmp_path / "seed-3-0", [])
    assert (row["verdict"], row["ops"], row["checkers"]) == ("INVALID", 42, {"total_queue": False, "convergence": True})
    assert row["why"] == ["INVALID total_queue: lost 1"]
