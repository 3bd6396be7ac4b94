"""pdfleet's data-plane claims against real vLLM: P/D over NIXL, the preflight, the signals
the autoscaler reads, and a decode scale-down under streaming load.

One service (1 prefill, 2 decode of vLLM's CPU build with a tiny random-weight model, the
real vllm-router in P/D mode, a real operator) serves every test; each reads what the
engines themselves record (their /metrics), the router's metrics, Prometheus and the
operator's status. The scale-down comes last in the file: it leaves one decode.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from e2e.platform.closed_loop import Load, Shape
from e2e.platform.cluster import wait_until
from e2e.platform.fleet import condition
from e2e.platform.prometheus import Prometheus
from e2e.platform.real_engine import (
    EXACT_LENGTH,
    ONE_PREFILL_TWO_DECODES,
    SERVED_MODEL,
    Pace,
    pod_urls,
    sample_sum,
    scrape,
    wait_engines_idle,
    wait_serving,
)
from e2e.platform.service import Service, wait_settled
from e2e.scenarios.differential import BY_SOURCE
from e2e.scenarios.drain_scenario import router_error_counters
from pdfleet import labels
from pdfleet.autoscale.metrics import PrometheusSource

pytestmark = pytest.mark.timeout(1200)

PREFILL, DECODE = labels.ROLE_PREFILL, labels.ROLE_DECODE


def prompt(rng: random.Random, words: int) -> str:
    """A prompt no earlier one shares a prefix with: prefix-cache hits would move tokens
    from the transfer to the cache and blur the counts."""
    return " ".join(str(rng.randint(0, 99_999)) for _ in range(words))


def send(http: httpx.Client, router: str, kind: str, stream: bool, text: str) -> int:
    """One request through the router; the prompt tokens vLLM counted for it."""
    body: dict[str, Any] = {"model": SERVED_MODEL, "max_tokens": 8, **EXACT_LENGTH}
    if kind == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": text}]
    else:
        path, body["prompt"] = "/v1/completions", text
    if not stream:
        body.pop("stream_options")
        resp = http.post(f"{router}{path}", json=body)
        assert resp.status_code == 200, resp.text
        return int(resp.json()["usage"]["prompt_tokens"])
    usage = None
    with http.stream("POST", f"{router}{path}", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    for line in lines[:-1]:
        chunk = json.loads(line[6:])
        assert "error" not in chunk, chunk
        usage = chunk.get("usage") or usage
    assert usage is not None, lines[-3:]
    return int(usage["prompt_tokens"])


def totals(urls: Mapping[str, str]) -> dict[str, float]:
    """The counters this file compares, summed over a role's engines."""
    out: dict[str, float] = {}
    for url in urls.values():
        text = scrape(url)
        for key, value in {
            "local_compute": sample_sum(text, BY_SOURCE, source="local_compute"),
            "external_kv_transfer": sample_sum(text, BY_SOURCE, source="external_kv_transfer"),
            "local_cache_hit": sample_sum(text, BY_SOURCE, source="local_cache_hit"),
            "nixl_transfers": sample_sum(text, "vllm:nixl_xfer_time_seconds_count"),
            "nixl_failed": sample_sum(text, "vllm:nixl_num_failed_transfers_total"),
            "kv_expired": sample_sum(text, "vllm:nixl_num_kv_expired_reqs_total"),
            "success": sample_sum(text, "vllm:request_success_total"),
            "aborted": sample_sum(text, "vllm:request_success_total", finished_reason="abort"),
            "errors": sample_sum(text, "vllm:request_success_total", finished_reason="error"),
        }.items():
            out[key] = out.get(key, 0.0) + value
    return out


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def test_every_request_goes_prefill_then_decode_with_its_kv_over_nixl(
    service: Service, pace: Pace
) -> None:
    wait_serving(service)
    prefills, decodes = pod_urls(service, PREFILL), pod_urls(service, DECODE)
    wait_engines_idle({**prefills, **decodes}, pace.timeout_s())
    p0, d0 = totals(prefills), totals(decodes)
    rng = random.Random(7)
    sent, prompt_tokens = 0, 0
    with httpx.Client(timeout=pace.timeout_s()) as http:
        for kind in ("completions", "chat"):
            for stream in (False, True):
                for _ in range(5):
                    prompt_tokens += send(http, service.router(), kind, stream, prompt(rng, 60))
                    sent += 1
    wait_engines_idle({**prefills, **decodes}, pace.timeout_s())
    p, d = delta(totals(prefills), p0), delta(totals(decodes), d0)
    print(json.dumps({"sent": sent, "prompt_tokens": prompt_tokens, "prefill": p, "decode": d}))
    # The prefill computed every prompt and answered once per request (max_tokens 1).
    assert p["local_compute"] == prompt_tokens, p
    assert p["success"] == sent, p
    # Each decode loaded every prompt token from a prefill over NIXL and computed none.
    assert d["external_kv_transfer"] == prompt_tokens, d
    assert d["local_compute"] == 0, d
    assert d["success"] == sent, d
    assert d["nixl_transfers"] >= sent, d  # at least one READ per request
    assert d["nixl_failed"] == 0 and p["kv_expired"] == 0, (p, d)
    assert d["aborted"] == d["errors"] == 0, d


