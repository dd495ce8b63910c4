"""``rcq backup`` asks a follower for the backup only once it has applied what the leader had applied
when the backup was asked for, so the backup holds every commit acknowledged before it. A follower
learns that an entry is committed with the leader's next message: without the wait, a backup taken
right after a commit could miss it (seen in CI: a queue's last 100 enqueued items were not in the
backup taken after them).

Two fake nodes over real HTTP (only ``/v1/cluster`` and the backup route): a leader at applied index
120, a follower that reaches it one index per poll. The follower's backup route records the index it
was asked at and refuses (no backup stream is needed to see when it was asked).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rcq.cli import backup as backup_cli
from rcq.cli.backup import BackupFailed, save_backup

LEADER_APPLIED = 120


class FakeNodes:
    def __init__(self, follower_applied: int, follower_step: int) -> None:
        self.follower_applied = follower_applied
        self.follower_step = follower_step
        self.asked_at: list[int] = []  # the follower's applied index when its backup was asked for
        self.urls: dict[str, str] = {}

    def app(self, role: str) -> web.Application:
        async def cluster(request: web.Request) -> web.Response:
            if role == "leader":
                applied = LEADER_APPLIED
            else:
                applied = self.follower_applied
                self.follower_applied = min(LEADER_APPLIED, applied + self.follower_step)
            other = self.urls["follower" if role == "leader" else "leader"]
            return web.json_response({"role": role, "leader_id": "n1", "last_applied": applied,
                                      "peers": [{"url": other}]})

        async def backup(request: web.Request) -> web.Response:
            self.asked_at.append(self.follower_applied)
            return web.json_response({"error": {"code": "unavailable", "message": "test: no stream"}}, status=503)

        app = web.Application()
        app.router.add_get("/v1/cluster", cluster)
        app.router.add_get(backup_cli.BACKUP_PATH, backup)
        return app


@contextlib.asynccontextmanager
async def serving(nodes: FakeNodes) -> AsyncIterator[None]:
    runners = []
    try:
        for role in ("leader", "follower"):
            runner = web.AppRunner(nodes.app(role))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            port = runner.addresses[0][1]
            nodes.urls[role] = f"http://127.0.0.1:{port}"
        yield
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_the_follower_is_asked_for_the_backup_once_it_has_applied_the_leaders_index(tmp_path: Path):
    nodes = FakeNodes(follower_applied=100, follower_step=1)
    async with serving(nodes):
        with pytest.raises(BackupFailed, match="test: no stream"):
            await save_backup([nodes.urls["leader"]], tmp_path / "b.rcqbackup", token=None)
    assert nodes.asked_at == [LEADER_APPLIED]  # not 100: what the follower had when it was first seen


async def test_a_follower_that_does_not_catch_up_in_time_is_passed_over_and_nothing_is_written(
        tmp_path: Path, monkeypatch: Any):
    monkeypatch.setattr(backup_cli, "CATCH_UP_S", 0.2)
    nodes = FakeNodes(follower_applied=100, follower_step=0)
    path = tmp_path / "b.rcqbackup"
    async with serving(nodes):
        with pytest.raises(BackupFailed, match=r"applied index 100, behind the leader's 120"):
            await save_backup([nodes.urls["leader"]], path, token=None)
    assert nodes.asked_at == []  # never asked: its backup would have missed acknowledged commits
    assert not path.exists() and not path.with_name(path.name + ".part").exists()
