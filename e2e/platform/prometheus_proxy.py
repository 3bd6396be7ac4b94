"""A loopback proxy in front of a real Prometheus that, when switched, corrupts its answers.

Where it fits: the fault suite (e2e/scenarios/faults.py) points an autoscaled service's
`spec.autoscaling.prometheus.url` at this proxy and switches it while the operator reads its
windows, to check that the autoscaler holds and says why. Everything is forwarded to the real
Prometheus (e2e/platform/prometheus.py); in a corrupting mode the JSON of every query answer
(`/api/v1/query`, `/api/v1/query_range`) is rewritten before it is passed on:

* ``nan``: every sample's value is ``"NaN"``: the series are there, their values are not
  numbers, as with an exporter or recording rule gone wrong. The operator reports
  `MetricsNaN`.
* ``stale``: every sample's time is moved `age_s` into the past: answers computed long ago,
  as a caching front or a Prometheus whose clock stopped hands out. The operator dates a
  window by its oldest answer and reports `MetricsStale` past its maximum age (120 s).
* ``empty``: every result is empty: the series went stale in Prometheus (no samples in the
  window, e.g. the scrapes stopped). The operator reports `MetricsMissing`.

While the real Prometheus is down the proxy answers ``502 Bad Gateway``, as an HTTP front
does (the operator reports `MetricsMissing` for that too).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any, Literal

import aiohttp
from aiohttp import web

from e2e.platform.fault_proxy import forwarded_headers, serve_on_loopback

Mode = Literal["pass", "nan", "stale", "empty"]
MODES: tuple[Mode, ...] = ("pass", "nan", "stale", "empty")
QUERY_PATHS = ("/api/v1/query", "/api/v1/query_range")


def _samples(series: dict[str, Any]) -> list[list[Any]]:
    """The [time, value] pairs of one series of a vector (`value`) or a matrix (`values`)."""
    if isinstance(series.get("value"), list):
        return [series["value"]]
    values = series.get("values")
    return [v for v in values if isinstance(v, list)] if isinstance(values, list) else []


def rewrite(body: dict[str, Any], mode: Mode, age_s: float) -> dict[str, Any]:
    """Pure: a query answer as `mode` corrupts it (a copy; `body` is left alone)."""
    out: dict[str, Any] = json.loads(json.dumps(body))
    data = out.get("data")
    if mode == "pass" or not isinstance(data, dict) or not isinstance(data.get("result"), list):
        return out
    if mode == "empty":
        data["result"] = []
        return out
    for series in data["result"]:
        for sample in _samples(series) if isinstance(series, dict) else ():
            if len(sample) != 2:
                continue
            if mode == "nan":
                sample[1] = "NaN"
            else:
                sample[0] = float(sample[0]) - age_s
    return out


class PrometheusProxy:
    """The proxy, on 127.0.0.1, run on its own event loop in a thread (`running`)."""

    def __init__(self, upstream: str, age_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.age_s = age_s
        self.port = 0
        self._mode: Mode = "pass"
        self._lock = threading.Lock()
        self.rewritten = 0
        """Query answers corrupted so far."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> Mode:
        with self._lock:
            return self._mode

    def switch(self, mode: Mode) -> None:
        """From the next answer on, corrupt answers as `mode` says ("pass": not at all)."""
        with self._lock:
            self._mode = mode

    @contextlib.contextmanager
    def running(self) -> Iterator[PrometheusProxy]:
        with serve_on_loopback(self._handler, "prometheus proxy") as port:
            self.port = port
            yield self

    def _handler(self, session: aiohttp.ClientSession) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            data = await request.read()
            # Plain bodies upstream, so that answers can be rewritten.
            headers = {
                k: v for k, v in forwarded_headers(request.headers).items()
                if k.lower() != "accept-encoding"
            }  # fmt: skip
            headers["Accept-Encoding"] = "identity"
            try:
                async with session.request(
                    request.method,
                    self.upstream + request.path_qs,
                    headers=headers,
                    data=data or None,
                ) as answer:
                    body = await answer.read()
                    answered = forwarded_headers(answer.headers)
                    status = answer.status
            except aiohttp.ClientConnectionError as error:
                return web.Response(status=502, text=f"prometheus unreachable: {error}")
            mode = self.mode
            if mode != "pass" and request.path in QUERY_PATHS and status == 200:
                body = json.dumps(rewrite(json.loads(body), mode, self.age_s)).encode()
                with self._lock:
                    self.rewritten += 1
            return web.Response(status=status, body=body, headers=answered)

        return handle
