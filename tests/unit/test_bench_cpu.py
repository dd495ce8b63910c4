"""``python -m bench --cpu`` (:mod:`bench.cpu`): reading ``/proc``, a measured window against a
fake node, and the printed report. The whole bench with ``--cpu`` against a real cluster:
tests/integration/test_bench_cpu.py.

Must not import: a test module.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.cpu import (
    CLOCK_TICKS_PER_S,
    CpuWatch,
    cpu_seconds,
    local_pids,
    parse_stat,
    pid_listening_on,
    print_cpu_table,
    process_and_thread_seconds,
    thread_seconds,
    units_per_entry,
)
from bench.scenarios import Target


def stat_line(pid: int, comm: str, utime: int, stime: int) -> str:
    """A /proc/PID/stat line as proc(5) lays it out: utime and stime are fields 14 and 15."""
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "5", "0", "0", "0", str(utime), str(stime),
              "7", "9", "20", "0", "3", "0", "123456"]
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def write_stat(proc: Path, pid: int, utime: int, stime: int, comm: str = "python") -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(stat_line(pid, comm, utime, stime))


def test_parse_stat_counts_fields_after_the_command_name_even_with_spaces_and_parentheses() -> None:
    # A command name "a) 1 2 (b" would shift every field if the line were split naively.
    line = stat_line(4242, "a) 1 2 (b", utime=250, stime=50)
    assert parse_stat(line) == pytest.approx(300 / CLOCK_TICKS_PER_S)


def test_cpu_seconds_of_this_process_follows_its_cpu_clock() -> None:
    before, clock_before = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - clock_before < 0.1:  # 0.1 s of work, as the process's own clock counts it
        sum(range(10_000))
    grown = cpu_seconds(os.getpid()) - before
    assert 0.1 - 2 / CLOCK_TICKS_PER_S <= grown <= time.process_time() - clock_before + 2 / CLOCK_TICKS_PER_S


def test_cpu_seconds_reads_a_given_proc(tmp_path: Path) -> None:
    write_stat(tmp_path, 17, utime=1000, stime=24)
    assert cpu_seconds(17, tmp_path) == pytest.approx(1024 / CLOCK_TICKS_PER_S)


def fake_proc_with_listener(proc: Path, pid: int, port: int, inode: str) -> None:
    (proc / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    established = f"   0: 0100007F:{port:04X} 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000 0 777 1\n"
    listening = f"   1: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 {inode} 1\n"
    (proc / "net" / "tcp").write_text(header + established + listening)
    (proc / "net" / "tcp6").write_text(header)
    for other in (pid - 1, pid):
        (proc / str(other) / "fd").mkdir(parents=True)
    os.symlink("socket:[777]", proc / str(pid - 1) / "fd" / "3")  # the established connection's owner
    os.symlink("/dev/null", proc / str(pid) / "fd" / "0")
    os.symlink(f"socket:[{inode}]", proc / str(pid) / "fd" / "7")
    (proc / "self").mkdir()


def test_the_process_listening_on_a_port_is_found_from_its_socket_inode(tmp_path: Path) -> None:
    fake_proc_with_listener(tmp_path, pid=321, port=8123, inode="99881")
    assert pid_listening_on(8123, tmp_path) == 321
    assert pid_listening_on(8124, tmp_path) is None
    assert local_pids(["http://127.0.0.1:8123", "http://10.0.0.9:8123", "http://127.0.0.1:8124"], tmp_path) == \
        {"http://127.0.0.1:8123": 321}


def test_units_per_entry_reads_the_histograms_sum_and_count() -> None:
    text = ("# TYPE rcq_group_commit_units histogram\n"
            'rcq_group_commit_units_bucket{le="1.0"} 3.0\n'
            "rcq_group_commit_units_count 40.0\n"
            "rcq_group_commit_units_sum 130.0\n"
            "rcq_commit_duration_seconds_sum 9.5\n")
    assert units_per_entry(text) == (130.0, 40.0)
    assert units_per_entry("rcq_commit_duration_seconds_sum 9.5\n") is None


class FakeNodes:
    """Two nodes answering /v1/cluster (one leads) and /metrics (the leader's commit units)."""

    def __init__(self) -> None:
        self.units = (100.0, 50.0)
        self.roles = {"n1": "leader", "n2": "follower"}

    def app(self, node_id: str) -> web.Application:
        async def cluster(request: web.Request) -> web.Response:
            return web.json_response({"node_id": node_id, "role": self.roles[node_id]})

        async def metrics(request: web.Request) -> web.Response:
            total, count = self.units
            return web.Response(text=f"rcq_group_commit_units_count {count}\nrcq_group_commit_units_sum {total}\n")

        app = web.Application()
        app.router.add_get("/v1/cluster", cluster)
        app.router.add_get("/metrics", metrics)
        return app


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[FakeNodes, list[str]]]:
    fake = FakeNodes()
    servers = [TestServer(fake.app(node_id)) for node_id in ("n1", "n2")]
    for server in servers:
        await server.start_server()
    try:
        yield fake, [str(server.make_url("")).rstrip("/") for server in servers]
    finally:
        for server in servers:
            await server.close()


