"""The live status page in a real headless Chromium (Debian's chromium, driven by Playwright):
it loads from any node, shows the leader, and a queue's counter moves after an enqueue without a
reload; in a cluster with partitions it shows nodes by partitions, a killed partition process's
restart, and a frozen one in red. ``RCQ_UPDATE_SCREENSHOT=1`` also writes docs/status-page.png."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import pytest

from rcq.local.cluster import LocalCluster
from rcq.testing import wait_until
from rcq.version import rcq_version
from tests.helpers import LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S, STATUS_PAGE_WAIT_MS
from tests.helpers.cluster import running_cluster, wait_settled

pytestmark = pytest.mark.cluster

CHROMIUM = next((path for path in (shutil.which("chromium"), shutil.which("chromium-browser"),
                                   shutil.which("google-chrome")) if path), None)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "status-page.png"


def post(url: str, body: dict[str, object], headers: dict[str, str], method: str = "POST") -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `./run tests` installs Debian's chromium as root; "
                                              "elsewhere install it to run this test")
def test_the_status_page_shows_the_cluster_and_updates_live(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with running_cluster() as cluster, sync_playwright() as playwright:
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        leader_id = cluster.status(leader)["node_id"]
        follower = next(i for i in range(3) if i != leader)
        post(f"{cluster.url(leader)}/v1/queues/jobs/enqueue", {"items": ["a", "b"]}, cluster.auth_headers())
        cluster.wait_for_applied(QUIET_CLUSTER_WAIT_S)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            # The page is for admins: the browser asks for the token (Basic authentication, any user
            # name, the token as the password) and sends it with the page's own requests too.
            page = browser.new_page(viewport={"width": 1280, "height": 900},
                                    http_credentials={"username": "admin", "password": str(cluster.token)})
            page.goto(cluster.url(follower) + "/", wait_until="load")  # any node serves the page
            page.wait_for_function(f"document.getElementById('leader').textContent === {json.dumps(leader_id)}",
                                   timeout=STATUS_PAGE_WAIT_MS)
            assert page.locator("#nodes tbody tr").count() == 3
            assert page.locator("#nodes .pill.leader").count() == 1
            assert (page.locator("#nodes tbody").text_content() or "").count(rcq_version()) == 3  # each node's
            assert page.locator("#served-by").text_content() == cluster.status(follower)["node_id"]
            enqueued = page.locator('#queues tr[data-queue="jobs"] td.enqueued')
            enqueued.wait_for(timeout=STATUS_PAGE_WAIT_MS)
            assert enqueued.text_content() == "2"
            for _ in range(3):
                post(f"{cluster.url(leader)}/v1/queues/jobs/enqueue", {"items": ["c", "d", "e"]}, cluster.auth_headers())
            # the counter moves without a reload (the page polls its node once a second)
            page.wait_for_function(
                "document.querySelector('#queues tr[data-queue=\"jobs\"] td.enqueued').textContent === '11'",
                timeout=STATUS_PAGE_WAIT_MS)
            assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # never reloaded
            # a delayed item shows as delayed (queue features), still without a reload
            post(f"{cluster.url(leader)}/v1/queues/jobs/enqueue", {"items": ["later"], "delay_s": 3600},
                 cluster.auth_headers())
            page.wait_for_function(
                "document.querySelector('#queues tr[data-queue=\"jobs\"] td.delayed').textContent === '1'",
                timeout=STATUS_PAGE_WAIT_MS)
            target = tmp_path / "status-page.png"
            if os.environ.get("RCQ_UPDATE_SCREENSHOT") == "1":
                target = SCREENSHOT
                page.wait_for_timeout(3000)  # pace: documentation only, a few more samples so the charts have lines
            page.screenshot(path=str(target), full_page=True)
            assert target.stat().st_size > 10_000
        finally:
            browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `./run tests` installs Debian's chromium as root; "
                                              "elsewhere install it to run this test")
def test_the_status_page_shows_nodes_by_partitions_with_a_restart_and_a_frozen_process_in_red() -> None:
    from playwright.sync_api import sync_playwright

    with LocalCluster(3, partitions_max=2, node_overrides={"balance_leaders": False}) as cluster, \
            sync_playwright() as playwright:
        wait_settled(cluster, cluster.wait_for_leader(LEADER_TIMEOUT_S))
        rows = cluster.ensure_partitions(3)
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        post(f"{cluster.url(leader)}/v1/queues/held", {"partitions": ["p1"]}, cluster.auth_headers(), "PUT")
        post(f"{cluster.url(leader)}/v1/queues/held/enqueue", {"items": ["a", "b", "c"]}, cluster.auth_headers())
        p1 = next(r for r in rows if r["name"] == "p1")
        follower_id = next(m for m in p1["members"] if m != p1["leader_id"])
        follower = next(i for i in range(3) if cluster.nodes[i].node_id == follower_id)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900},
                                    http_credentials={"username": "admin", "password": str(cluster.token)})
            page.goto(cluster.url(leader) + "/", wait_until="load")
            cell = f'#partitions tr[data-partition="p1"] td[data-node="{follower_id}"]'
            page.locator(cell + " .pill.follower").wait_for(timeout=STATUS_PAGE_WAIT_MS)
            assert page.locator("#partitions tbody tr").count() == 2  # p1, p2 (p0 is the nodes table)
            assert page.locator(f'#partitions tr[data-partition="p1"] td[data-node="{p1["leader_id"]}"] '
                                ".pill.leader").count() == 1
            page.wait_for_function(
                "document.querySelector('#partitions tr[data-partition=\"p1\"] td.num').textContent === '3'",
                timeout=STATUS_PAGE_WAIT_MS)
            pid = int(cluster.status(follower)["partition_processes"]["p1"]["pid"])
            os.kill(pid, signal.SIGKILL)  # its node starts it again: one restart
            page.wait_for_function(f"document.querySelector({json.dumps(cell)}).textContent.includes('1 restart')",
                                   timeout=STATUS_PAGE_WAIT_MS)
            pid = wait_until(lambda: cluster.status(follower)["partition_processes"]["p1"]["pid"], QUIET_CLUSTER_WAIT_S,
                             what="p1's process started again")
            os.kill(int(pid), signal.SIGSTOP)  # frozen: it does not answer, shown in red
            try:
                page.locator(cell + ".crash").wait_for(timeout=STATUS_PAGE_WAIT_MS)
                assert "not answering" in (page.locator(cell).text_content() or "")
            finally:
                os.kill(int(pid), signal.SIGCONT)
            page.locator(cell + " .pill.follower").wait_for(timeout=STATUS_PAGE_WAIT_MS)
        finally:
            browser.close()
