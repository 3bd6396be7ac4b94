"""The `fleet` fixture: a stand-in router and activators in front of it (fakes.py); everything
started is stopped when the test ends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.unit.activator.fakes import Fleet


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with contextlib.AsyncExitStack() as stack:
        yield Fleet(stack)
