"""The drain's router and worker reads against malformed and hostile answers.

A drain removes a worker only when every reading says it is idle, so an answer that cannot be
trusted (an HTML error page, a truncated body, JSON of the wrong shape, NaN, infinite or
negative gauges) must read as "unknown", never as "idle", and never raise anything but the
RouterError the controller handles. The HTTP client is real; only its transport is replaced.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from pdfleet import httpclient
from pdfleet.drain.io import (
    RouterError,
    RouterFleet,
    parse_held,
    parse_workers,
    read_engine,
    read_loads,
    router_replicas,
)

WORKER = "http://10.244.1.5:8000"
HTML_502 = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


def _gauges(value: str) -> str:
    return (
        "# TYPE vllm_router_pd_active_decode_requests gauge\n"
        f'vllm_router_pd_active_decode_requests{{worker="{WORKER}"}} {value}\n'
    )


def _fleet(handler: Callable[[httpx.Request], httpx.Response]) -> RouterFleet:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return RouterFleet(router_replicas(["10.244.0.9"], 8000, 29000), client=client)


def _answer(status: int, body: str, path: str) -> Callable[[httpx.Request], httpx.Response]:
    """Answers `path` with (status, body); a well-formed, busy router and worker elsewhere."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == path:
            if body == "TRUNCATED":
                raise httpx.RemoteProtocolError("peer closed connection", request=request)
            return httpx.Response(status, text=body)
        if request.url.path == "/workers":
            return httpx.Response(200, json={"workers": [{"url": WORKER}]})
        if request.url.port == 29000:
            return httpx.Response(200, text=_gauges("1"))
        return httpx.Response(200, text="vllm:num_requests_running 1\n")

    return handler


BAD_WORKER_LISTS = {
    "html-error-page": (502, HTML_502),
    "html-with-200": (200, HTML_502),
    "truncated": (200, "TRUNCATED"),
    "truncated-json": (200, '{"workers": [{"url": "http://'),
    "json-list": (200, "[1, 2]"),
    "workers-not-a-list": (200, '{"workers": "all"}'),
    "url-not-a-string": (200, '{"workers": [{"url": 5}]}'),
    "entry-not-an-object": (200, '{"workers": ["http://x"]}'),
    "no-workers-key": (200, '{"total": 0}'),
    "empty-body": (200, ""),
}


@pytest.mark.parametrize("status,body", BAD_WORKER_LISTS.values(), ids=BAD_WORKER_LISTS.keys())
def test_a_bad_worker_list_is_an_incomplete_answer_and_a_failed_removal(
    status: int, body: str
) -> None:
    fleet = _fleet(_answer(status, body, "/workers"))
    assert fleet.registered() == (set(), False)
    with pytest.raises(RouterError):
        fleet.deregister(WORKER)
    load = read_loads(fleet, {"p-1": (WORKER, "decode")})["p-1"]
    assert load.registered is None and not load.idle("decode")


BAD_GAUGE_PAGES = {
    "html-error-page": (502, HTML_502),
    "html-with-200": (200, HTML_502),
    "truncated": (200, "TRUNCATED"),
    "nan": (200, _gauges("NaN")),
    "inf": (200, _gauges("+Inf")),
    "negative": (200, _gauges("-3")),
    "not-a-number": (200, _gauges("many")),
    "garbage": (200, "\x00\x01 not prometheus {"),
}


@pytest.mark.parametrize("status,body", BAD_GAUGE_PAGES.values(), ids=BAD_GAUGE_PAGES.keys())
def test_a_bad_gauge_page_makes_the_router_count_unknown_not_idle(status: int, body: str) -> None:
    fleet = _fleet(_answer(status, body, "/metrics"))
    pages, complete = fleet.gauges()
    assert (pages, complete) == ([], False)
    load = read_loads(fleet, {"d-1": (WORKER, "decode")})["d-1"]
    assert load.router_in_flight is None and not load.idle("decode")


def test_a_huge_gauge_is_a_busy_worker() -> None:
    fleet = _fleet(_answer(200, _gauges("1e308"), "/metrics"))
    load = read_loads(fleet, {"d-1": (WORKER, "decode")})["d-1"]
    assert load.router_in_flight == 1e308 and not load.idle("decode")


