"""Backup and restore of a cluster with partitions, on real 3-node clusters (docs/backup.md,
"Backup sets").

* ``rcq backup`` of a cluster with p0, p1 and p2 under load writes a set: a manifest and one
  checked part per partition, each consistent at its own index; restored into a new cluster with
  the same partitions (``rcq restore --data-dir``, then the cluster reopened and started), every
  partition has its part's data digest, the combined digest is the manifest's, and each queue
  holds exactly what the history says was there at its partition's index;
* a damaged part, a missing part, or p0's part alone is refused before anything is written;
* one queue of a set comes back into the running cluster, in the partition it lived in;
* ``python -m cluster up --restore SET`` starts a new cluster whose partitions are led before
  'ready' and have the set's combined digest.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rcq.backup.backup_set import MANIFEST_NAME, combined_digest, verify_set
from rcq.backup.queue_restore import restore_one_queue
from rcq.cli import main as cli_main
from rcq.client import RcqClient
from rcq.local.cluster import ADMIN_TOKEN_NAME, LocalCluster
from rcq.testing import async_wait_until, wait_until
from tests.helpers import CLUSTER_WAIT_S, LAUNCHER_EXIT_TIMEOUT_S, LAUNCHER_START_TIMEOUT_S, LEADER_TIMEOUT_S
from tests.helpers.backup_history import History, consumer, drain, producer
from tests.helpers.cluster import partitioned_cluster
from tests.helpers.launcher import Launcher

pytestmark = pytest.mark.cluster

LOAD_S = 2.0  # load on every partition before the backup, and again while it is taken
QUEUES = {"in-p0": None, "in-p1": "p1", "in-p2": "p2"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with partitioned_cluster(3, partitions_max=3) as local:
        yield local


@pytest.fixture(scope="module")
def backup(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, History]]:
    """A backup set taken with ``rcq backup`` under load on every partition, and the load's history."""
    path = tmp_path_factory.mktemp("sets") / "cluster.rcqset"
    histories = {queue: History() for queue in QUEUES}

    async def run() -> None:
        async with RcqClient(cluster.urls, **cluster.client_options()) as client:
            for queue, partition in QUEUES.items():
                await client.configure_queue(queue, max_priority=3, **({"partitions": [partition]} if partition else {}))
            stop = asyncio.Event()
            tasks = [asyncio.create_task(producer(client, q, f"{q}-w{i}", histories[q], stop))
                     for q in QUEUES for i in range(2)]
            tasks += [asyncio.create_task(consumer(client, q, histories[q], stop, abort=a))
                      for q in QUEUES for a in (False, True)]
            await asyncio.sleep(LOAD_S)  # pace: the load runs this long before the backup...
            urls = [flag for url in cluster.urls for flag in ("--url", url)]
            code = await asyncio.to_thread(cli_main, ["backup", str(path), *urls, "--token-file",
                                                      str(cluster.base_dir / ADMIN_TOKEN_NAME)])
            assert code == 0
            await asyncio.sleep(LOAD_S / 2)  # pace: ...and after it
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(run())
    return path, histories


