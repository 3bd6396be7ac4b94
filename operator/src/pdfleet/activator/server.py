"""The activator's I/O: a reverse proxy in front of a service's router that holds requests
while the service is at zero and forwards them in arrival order once it is up.

Where it fits: `pdfleet activator` (pdfleet.cli) runs one `Activator` for one InferenceService;
hold.py decides, proxying.py says what passes and what the activator answers itself, and this
module does the waiting: it listens, polls the router's `GET /readiness` (200 once it has a
healthy prefill/decode pair, docs/design/scale-to-zero.md), forwards and streams.

A poll can be up to `poll_idle_s` old: when the last pair leaves between two polls, a request
is forwarded to a router that answers `503 No available workers` at once. So a 503 from the
router is checked before any of it goes to the client: /readiness is asked again, and if it
says no, the request is held again in its place in the arrival order (`HoldQueue.rehold`) and
sent again once the router is ready; if it says yes, the 503 was the router's answer and the
client gets it unchanged.

It never calls the API server and holds no credentials (it faces clients). The operator wakes
the service: on each autoscaler pass it reads every activator pod's `/metrics`, and
`pdfleet_activator_requests_held` > 0 is a wake; `_requests_in_flight` 0 with
`_last_activity_timestamp_seconds` older than idleAfter is idleness.

`/healthz` and `/metrics` are the activator's own paths; the client API (pdfleet.clientpaths:
`/v1/*` and the router's probes) is the router's, and anything else, the router's admin API
above all, is answered 404 here and never forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from yarl import URL

from pdfleet.activator import proxying
from pdfleet.activator.hold import Activity, HoldQueue, Ticket, Verdict
from pdfleet.clientpaths import is_client_path

log = logging.getLogger(__name__)

OWN_PATHS = ("/healthz", "/metrics")


@dataclass(frozen=True)
class Settings:
    upstream: str
    """The router Service's base URL, e.g. http://svc-router.ns:8000."""
    max_wait_s: float = 300.0
    service: str = ""
    """NAMESPACE/NAME of the InferenceService, for the 503's message and the logs."""
    retry_after_s: float = 30.0
    poll_held_s: float = 0.5
    """/readiness is polled this often while anything is held (the pair may come any time)..."""
    poll_idle_s: float = 2.0
    """...and this often otherwise (a stale "ready" sends a request to a router at zero)."""
    readiness_timeout_s: float = 1.0
    connect_timeout_s: float = 5.0
    release_step_s: float = 0.25
    """The longest a released request holds up the next one while it connects."""
    max_body_bytes: int = 256 * 1024 * 1024
    shutdown_timeout_s: float = 3600.0
    """In-flight streams finish on SIGTERM; the pod's grace period is the real bound."""


