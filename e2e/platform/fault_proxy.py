"""A loopback proxy in front of the kube-apiserver that answers some writes with 409 or 429.

Where it fits: the fault suite (e2e/scenarios/faults.py) points the operator at this proxy through a
kubeconfig of its own (`proxied_kubeconfig`) and checks that conflicts and throttling neither
break convergence nor make the operator crash-loop or hot-loop. Reads and watches always pass
through (streamed, so watches stay open); a write (POST, PUT, PATCH, DELETE) is refused with
the configured probability, with a Kubernetes `Status` body, and 429s carry `Retry-After`, as
API priority and fairness sends them. The proxy speaks plain HTTP on 127.0.0.1 and uses the
cluster's admin client certificate upstream. Every request is counted (`counts`), so a test can
bound how many writes the operator made.

`serve_on_loopback` (an aiohttp server on its own event loop in a thread) and
`forwarded_headers` are shared with e2e/platform/prometheus_proxy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Hop-by-hop and length headers that aiohttp sets again itself.
_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass(frozen=True)
class FaultRates:
    """Probability that a write is answered 409 Conflict, and 429 Too Many Requests."""

    conflict: float = 0.0
    throttle: float = 0.0
    retry_after_s: int = 1


def choose_fault(method: str, draw: float, rates: FaultRates) -> int | None:
    """Pure: the status to inject for a request (None: forward it). `draw` is in [0, 1)."""
    if method.upper() not in WRITE_METHODS:
        return None
    if draw < rates.conflict:
        return 409
    if draw < rates.conflict + rates.throttle:
        return 429
    return None


def status_body(code: int, method: str, path: str) -> dict[str, Any]:
    """The `Status` object the API server sends with such an answer."""
    reason, message = {
        409: ("Conflict", "the object has been modified; please apply your changes again"),
        429: ("TooManyRequests", "too many requests, please try again later"),
    }[code]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"{message} (injected on {method} {path})",
        "reason": reason,
        "code": code,
    }


def kubeconfig_upstream(kubeconfig: Path) -> tuple[str, ssl.SSLContext]:
    """The API server URL of a kubeconfig's current context and a TLS context with its
    client certificate and CA."""
    doc = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])["context"]
    cluster = next(c for c in doc["clusters"] if c["name"] == context["cluster"])["cluster"]
    user = next(u for u in doc["users"] if u["name"] == context["user"])["user"]
    tls = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
    if cluster.get("insecure-skip-tls-verify"):
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    tls.load_cert_chain(user["client-certificate"], user["client-key"])
    return str(cluster["server"]), tls


def proxied_kubeconfig(url: str, path: Path) -> Path:
    """Write a kubeconfig that reaches the API server only through the proxy at `url`."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "proxy", "cluster": {"server": url}}],
        "users": [{"name": "proxy", "user": {}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        "current-context": "proxy",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.contextmanager
def serve_on_loopback(
    make_handler: Callable[[aiohttp.ClientSession], Handler],
    name: str,
    port: int = 0,
    tls: ssl.SSLContext | None = None,
) -> Iterator[int]:
    """Serve every path with `make_handler(session)` on 127.0.0.1 from an event loop in a
    thread of its own, `session` being an aiohttp client session for the upstream (`tls`: its
    TLS context; bodies passed on as they come, undecoded); yields the port, and stops the
    server on exit."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    bound: list[int] = []
    failure: list[BaseException] = []

    async def serve() -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        connector = aiohttp.TCPConnector(ssl=tls) if tls is not None else None
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", make_handler(session))
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            bound.append(runner.addresses[0][1])
            ready.set()
            await stop.wait()
            await runner.cleanup()

    def main() -> None:
        try:
            loop.run_until_complete(serve())
        except BaseException as error:  # reported to the caller, never lost
            failure.append(error)
            ready.set()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    ready.wait(30)
    if failure or not bound:
        raise RuntimeError(f"the {name} did not start") from (failure[0] if failure else None)
    try:
        yield bound[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Pure: the end-to-end headers of a request or answer (hop-by-hop ones dropped)."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROP}


@dataclass
class FaultProxy:
    """The proxy, run on its own event loop in a thread (`running`)."""

    kubeconfig: Path
    rates: FaultRates
    seed: int = 1
    counts: Counter[str] = field(default_factory=Counter)
    """"<METHOD> <status>" -> requests, and "<METHOD> injected <status>" for refused writes."""
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def writes(self) -> int:
        """Write requests seen so far, refused or forwarded."""
        return sum(n for key, n in self.snapshot().items() if key.split()[0] in WRITE_METHODS)

    @contextlib.contextmanager
    def running(self) -> Iterator[FaultProxy]:
        upstream, tls = kubeconfig_upstream(self.kubeconfig)
        rng = random.Random(self.seed)
        with serve_on_loopback(
            lambda session: self._handler(session, upstream, rng), "fault proxy", self.port, tls
        ) as port:
            self.port = port
            yield self

    def _handler(self, session: aiohttp.ClientSession, upstream: str, rng: random.Random) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            code = choose_fault(request.method, rng.random(), self.rates)
            if code is not None:
                self.count(f"{request.method} injected {code}")
                headers = {"Retry-After": str(self.rates.retry_after_s)} if code == 429 else {}
                body = status_body(code, request.method, request.path)
                return web.json_response(body, status=code, headers=headers)
            headers = forwarded_headers(request.headers)
            data = await request.read()
            # The Python client sends some bodies without a Content-Type (the API server
            # reads them as JSON); aiohttp would label them application/octet-stream, which
            # the API server refuses (415).
            skip = () if "Content-Type" in request.headers else ("Content-Type",)
            async with session.request(
                request.method,
                upstream + request.path_qs,
                headers=headers,
                data=data or None,
                skip_auto_headers=skip,
            ) as answer:
                self.count(f"{request.method} {answer.status}")
                response = web.StreamResponse(
                    status=answer.status,
                    headers=forwarded_headers(answer.headers),
                )
                await response.prepare(request)
                # Watches are long streams of events: pass each chunk on as it comes.
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

        return handle


def injected(counts: Counter[str]) -> dict[int, int]:
    """Pure: refused writes by status code, from `FaultProxy.counts`."""
    out: dict[int, int] = {}
    for key, n in counts.items():
        parts = key.split()
        if len(parts) == 3 and parts[1] == "injected":
            out[int(parts[2])] = out.get(int(parts[2]), 0) + n
    return out


def summary(counts: Counter[str]) -> str:
    """One line for logs: the counts, sorted."""
    return json.dumps(dict(sorted(counts.items())))
