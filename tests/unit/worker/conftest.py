"""Simulators run in process for the worker tests: `sims.start(argv)` builds what
`pdfleet-sim ARGV` would run, steps its engine on the test's event loop and answers through
ASGI, with no sockets; everything started is stopped when the test ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest

from pdfleet_worker.sim.engine import KvPuller
from pdfleet_worker.sim.server import Sim, build_parser, build_sim


class InProcess:
    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self._stack = stack

    async def start(
        self, argv: Sequence[str], puller: KvPuller | None = None
    ) -> tuple[Sim, httpx.AsyncClient]:
        sim = build_sim(build_parser().parse_args(argv), puller)
        stepping = asyncio.create_task(sim.engine.run())
        self._stack.push_async_callback(_cancel, stepping)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=sim.app()), base_url="http://sim"
        )
        await self._stack.enter_async_context(client)
        return sim, client


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def sims() -> AsyncIterator[InProcess]:
    async with contextlib.AsyncExitStack() as stack:
        yield InProcess(stack)
