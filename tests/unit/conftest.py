"""Fixtures shared by the unit tests.

``fake``: a recording fake node serving HTTP (:class:`tests.helpers.fakes.FakeNode`): what the
client and the ``rcq`` command send, exactly. ``wire``: an aiohttp session that records every
request it sends (:class:`tests.helpers.fakes.Wire`), for a client given ``session=``.

Must not import: a test module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.helpers.fakes import FakeNode, Wire, serving_fake


@pytest.fixture
async def fake() -> AsyncIterator[FakeNode]:
    async with serving_fake() as node:
        yield node


@pytest.fixture
async def wire() -> AsyncIterator[tuple[Wire, aiohttp.ClientSession]]:
    recorder = Wire()
    async with aiohttp.ClientSession(middlewares=[recorder]) as session:
        yield recorder, session
