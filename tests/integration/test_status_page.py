"""The live status page in a real headless Chromium (Debian's chromium, driven by Playwright):
it loads from any node, shows the leader, and a queue's counter moves after an enqueue without a
reload. ``RCQ_UPDATE_SCREENSHOT=1`` also writes docs/status-page.png."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from rcq.version import rcq_version
from tests.helpers import LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S, STATUS_PAGE_WAIT_MS
from tests.helpers.cluster import running_cluster

pytestmark = pytest.mark.cluster

CHROMIUM = next((path for path in (shutil.which("chromium"), shutil.which("chromium-browser"),
                                   shutil.which("google-chrome")) if path), None)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "status-page.png"


def post(url: str, body: dict[str, object], headers: dict[str, str]) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
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
