"""A stand-in router and a running activator in front of it, both on 127.0.0.1 (ephemeral
ports), for the activator's server tests (the `fleet` fixture, conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from pdfleet.activator import server

SSE_CAP_S = 2.0  # how long the router's stream waits for the client to read its first event


NO_WORKERS = "No available workers: 1 prefill, 0 decode"


class Router:
    """What the activator needs of vllm-router: `/readiness` (200 or 503, as `ready` says),
    an echo of every request (`503 No available workers` at once while not ready, as the real
    one answers with no pair), an SSE stream that waits for its reader after one event, and a
    503 of its own while ready (`/v1/overloaded`)."""

    def __init__(self) -> None:
        self.ready = False
        self.seen: list[str] = []
        """The X-Seq header of every request the router got, in the order it got them."""
        self.readiness_asked = 0
        self.leave_at_next_request = False
        """The last pair leaves as the next request comes in: it gets the 503, and /readiness
        says 503 from then on (a drain to zero between two of the activator's polls)."""
        self.gate: asyncio.Event | None = None
        """When set to an Event, the echo waits for it after recording the request, then answers
        as `ready` says at that moment."""
        self.read_first = asyncio.Event()
        self.stream_finished = False
        self.waited_for_reader: bool | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readiness", self._readiness)
        app.router.add_post("/v1/stream", self._stream)
        app.router.add_post("/v1/broken", self._broken)
        app.router.add_post("/v1/overloaded", self._overloaded)
        app.router.add_route("*", "/{path:.*}", self._echo)
        return app

    async def _readiness(self, _: web.Request) -> web.Response:
        self.readiness_asked += 1
        if self.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not_ready"}, status=503)

    async def _echo(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("X-Seq", ""))
        body = await request.read()
        if self.leave_at_next_request:
            self.leave_at_next_request = False
            self.ready = False
        if self.gate is not None:
            await self.gate.wait()
        if not self.ready:
            return web.Response(status=503, text=NO_WORKERS)
        return web.json_response(
            {
                "method": request.method,
                "path_qs": request.raw_path,
                "headers": [[k, v] for k, v in request.headers.items()],
                "body": body.decode(),
            },
            headers={"X-From-Router": "1", "Set-Cookie": "affinity=a"},
        )

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.headers.get("X-Seq", ""))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        try:
            await asyncio.wait_for(self.read_first.wait(), SSE_CAP_S)
            self.waited_for_reader = True
        except TimeoutError:
            self.waited_for_reader = False
        await response.write(b"data: 2\n\n")
        await response.write(b"data: [DONE]\n\n")
        self.stream_finished = True
        await response.write_eof()
        return response

    async def _overloaded(self, request: web.Request) -> web.Response:
        """A 503 of the router's own while it has its pair (e.g. every worker at capacity)."""
        self.seen.append(request.headers.get("X-Seq", ""))
        return web.json_response(
            {"error": "overloaded"}, status=503, headers={"Retry-After": "2", "X-From-Router": "1"}
        )

    async def _broken(self, request: web.Request) -> web.StreamResponse:
        """A worker killed mid-stream: one event, then the connection drops."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        assert request.transport is not None
        request.transport.abort()
        return response


class Fleet:
    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self._stack = stack
        self.router = Router()
        self.router_server: TestServer | None = None

    async def start_router(self) -> str:
        self.router_server = TestServer(self.router.app(), host="127.0.0.1")
        await self.router_server.start_server()
        self._stack.push_async_callback(self.router_server.close)
        return str(self.router_server.make_url("")).rstrip("/")

    async def start_activator(self, upstream: str, **settings: Any) -> tuple[server.Activator, str]:
        """An activator in front of `upstream`, with quick polls unless told otherwise."""
        options: dict[str, Any] = {"poll_held_s": 0.02, "poll_idle_s": 0.05, **settings}
        wall_clock = options.pop("wall_clock", time.time)
        clock = options.pop("clock", time.monotonic)
        activator = server.Activator(
            server.Settings(upstream=upstream, service="ns/svc", **options),
            clock=clock,
            wall_clock=wall_clock,
        )
        runner = await server.serve(activator, "127.0.0.1", 0)
        self._stack.push_async_callback(runner.cleanup)
        host, port = runner.addresses[0][:2]
        return activator, f"http://{host}:{port}"


async def until(condition: Callable[[], bool | Awaitable[bool]], within_s: float = 5.0) -> None:
    """Wait for `condition`, checking every few milliseconds; fail after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)