class _Metrics:
    """The activator's series, in a registry of its own (one activator per process; tests run
    several at once)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(f"pdfleet_activator_{name}", doc, registry=registry)

        self.requests = counter("requests_total", "Requests received for the router.")
        self.held = counter("held_total", "Requests held on arrival: the router had no pair.")
        self.reheld = counter(
            "rehold_total",
            "Forwarded requests held again: the router answered 503 and its /readiness said no "
            "pair (the last one left between two polls).",
        )
        self.expired = counter("expired_total", "Held requests answered 503 after maxWait.")
        self.forwarded = counter(
            "forwarded_total",
            "Requests the router answered (any status); not the 503s after which one was re-held.",
        )
        self.refused = counter(
            "refused_total",
            "Requests for a path that is not the client API (the router's admin API), "
            "answered 404 and never forwarded.",
        )
        self.upstream_errors = counter(
            "upstream_errors_total",
            "Forwarded requests the router did not answer (502), or whose answer broke off.",
        )
        self.gauges = {
            name: Gauge(f"pdfleet_activator_{name}", doc, registry=registry)
            for name, doc in (
                ("requests_held", "Requests held now: while > 0, the operator wakes the service."),
                (
                    "oldest_held_timestamp_seconds",
                    "Unix time the oldest held request arrived; 0 when nothing is held.",
                ),
                (
                    "requests_in_flight",
                    "Requests received and not yet answered in full, held included.",
                ),
                ("upstream_ready", "1 while the router's /readiness last said 200."),
                (
                    "last_activity_timestamp_seconds",
                    "Unix time a request last arrived or finished (the process start before "
                    "any): with in_flight 0, the service is idle since then.",
                ),
            )
        }


class Activator:
    """One service's activator: `app()` is the aiohttp application to serve."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._upstream = settings.upstream.rstrip("/")
        self._clock = clock
        self._wall_clock = wall_clock
        self.registry = registry or CollectorRegistry()
        self._metrics = _Metrics(self.registry)
        self.queue = HoldQueue(settings.max_wait_s)
        self.activity = Activity(last_s=wall_clock())
        self.ready = False
        self._waiting: dict[int, asyncio.Future[Verdict]] = {}
        self._held_since: dict[int, float] = {}
        """Unix time each held request arrived, by ticket (the queue's clock is monotonic)."""
        self._on_way: dict[int, asyncio.Event] = {}
        self._poll_now = asyncio.Event()
        self._dispatch_now = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        gauges = self._metrics.gauges
        gauges["requests_held"].set_function(lambda: self.queue.held)
        gauges["oldest_held_timestamp_seconds"].set_function(self._oldest_held_s)
        gauges["requests_in_flight"].set_function(lambda: self.activity.in_flight)
        gauges["upstream_ready"].set_function(lambda: int(self.ready))
        gauges["last_activity_timestamp_seconds"].set_function(lambda: self.activity.last_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_route("*", "/healthz", self._healthz)
        app.router.add_route("*", "/metrics", self._metrics_page)
        app.router.add_route("*", "/{path:.*}", self._proxy)
        app.cleanup_ctx.append(self._running)
        return app

    async def _running(self, _: web.Application) -> AsyncIterator[None]:
        """The client for the router and the two background loops, for the app's lifetime."""
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(_headers_sent)
        self._session = aiohttp.ClientSession(
            # No pool limit: every stream holds a connection for its whole length.
            connector=aiohttp.TCPConnector(limit=0),
            # No total or read timeout: a non-streamed completion can take minutes.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout_s),
            # The body passes byte for byte; the client's own headers, and none added.
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            # A shared jar would hand one client's cookies to the next.
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=[trace],
        )
        await self._poll_once()
        tasks = [
            asyncio.create_task(self._poll_readiness(), name="activator-readiness"),
            asyncio.create_task(self._dispatch(), name="activator-dispatch"),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._session.close()

    # The activator's own pages.

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        _own_method(request)
        return web.Response(text="ok\n")

    async def _metrics_page(self, request: web.Request) -> web.StreamResponse:
        _own_method(request)
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    # Every other path: the router's.

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        if not is_client_path(request.raw_path):
            # before any count or hold: a probe of the admin API neither wakes the service
            # nor keeps it awake
            self._metrics.refused.inc()
            return self._answer(proxying.not_client_path(request.path))
        self._metrics.requests.inc()
        arrived = self._wall_clock()
        self.activity.arrived(arrived)
        try:
            ticket, now = self.queue.arrive(ready=self.ready, now_s=self._clock())
            if now is Verdict.HOLD:
                self._metrics.held.inc()
            while True:
                on_sent: Callable[[], None] | None = None
                if now is Verdict.HOLD:
                    if await self._wait_turn(request, ticket, arrived) is Verdict.EXPIRE:
                        return self._answer(
                            proxying.expired(
                                service=self.settings.service,
                                max_wait_s=self.settings.max_wait_s,
                                retry_after_s=self.settings.retry_after_s,
                            )
                        )
                    on_sent = functools.partial(self._off_queue, ticket)
                upstream = await self._send(request, await request.read(), on_sent)
                if isinstance(upstream, proxying.Answer):
                    return self._answer(upstream)
                try:
                    if not await self._turned_away(request, upstream):
                        self._metrics.forwarded.inc()
                        return await self._stream(request, upstream)
                finally:
                    # Read to the end, the connection is back in the pool already and this does
                    # nothing; otherwise (the client left, the stream broke, the 503 that is
                    # dropped) it drops the connection, and the router aborts the request.
                    upstream.close()
                # Back in its place, and `_wait_turn` (no await before it) waits for its turn.
                self.queue.rehold(ticket)
                self._metrics.reheld.inc()
                now = Verdict.HOLD
        finally:
            self.activity.finished(self._wall_clock())

    async def _wait_turn(self, request: web.Request, ticket: Ticket, arrived: float) -> Verdict:
        """Wait, held under `ticket`, for FORWARD (its turn) or EXPIRE (maxWait). The waiter is
        in place before the first await: the dispatcher may release the ticket on its next turn.
        The body comes in meanwhile (read once: aiohttp keeps it for a request sent again)."""
        waiter = self._hold(ticket, arrived)
        try:
            await request.read()
            return await waiter
        except BaseException:  # the client left (aiohttp cancels its handler), or its body
            # broke off or was too large: out of the queue, and the next goes
            self._off_queue(ticket)
            raise
        finally:
            self._waiting.pop(ticket.seq, None)
            self._held_since.pop(ticket.seq, None)

    def _hold(self, ticket: Ticket, arrived: float) -> asyncio.Future[Verdict]:
        waiter: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiting[ticket.seq] = waiter
        self._held_since[ticket.seq] = arrived
        if self.queue.held == 1:
            log.info("holding requests: the router at %s has no ready pair", self._upstream)
            self._poll_now.set()  # e.g. just started: the router may be ready already
        self._dispatch_now.set()
        return waiter

    def _oldest_held_s(self) -> float:
        """Unix time the oldest held request arrived; 0 when nothing is held."""
        oldest = self.queue.oldest()
        return 0.0 if oldest is None else self._held_since.get(oldest.seq, 0.0)

    async def _send(
        self, request: web.Request, body: bytes, on_sent: Callable[[], None] | None
    ) -> aiohttp.ClientResponse | proxying.Answer:
        """Send the request on: the router's response, its headers in and its body to be read,
        or the 502 when it did not answer. `on_sent`: called once the request has its connection
        to the router (or failed)."""
        url = URL(self._upstream + request.raw_path, encoded=True)
        try:
            return await self._require_session().request(
                request.method,
                url,
                headers=proxying.request_headers(request.headers.items()),
                data=body or None,
                allow_redirects=False,
                trace_request_ctx=on_sent,
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            self._metrics.upstream_errors.inc()
            log.warning("%s %s: the router did not answer: %r", request.method, url.path, error)
            return proxying.upstream_failed(upstream=self._upstream, error=_describe(error))
        finally:
            if on_sent is not None:
                on_sent()

    async def _turned_away(self, request: web.Request, upstream: aiohttp.ClientResponse) -> bool:
        """Whether the router turned the request away for want of a pair: its 503, and a
        /readiness asked at once says no. Nothing has gone to the client yet and the body is
        in hand, so the request can wait for the pair and go again."""
        if not proxying.recheck(upstream.status):
            return False
        ready = await self._probe()
        self._note_ready(ready)
        if not proxying.rehold(status=upstream.status, ready=ready):
            return False
        log.info("%s %s: the router answered %d and has no ready pair: held again",
                 request.method, request.path, upstream.status)  # fmt: skip
        return True

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=proxying.response_headers(upstream.headers.items()),
        )
        await response.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()
            except (aiohttp.ClientError, TimeoutError) as error:
                self._metrics.upstream_errors.inc()
                log.warning("%s %s: the router's answer broke off: %r", request.method,
                            request.path, error)  # fmt: skip
                # The status is out already: cut the connection, as the router itself does when
                # a worker dies mid-stream, so that the client cannot take the answer as whole.
                if request.transport is not None:
                    request.transport.close()
                return response
            if not chunk:
                break
            await response.write(chunk)
        await response.write_eof()
        return response

    def _answer(self, answer: proxying.Answer) -> web.Response:
        return web.Response(status=answer.status, headers=answer.headers, body=answer.body)

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the activator's app is not running")
        return self._session

    # The dispatcher: releases held requests in arrival order, expires the overdue ones.

    async def _dispatch(self) -> None:
        while True:
            now = self._clock()
            step = self.queue.step(ready=self.ready, now_s=now)
            for ticket in step.expired:
                self._metrics.expired.inc()
                self._settle(ticket, Verdict.EXPIRE)
            if step.expired:
                log.warning("%d held request(s) answered 503: no pair within maxWait %gs",
                            len(step.expired), self.settings.max_wait_s)  # fmt: skip
            if step.release is not None:
                await self._release(step.release)
                continue
            timeout = None
            if self.queue.held:
                deadline = self.queue.next_deadline_s()
                until_deadline = self.settings.poll_held_s if deadline is None else deadline - now
                timeout = max(0.0, min(until_deadline, self.settings.poll_held_s))
            await _wait(self._dispatch_now, timeout)

    async def _release(self, ticket: Ticket) -> None:
        """Let one held request go, and the next only once this one has its connection to the
        router and is being written (or after `release_step_s`): they reach it in order."""
        waiter = self._waiting.get(ticket.seq)
        if waiter is None or waiter.done():  # its client left in the meantime
            self.queue.sent(ticket)
            return
        on_way = self._on_way[ticket.seq] = asyncio.Event()
        waiter.set_result(Verdict.FORWARD)
        with contextlib.suppress(TimeoutError):  # asyncio.timeout: see _wait
            async with asyncio.timeout(self.settings.release_step_s):
                await on_way.wait()
        self._on_way.pop(ticket.seq, None)
        self.queue.sent(ticket)

    def _off_queue(self, ticket: Ticket) -> None:
        """A held request is on its way to the router, or its client left: the next may go."""
        self.queue.leave(ticket)
        if (on_way := self._on_way.get(ticket.seq)) is not None:
            on_way.set()
        self._dispatch_now.set()

    def _settle(self, ticket: Ticket, outcome: Verdict) -> None:
        waiter = self._waiting.get(ticket.seq)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)

    # The router's readiness.

    async def _poll_readiness(self) -> None:
        while True:
            interval = self.settings.poll_held_s if self.queue.busy else self.settings.poll_idle_s
            await _wait(self._poll_now, interval)
            await self._poll_once()

    async def _poll_once(self) -> None:
        self._note_ready(await self._probe())

    def _note_ready(self, ready: bool) -> None:
        if ready != self.ready:
            log.info("the router at %s is %s", self._upstream, "ready" if ready else "not ready")
            self.ready = ready
            self._dispatch_now.set()

    async def _probe(self) -> bool:
        """Whether the router has a ready pair; a refused connection or a timeout is "no"."""
        try:
            async with self._require_session().get(
                self._upstream + "/readiness",
                timeout=aiohttp.ClientTimeout(total=self.settings.readiness_timeout_s),
            ) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


async def _headers_sent(
    _: aiohttp.ClientSession,
    context: SimpleNamespace,
    __: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    """A released request has its connection and is being written: let the next one go."""
    on_sent = context.trace_request_ctx
    if callable(on_sent):
        on_sent()


def _own_method(request: web.Request) -> None:
    if request.method not in ("GET", "HEAD"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out connecting"
    return str(error) or type(error).__name__


async def _wait(event: asyncio.Event, within_s: float | None) -> None:
    """Until `event` is set (then clear it: one wake-up per batch of kicks) or `within_s`.
    `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` drops a cancel that comes in
    the turn its awaitable finishes (the shutdown cancels the dispatcher as a cancelled held
    request kicks it), and the loops that wait here would never stop."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            await event.wait()
    event.clear()


async def serve(activator: Activator, host: str, port: int) -> web.AppRunner:
    """Start serving; `runner.addresses` says where (port 0: an ephemeral one)."""
    runner = web.AppRunner(
        activator.app(),
        # A client that leaves cancels its handler: a held request leaves the queue, and a
        # forwarded one's connection to the router closes, which aborts it there too.
        handler_cancellation=True,
        shutdown_timeout=activator.settings.shutdown_timeout_s,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def run(activator: Activator, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then let what is in flight finish."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = await serve(activator, host, port)
    log.info("activator for %s on %s:%d, router %s, maxWait %gs", activator.settings.service,
             host, port, activator.settings.upstream, activator.settings.max_wait_s)  # fmt: skip
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