def test_the_kv_preflight_passes_between_real_engines(service: Service) -> None:
    # A run that could not measure is retried (preflight.plan.RETRY_S); the verdict that
    # counts is the first one that measured.
    try:
        status = wait_until(lambda: _kv_status(service), 300, "a measured KV transport verdict")
    except TimeoutError as err:
        raise AssertionError(f"{err}: {_status(service).get('kvTransport')}") from err
    print(json.dumps(status))
    ready = _condition(service, "KVTransportReady")
    assert ready.get("status") == "True", ready
    assert status.get("transport"), status


def _kv_status(service: Service) -> dict[str, Any] | None:
    status = _status(service).get("kvTransport") or {}
    return status if status.get("measuredTime") and not status.get("error") else None


def _status(service: Service) -> dict[str, Any]:
    obj = service.custom.get_namespaced_custom_object(
        labels.GROUP, labels.VERSION, service.namespace, labels.PLURAL, service.name
    )
    return dict(obj.get("status") or {})


def _condition(service: Service, type_: str) -> dict[str, Any]:
    return condition(_status(service), type_) or {}


#: The signals the policy reads for each role (autoscale/policy.py).
PREFILL_SIGNALS = (
    "ttft_s",
    "request_rate",
    "prompt_tokens_rate",
    "prompt_tokens_rate_peak",
    "prompt_arrivals_peak",
    "num_requests_waiting",
    "waiting_growth",
    "kv_cache_usage",
    "queue_time_s",
)
DECODE_SIGNALS = (
    "ttft_s",
    "itl_s",
    "tpot_s",
    "request_rate",
    "generation_tokens_rate",
    "num_requests_waiting",
    "kv_cache_usage",
)


def test_the_autoscaler_reads_every_signal_from_prometheus_scraping_real_engines(
    service: Service, pace: Pace, prometheus: Prometheus
) -> None:
    wait_serving(service)
    window_s = 60.0
    with Load(
        service.router(), clients=3, shape=Shape(prompt=(50, 300), output=(16, 64)),
        model=SERVED_MODEL, extra=EXACT_LENGTH, timeout_s=pace.timeout_s(),
    ) as load:  # fmt: skip
        time.sleep(45)
    assert load.count("ok") == len(load.results) > 0, [r for r in load.results if r.outcome != "ok"]
    source = PrometheusSource(prometheus.url)
    window = source.window(service.namespace, service.name, time.time(), 90, window_s)
    print(window)
    assert window.prefill is not None and window.decode is not None, window
    for role, metrics, names in (
        (PREFILL, window.prefill, PREFILL_SIGNALS),
        (DECODE, window.decode, DECODE_SIGNALS),
    ):
        missing = [n for n in names if not math.isfinite(getattr(metrics, n))]
        assert not missing, (role, missing, metrics)
    assert window.prefill.request_rate > 0 and window.decode.generation_tokens_rate > 0, window
    assert window.ttft_buckets and window.tpot_buckets, window
    # The operator's own reads of the same Prometheus (its autoscaler step) succeed too.
    available = wait_until(
        lambda: (c := _condition(service, "MetricsAvailable")).get("status") == "True" and c,
        60,
        "MetricsAvailable=True",
    )
    print(available)


def test_a_decode_scale_down_under_streaming_load_loses_nothing(
    service: Service, pace: Pace
) -> None:
    """2 -> 1 decode while clients stream through the router: every stream completes with
    every token, the router counts no error, no engine aborts, fails or expires a KV pull,
    and the operator drained the pod rather than forcing it."""
    service.scale(ONE_PREFILL_TWO_DECODES)
    wait_settled(service, ONE_PREFILL_TWO_DECODES, 600)
    prefills = pod_urls(service, PREFILL)
    survivor = pod_urls(service, DECODE)
    p0 = totals(prefills)
    errors0 = router_error_counters(service.router_ip())
    # Streams of several seconds at a CPU engine's pace under load, short enough that the
    # drain ends within its 60 s timeout.
    # Two clients: on two shared cores more load makes a decode read some KV after the
    # prefill's 30 s lease (counted below as the fault it is).
    shape = Shape(prompt=(50, 300), output=(40, 80))
    with Load(
        service.router(), clients=2, shape=shape, model=SERVED_MODEL, extra=EXACT_LENGTH,
        timeout_s=pace.timeout_s(),
    ) as load:  # fmt: skip
        wait_until(lambda: len(load.results) >= 2, pace.timeout_s(120), "streams flowing")
        service.scale({DECODE: 1})
        wait_settled(service, {PREFILL: 1, DECODE: 1}, 300)
        time.sleep(5)  # streams that started on the survivor during the drain end too
    results = load.snapshot()
    bad = [r for r in results if r.outcome != "ok"]
    errors = {
        k: v - errors0.get(k, 0.0) for k, v in router_error_counters(service.router_ip()).items()
    }
    left = pod_urls(service, DECODE)
    d = totals({k: v for k, v in survivor.items() if k in left})
    p = delta(totals(prefills), p0)
    ended = wait_until(lambda: service.events(("Drained", "DrainForced")), 60, "the drain's Event")
    drained = [e.message for e in ended if e.reason == "Drained"]
    forced = [e.message for e in ended if e.reason == "DrainForced"]
    figures = {"results": len(results), "bad": len(bad), "router_errors": errors}
    print(json.dumps({**figures, "prefill": p, "decode": d, "drained": drained, "forced": forced}))
    assert len(results) >= 4, len(results)
    assert not bad, bad[:5]
    assert not any(errors.values()), errors
    assert p["kv_expired"] == 0 and d["nixl_failed"] == 0 and d["aborted"] == d["errors"] == 0
    assert drained and not forced, (drained, forced)