def test_a_backup_set_holds_a_checked_part_per_partition(backup: tuple[Path, dict[str, History]],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = backup
    backup_set = verify_set(path)
    assert [part.name for part in backup_set.parts] == ["p0", "p1", "p2"]
    assert sorted(child.name for child in path.iterdir()) == [MANIFEST_NAME, "p0.rcqbackup", "p1.rcqbackup",
                                                             "p2.rcqbackup"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(child.stat().st_mode) == 0o600 for child in path.iterdir())
    assert not path.with_name(path.name + ".part").exists()
    assert all(len(part.members) == 3 for part in backup_set.parts[1:])
    assert backup_set.combined_digest == combined_digest({p.name: p.header.data_digest for p in backup_set.parts})
    assert all(int(part.header["items"]) > 0 for part in backup_set.parts), "a partition's part holds no item"
    capsys.readouterr()
    assert cli_main(["restore", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"verified {path} (") and f"combined digest {backup_set.combined_digest}" in out


@pytest.mark.parametrize("damage", ["flipped byte", "missing part", "p0 alone"])
def test_a_damaged_or_incomplete_set_is_refused_and_nothing_is_written(
        backup: tuple[Path, dict[str, History]], tmp_path: Path, damage: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = backup
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    target = copy
    if damage == "flipped byte":
        part = copy / "p1.rcqbackup"
        raw = bytearray(part.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        part.write_bytes(bytes(raw))
    elif damage == "missing part":
        (copy / "p2.rcqbackup").unlink()
    else:
        target = copy / "p0.rcqbackup"
    restored = tmp_path / "restored"
    capsys.readouterr()
    assert cli_main(["restore", str(target), "--data-dir", str(restored), "--nodes", "3"]) != 0
    err = capsys.readouterr().err
    assert not restored.exists() or not any(restored.iterdir())
    if damage == "p0 alone":
        assert "restore_refused" in err and "restore the whole backup set" in err
    elif damage == "missing part":
        assert "backup_corrupt" in err and "p2" in err and "missing" in err
    else:
        assert "backup_corrupt" in err and "checksum" in err


def test_a_set_is_refused_by_a_new_cluster_without_its_partitions_members(
        backup: tuple[Path, dict[str, History]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = backup
    capsys.readouterr()
    assert cli_main(["restore", str(path), "--data-dir", str(tmp_path / "two"), "--nodes", "2"]) != 0
    assert "the new cluster has no node node-2" in capsys.readouterr().err
    assert not (tmp_path / "two").exists()
    assert cli_main(["restore", str(path), "--node-data-dir", str(tmp_path / "one")]) != 0
    assert "--node-config for each node" in capsys.readouterr().err
    assert not (tmp_path / "one").exists()


def test_a_set_restores_into_a_new_cluster_with_the_same_partitions_as_the_history_says(
        backup: tuple[Path, dict[str, History]], tmp_path: Path) -> None:
    path, histories = backup
    backup_set = verify_set(path)
    directory = tmp_path / "restored"
    assert cli_main(["restore", str(path), "--data-dir", str(directory), "--nodes", "3"]) == 0
    restored = LocalCluster.reopen(directory)
    try:
        restored.start()
        leader = restored.wait_for_leader(LEADER_TIMEOUT_S)
        rows = wait_until(lambda: _led(restored, leader), CLUSTER_WAIT_S, what="the restored partitions led")
        assert {row["name"]: sorted(row["members"]) for row in rows} == {
            part.name: sorted(part.members or (n.node_id for n in restored.nodes)) for part in backup_set.parts}
        digests = {"p0": restored.data_digest(leader)["data_digest"]}
        for row in rows[1:]:
            digests[row["name"]] = restored.poll_json(row["leader_url"] + "/v1/cluster/data-digest")["data_digest"]
        assert digests == {part.name: part.header.data_digest for part in backup_set.parts}
        assert combined_digest(digests) == backup_set.combined_digest
        options = restored.client_options()
        contents = {queue: asyncio.run(drain(restored.urls, options, queue)) for queue in QUEUES}
    finally:
        restored.close()
    for queue, partition in QUEUES.items():
        part = backup_set.part(partition or "p0")
        assert part is not None
        _check_history(histories[queue], contents[queue], part.header.index)


def _led(cluster: LocalCluster, leader: int) -> list[dict[str, Any]] | None:
    rows = cluster.partitions(leader)
    return rows if len(rows) == 3 and all(row["leader_url"] for row in rows) else None


def _check_history(history: History, items: list[bytes], index: int) -> None:
    """``items`` (a queue restored at its partition's ``index``) are what ``history`` says it held then."""
    assert len(items) == len(set(items)), "an item restored twice"
    history.check_restored(set(items), index)
    assert set(items) <= set(history.enqueued) | history.unknown, "an item never enqueued was restored"


def test_one_queue_of_a_set_comes_back_into_its_partition_of_the_running_cluster(
        cluster: LocalCluster, backup: tuple[Path, dict[str, History]]) -> None:
    path, _ = backup
    part = verify_set(path).part("p1")
    assert part is not None

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        async with RcqClient(cluster.urls, **cluster.client_options()) as client:
            report = await restore_one_queue(client, path, "in-p1", "in-p1.restored")
            return report, await client.queue_info("in-p1.restored")

    report, info = asyncio.run(run())
    assert report["index"] == part.header.index and report["notes"] == []
    assert info["settings"]["partitions"] == ["p1"] and info["settings"]["max_priority"] == 3
    assert info["count"] == report["items"] > 0


PARTITION_LINE = re.compile(r"^  (p\d+)  members (\S+)  leader (node-\d+) (https?://127\.0\.0\.1:\d+)$")
TOKEN_LINE = re.compile(r"export RCQ_TOKEN=\$\(cat (\S+)\)")


async def test_cluster_up_restore_starts_a_new_cluster_with_every_partition_of_the_set(
        backup: tuple[Path, dict[str, History]], launchers: list[Launcher]) -> None:
    path, _ = backup
    backup_set = verify_set(path)
    launcher = Launcher("up", "--restore", str(path))
    launchers.append(launcher)
    await async_wait_until(lambda: "ready" in launcher.lines or launcher.process.poll() is not None,
                           LAUNCHER_START_TIMEOUT_S, interval_s=0.1, what="the launcher printing ready")
    assert launcher.process.poll() is None, launcher.output
    assert f"restored the backup {path} into the new cluster" in launcher.output
    rows = [m for m in map(PARTITION_LINE.match, launcher.lines[:launcher.lines.index("ready")]) if m]
    assert [m[1] for m in rows] == ["p0", "p1", "p2"], launcher.output
    token_file = next(m[1] for m in map(TOKEN_LINE.search, launcher.lines) if m)
    headers = {"Authorization": f"Bearer {Path(token_file).read_text().strip()}"}
    digests = {}
    async with aiohttp.ClientSession(headers=headers) as session:
        for match in rows:
            async with session.get(match[4] + "/v1/cluster/data-digest") as answer:
                digests[match[1]] = (await answer.json())["data_digest"]
    assert combined_digest(digests) == backup_set.combined_digest
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.wait(LAUNCHER_EXIT_TIMEOUT_S) == 0, launcher.output
