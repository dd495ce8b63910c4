"""Fixtures for tests that run another release of rcq beside the code under test.

``previous_release``: the previous release (:data:`rcq.local.releases.PREVIOUS_RELEASE`), taken
from this repository's history and made runnable once per test session in a temporary directory
(its tree and a scratch venv without pip; about a second), removed at the end of the session.
Without the history (a shallow clone, an exported tree) it raises, so every test that uses it
fails, saying so: these tests never skip. ``previous_cluster``: a started 3-node
:class:`~rcq.local.cluster.LocalCluster` of the previous release, one per test (tests restart
its nodes into other releases), closed after it.

When a test that used a LocalCluster fails, the tail of every node's log is added to its report
(section "rcq node logs"), as for every test (the hook of tests/conftest.py).

Must not import: a test module or another conftest.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rcq.local.cluster import LocalCluster
from rcq.local.releases import PREVIOUS_RELEASE, PREVIOUS_RELEASE_NAME, Release, materialise

log = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def previous_release() -> Iterator[Release]:
    directory = Path(tempfile.mkdtemp(prefix="rcq-release-"))
    try:
        started = time.monotonic()
        release = materialise(PREVIOUS_RELEASE, directory / PREVIOUS_RELEASE_NAME, PREVIOUS_RELEASE_NAME)
        log.info("release %s (%s) made runnable in %.2f s", release.name, release.commit, time.monotonic() - started)
        yield release
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def previous_cluster(previous_release: Release) -> Iterator[LocalCluster]:
    with LocalCluster(3, release=previous_release) as cluster:
        yield cluster
