"""Backup and restore on real 3-node clusters (docs/backup.md).

* a backup taken under load (producers, consumers, aborters) restores into a new cluster holding
  exactly the items the history says were there at the backup's index, once each; settings and
  dead letters survive; the restored nodes' data digests equal the header's;
* one queue restored into a running cluster under load holds exactly that queue's items;
* a node killed mid-stream: the backup starts again from the other follower, or fails with no file;
* a disk that fills during a backup: the partial file is removed, the cluster is unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import stat
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rcq.backup.fileformat import verify
from rcq.backup.queue_restore import restore_one_queue
from rcq.cli import main as cli_main
from rcq.cli.backup import BackupFailed, save_backup
from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from tests.helpers import CLUSTER_WAIT_S
from tests.helpers.backup_history import History, consumer, drain, producer
from tests.helpers.cluster import restored_cluster, running_cluster

pytestmark = pytest.mark.cluster

LOAD_S = 2.0  # load before the backup, and again while it is taken


def test_a_backup_under_load_restores_into_a_new_cluster_as_the_history_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue, dead = "jobs", "jobs.dead"
    backup = tmp_path / "cluster.rcqbackup"
    with running_cluster() as cluster:
        options = cluster.client_options()
        history = History()

        async def run() -> Any:
            async with RcqClient(cluster.urls, **options) as client:
                await client.configure_queue(dead)
                # max_deliveries high enough never to be reached: a restored leader would otherwise dead-letter
                # the items at their limit that open transactions held at backup time (a change of data).
                await client.configure_queue(queue, max_deliveries=1000, dead_letter_queue=dead, max_priority=3)
                # Dead letters: rejected items go to the dead-letter queue at once.
                await client.enqueue(queue, b"poison-1", b"poison-2")
                tx = await client.begin(timeout_s=30)
                held = await tx.dequeue_items(queue, 2)
                await tx.reject(queue, held, reason="bad format")
                await tx.commit()
                stop = asyncio.Event()
                tasks = [asyncio.create_task(producer(client, queue, f"p{i}", history, stop)) for i in range(3)]
                tasks += [asyncio.create_task(consumer(client, queue, history, stop, abort=False)) for _ in range(2)]
                tasks += [asyncio.create_task(consumer(client, queue, history, stop, abort=True))]
                await asyncio.sleep(LOAD_S)  # pace: the load runs this long before the backup...
                header = await save_backup(cluster.urls, backup, token=cluster.token)
                await asyncio.sleep(LOAD_S / 2)  # pace: ...and after it
                stop.set()
                await asyncio.gather(*tasks)
                return header

        header = asyncio.run(run())
        assert verify(backup).fields == header.fields
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600  # every item is in it: its owner's only
        capsys.readouterr()
        assert cli_main(["restore", str(backup), "--check"]) == 0
        assert capsys.readouterr().out.startswith(f"verified {backup} (")
        assert header["node_id"] != cluster.nodes[cluster.wait_for_leader(CLUSTER_WAIT_S)].node_id  # a follower
    index = header.index
    restored = restored_cluster(backup)
    try:
        restored.wait_for_applied(CLUSTER_WAIT_S)
        for i in range(3):
            assert restored.data_digest(i)["data_digest"] == header.data_digest
        assert all(restored.status(i)["term"] > header.term for i in range(3))

        async def inspect() -> tuple[dict[str, Any], list[bytes], list[bytes]]:
            async with RcqClient(restored.urls, **restored.client_options()) as client:
                info = await client.queue_info(queue)
            return info, await drain(restored.urls, restored.client_options(), queue), \
                await drain(restored.urls, restored.client_options(), dead)

        info, items, dead_items = asyncio.run(inspect())
    finally:
        restored.close()
    assert info["settings"]["max_deliveries"] == 1000 and info["settings"]["dead_letter_queue"] == dead
    assert sorted(dead_items) == [b"poison-1", b"poison-2"]
    counts = Counter(items + dead_items)
    assert [v for v, c in counts.items() if c > 1] == [], "an item restored twice"
    present = set(items) | set(dead_items)
    assert present, "nothing was restored"
    history.check_restored(present, index)
    acknowledged = set(history.enqueued) | history.unknown | {b"poison-1", b"poison-2"}
    assert present <= acknowledged, "an item never enqueued was restored"


def test_one_queue_comes_back_into_a_running_cluster_under_load(tmp_path: Path) -> None:
    backup = tmp_path / "orders.rcqbackup"
    with running_cluster() as cluster:
        options = cluster.client_options()

        async def run() -> tuple[list[bytes], dict[str, Any], dict[str, Any]]:
            async with RcqClient(cluster.urls, **options) as client:
                await client.configure_queue("orders", max_priority=5, default_ttl_s=3600)
                values = [f"order-{i}".encode() for i in range(1200)]
                for start in range(0, len(values), 100):
                    await client.enqueue("orders", *values[start:start + 100], priority=(start // 100) % 3)
                await save_backup(cluster.urls, backup, token=cluster.token)
                await client.delete_queue("orders")  # the operator's mistake
                history = History()
                stop = asyncio.Event()
                load = [asyncio.create_task(producer(client, "other", f"p{i}", history, stop)) for i in range(2)]
                load.append(asyncio.create_task(consumer(client, "other", history, stop, abort=False)))
                try:
                    report = await restore_one_queue(client, backup, "orders", "orders.restored")
                finally:
                    stop.set()
                    await asyncio.gather(*load)
                info = await client.queue_info("orders.restored")
            return values, report, info

        values, report, info = asyncio.run(run())
        assert report["items"] == len(values) and info["count"] == len(values)
        assert info["settings"]["max_priority"] == 5 and info["settings"]["default_ttl_s"] == 3600
        restored = asyncio.run(drain(cluster.urls, options, "orders.restored"))
    assert sorted(restored) == sorted(values)
    assert restored[:100] == [f"order-{i}".encode() for i in range(200, 300)]  # priority 2 first, in order


def _fill(cluster: LocalCluster, items: int, size: int) -> None:
    async def run() -> None:
        async with RcqClient(cluster.urls, **cluster.client_options()) as client:
            for _batch in range(0, items, 100):
                await client.enqueue("big", *[random.randbytes(size) for _ in range(100)])
    asyncio.run(run())
    cluster.wait_for_applied(CLUSTER_WAIT_S)


def test_a_node_killed_mid_stream_the_backup_comes_from_another_or_fails_with_no_file(tmp_path: Path) -> None:
    with running_cluster() as cluster:
        _fill(cluster, 3000, 10_000)  # 30 MB: far more than the sockets buffer
        by_url = {node.url: node.index for node in cluster.nodes}
        killed: list[int] = []

        def kill_first_server(url: str, received: int) -> None:
            if not killed:
                killed.append(by_url[url])
                cluster.kill_node(by_url[url])

        path = tmp_path / "b.rcqbackup"
        header = asyncio.run(save_backup(cluster.urls, path, token=cluster.token, on_chunk=kill_first_server))
        assert killed and header["node_id"] != cluster.nodes[killed[0]].node_id
        assert verify(path).data_digest == header.data_digest
        assert not path.with_name(path.name + ".part").exists()

        cluster.start_node(killed[0])
        cluster.wait_for_applied(CLUSTER_WAIT_S)
        killed.clear()

        def kill_every_server(url: str, received: int) -> None:
            if by_url[url] not in killed:
                killed.append(by_url[url])
                cluster.kill_node(by_url[url])

        failed = tmp_path / "failed.rcqbackup"
        with pytest.raises(BackupFailed, match="no node served a complete backup"):
            asyncio.run(save_backup(cluster.urls, failed, token=cluster.token, on_chunk=kill_every_server))
        assert killed  # the second follower fails too: killed mid-stream, or it cannot serve without a quorum
        assert not failed.exists() and not failed.with_name(failed.name + ".part").exists()


@contextlib.contextmanager
def small_filesystem(size: str) -> Any:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a full disk)")
    directory = Path(tempfile.mkdtemp(prefix="rcq-full-"))
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True, check=False).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        try:
            yield directory
        finally:
            subprocess.run(["umount", str(directory)], check=True)
    finally:
        directory.rmdir()


def test_a_disk_that_fills_during_a_backup_leaves_no_file_and_the_cluster_unaffected() -> None:
    with running_cluster() as cluster, small_filesystem("1m") as full:
        _fill(cluster, 300, 10_000)  # 3 MB
        path = full / "b.rcqbackup"
        with pytest.raises(OSError) as raised:
            asyncio.run(save_backup(cluster.urls, path, token=cluster.token))
        assert raised.value.errno == 28  # ENOSPC
        assert list(full.iterdir()) == []
        converged = cluster.wait_for_convergence(CLUSTER_WAIT_S)
        assert converged["applied_index"] > 0

        async def still_works() -> int:
            async with RcqClient(cluster.urls, **cluster.client_options()) as client:
                await client.enqueue("after", b"x")
                return int((await client.queue_info("after"))["count"])
        assert asyncio.run(still_works()) == 1
        statuses = [cluster.status(i) for i in range(3)]
        assert not any(os.path.exists(cluster.nodes[i].data_dir / "backup.body.part") for i in range(3))
        assert all("last_backup" in status for status in statuses)
