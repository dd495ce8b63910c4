"""The status page opened with the token in its URL (``http://admin:TOKEN@host:port/``), in a real
headless Chromium: the page's polls must not be built on its own URL (``fetch()`` refuses a URL
that includes credentials), and the token it needs comes from that URL. No credentials are given
to the browser any other way here, so the page works only if it sends the token itself."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import LEADER_TIMEOUT_S, STATUS_PAGE_WAIT_MS
from tests.helpers.cluster import running_cluster

pytestmark = pytest.mark.cluster

CHROMIUM = next((path for path in (shutil.which("chromium"), shutil.which("chromium-browser"),
                                   shutil.which("google-chrome")) if path), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `./run tests` installs Debian's chromium as root; "
                                              "elsewhere install it to run this test")
def test_the_status_page_opened_with_the_token_in_its_url_polls_with_that_token() -> None:
    from playwright.sync_api import sync_playwright

    with running_cluster() as cluster, sync_playwright() as playwright:
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        leader_id = cluster.status(leader)["node_id"]
        follower = next(i for i in range(3) if i != leader)
        assert cluster.token is not None
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            failures: list[str] = []
            page.on("pageerror", lambda error: failures.append(str(error)))
            url = cluster.url(follower).replace("http://", f"http://admin:{cluster.token}@", 1) + "/"
            assert page.goto(url, wait_until="load").status == 200  # type: ignore[union-attr]
            page.wait_for_function(f"document.getElementById('leader').textContent === {json.dumps(leader_id)}",
                                   timeout=STATUS_PAGE_WAIT_MS)
            assert page.locator("#nodes tbody tr").count() == 3
            assert page.locator("#updated").get_attribute("class") == "muted"  # not "cannot reach this node"
            # the page kept its credentials in its URL (what made fetch() refuse relative URLs)
            assert "@" in page.evaluate("document.URL")
            # and a second poll went through as well (the page polls once a second)
            first = page.locator("#updated").text_content()
            page.wait_for_function(f"document.getElementById('updated').textContent !== {json.dumps(first)}",
                                   timeout=STATUS_PAGE_WAIT_MS)
            assert page.locator("#updated").get_attribute("class") == "muted"
            assert failures == []
        finally:
            browser.close()
