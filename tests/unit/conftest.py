"""Fixtures shared by the unit tests.

``fake``: a recording fake node serving HTTP (:class:`tests.helpers.fakes.FakeNode`): what the
client and the ``rcq`` command send, exactly. ``client``: an RcqClient of ``fake`` that retries
for 2 s (a module whose client is of another node defines its own). ``wire``, a session that
records what it sends, is the whole suite's (tests/conftest.py).

Must not import: a test module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rcq.client import RcqClient
from tests.helpers.fakes import FakeNode, serving_fake


@pytest.fixture
async def fake() -> AsyncIterator[FakeNode]:
    async with serving_fake() as node:
        yield node


@pytest.fixture
async def client(fake: FakeNode) -> AsyncIterator[RcqClient]:
    async with RcqClient(fake.url, retry_timeout_s=2) as rcq_client:
        yield rcq_client
