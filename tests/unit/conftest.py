"""Fixtures shared by the unit tests.

``fake``: a recording fake node serving HTTP (:class:`tests.helpers.fakes.FakeNode`): what the
client and the ``rcq`` command send, exactly.

Must not import: a test module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.helpers.fakes import FakeNode, serving_fake


@pytest.fixture
async def fake() -> AsyncIterator[FakeNode]:
    async with serving_fake() as node:
        yield node