async def test_a_window_reports_each_processs_cpu_per_transaction_and_commits_per_entry(
        tmp_path: Path, nodes: tuple[FakeNodes, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    fake, urls = nodes
    for pid in (11, 12, 99):
        write_stat(tmp_path, pid, utime=1000, stime=0)
    watch = CpuWatch(Target(urls), {urls[0]: 11, urls[1]: 12}, proc=tmp_path, client_pid=99)
    async with watch.window():
        write_stat(tmp_path, 11, utime=1000 + CLOCK_TICKS_PER_S * 2, stime=CLOCK_TICKS_PER_S)  # 3 s
        write_stat(tmp_path, 12, utime=1000 + CLOCK_TICKS_PER_S, stime=0)  # 1 s
        write_stat(tmp_path, 99, utime=1000, stime=CLOCK_TICKS_PER_S * 2)  # 2 s
        fake.units = (100.0 + 3000.0, 50.0 + 1000.0)
    report = watch.per_transaction(1000)
    assert report["leader_id"] == "n1"
    assert report["us_per_tx"] == {"leader": 3000, "n2": 1000, "client": 2000}
    assert list(report["us_per_tx"]) == ["leader", "n2", "client"]
    assert report["commits_per_entry"] == 3.0
    assert "notes" not in report

    print_cpu_table([{"scenario": "enqueue-1", "callers": "separate", "cpu": report}])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU per transaction by process")
    assert lines[1].split() == ["scenario", "callers", "leader_us", "followers_us", "client_us", "commits_per_entry"]
    assert lines[2].split() == ["enqueue-1", "separate", "n1", "3000", "n2", "1000", "2000", "3.0"]


async def test_a_leader_change_and_an_unreadable_process_are_noted(
        tmp_path: Path, nodes: tuple[FakeNodes, list[str]]) -> None:
    fake, urls = nodes
    write_stat(tmp_path, 11, utime=0, stime=0)
    watch = CpuWatch(Target(urls), {urls[0]: 11, urls[1]: 404}, proc=tmp_path, client_pid=11)
    async with watch.window():
        fake.roles = {"n1": "follower", "n2": "leader"}
    report = watch.per_transaction(10)
    assert "the leader changed during the window (n1 -> n2)" in report["notes"]
    assert any("/proc/404/stat" in note for note in report["notes"])


def test_the_machines_busy_time_counts_every_state_but_idle_and_iowait(tmp_path: Path) -> None:
    from bench.machine_cpu import Window, machine_busy_s, servers_cpu_s

    # cpu  user nice system idle iowait irq softirq steal
    (tmp_path / "stat").write_text("cpu  100 10 50 9000 400 5 3 2 0 0\ncpu0 50 5 25 4500 200 2 1 1 0 0\n")
    assert machine_busy_s(tmp_path) == pytest.approx((100 + 10 + 50 + 5 + 3 + 2) / CLOCK_TICKS_PER_S)
    write_stat(tmp_path, 11, 30, 20)
    assert servers_cpu_s([11, 12], tmp_path) == pytest.approx(50 / CLOCK_TICKS_PER_S)  # 12 is gone: nothing
    window = Window(wall_s=2.0, machine_cpu_s=3.0, servers_cpu_s=1.0)
    assert window.rest_cpu_s == 2.0 and "rcq servers 1.0 CPU-s" in window.line(1000)


def test_thread_seconds_reads_every_thread_of_a_process_and_nothing_of_one_gone() -> None:
    threads = thread_seconds(os.getpid())
    assert os.getpid() in threads and all(seconds >= 0 for seconds in threads.values())
    assert thread_seconds(2**22 + 12345) == {}


def test_process_and_thread_seconds_leave_a_gone_process_out_of_both() -> None:
    gone = 2**22 + 12345
    processes, threads = process_and_thread_seconds([os.getpid(), gone])
    assert list(processes) == [os.getpid()] and processes[os.getpid()] >= 0
    assert {pid for pid, _tid in threads} == {os.getpid()} and (os.getpid(), os.getpid()) in threads