@pytest.mark.parametrize(
    "status,body",
    [(503, HTML_502), (200, "TRUNCATED"), (200, "vllm:num_requests_running NaN\n"),
     (200, "vllm:num_requests_running -1\n"), (200, "<html>")],
)  # fmt: skip
def test_a_bad_engine_page_is_unknown(status: int, body: str) -> None:
    client = httpx.Client(transport=httpx.MockTransport(_answer(status, body, "/metrics")))
    assert read_engine(client, WORKER, "decode") == (None, None)


def test_an_odd_value_in_a_series_the_drain_does_not_read_is_not_its_business() -> None:
    """A NaN ratio or a negative histogram sum elsewhere on a worker's page must not hold a
    drain until its timeout: only the in-flight gauges decide."""
    page = (
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        "vllm:gpu_prefix_cache_hit_rate NaN\nvllm:request_queue_time_seconds_sum -0.002\n"
    )
    client = httpx.Client(transport=httpx.MockTransport(_answer(200, page, "/metrics")))
    assert read_engine(client, WORKER, "decode") == (0.0, 0.0)


@pytest.mark.parametrize(
    "body", ['{"held_now": null}', '{"held_now": "3"}', '{"held_now": -1}', "[3]", "TRUNCATED",
             '{"held_now": true}', "<html>"],
)  # fmt: skip
def test_a_bad_held_count_falls_back_to_the_cache_gauge(body: str) -> None:
    metrics = "vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.25\n"

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics)
        return _answer(200, body, "/sim/stats")(request)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    assert read_engine(client, WORKER, "prefill") == (0.0, 0.25)


def test_parsers_accept_the_real_shapes() -> None:
    assert parse_workers({"workers": [{"url": WORKER, "is_healthy": True}], "total": 1}) == {WORKER}
    assert parse_held({"held_now": 2}) == 2.0


def test_a_fleet_closes_only_a_client_it_made() -> None:
    shared = httpx.Client(transport=httpx.MockTransport(_answer(200, "", "/none")))
    fleet = RouterFleet(router_replicas(["10.244.0.9"], 8000, 29000), client=shared)
    fleet.close()
    assert not shared.is_closed  # the operator's shared client outlives the pass
    own = RouterFleet(router_replicas(["10.244.0.9"], 8000, 29000))
    own.close()
    assert own.client.is_closed


def test_a_decode_pulling_kv_counts_once() -> None:
    """vLLM's waiting gauge already holds the requests deferred while their KV is pulled
    (loggers.py sets it to capacity + deferred); the by-reason family splits the same
    requests and is not added again."""
    page = (
        'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 3\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="deferred"} 3\n'
    )
    client = httpx.Client(transport=httpx.MockTransport(_answer(200, page, "/metrics")))
    assert read_engine(client, WORKER, "decode") == (3.0, 0.0)


def test_a_router_that_times_out_is_not_waited_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain polls every half second: a router that never answers costs one timeout per
    SILENT_FOR_S, not one per pass; it reads as unknown meanwhile, as the timeout did."""
    clock = [0.0]
    monkeypatch.setattr(httpclient, "SILENT", httpclient.SilentHosts(clock=lambda: clock[0]))
    asked: list[str] = []

    def silent_router(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if request.url.host == "10.244.0.9":
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, text="vllm:num_requests_running 0\n")

    fleet = _fleet(silent_router)
    for _ in range(3):
        load = read_loads(fleet, {"d-1": (WORKER, "decode")})["d-1"]
        assert load.registered is None and load.router_in_flight is None
        assert not load.idle("decode")
        with pytest.raises(RouterError):
            fleet.deregister(WORKER)
    router_asks = [url for url in asked if "10.244.0.9" in url]
    assert len(router_asks) == 2  # /workers and /metrics once each, at the first pass
    clock[0] += httpclient.SILENT_FOR_S
    read_loads(fleet, {"d-1": (WORKER, "decode")})
    assert len([url for url in asked if "10.244.0.9" in url]) == 4  # asked again
