"""The metrics path end to end: simulators -> a real Prometheus -> the autoscaler's PromQL.

One prefill and one decode ``pdfleet-sim`` run on 127.0.0.1; Prometheus (from the
toolchain) scrapes them every second as static targets labelled like the operator's pods.
A fixed load goes through them the way vllm-router sends it (prefill with
``do_remote_decode``, then decode with the returned ``kv_transfer_params``), one request at a
time, so every TTFT and ITL is known from the latency model. The autoscaler's own reader,
``PrometheusSource.window`` (prometheus-api-client + ``promql.role_queries``), must then
report what ``PerfModel`` predicts, and ``histogram_quantile`` of both TTFT and ITL, sent
through prometheus-api-client, must answer the model's p50 within the buckets' resolution.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields

import httpx
import pytest
from prometheus_api_client import PrometheusConnect

from e2e.platform import prometheus
from e2e.platform.prometheus_proxy import Mode, PrometheusProxy
from pdfleet.autoscale import promql
from pdfleet.autoscale.metrics import PrometheusSource, parse_scalar
from pdfleet.autoscale.policy import (
    MetricsWindow,
    PolicyConfig,
    RoleMetrics,
    RoleReplicas,
    decide,
    metrics_problem,
)
from pdfleet_worker.perfmodel import preset
from pdfleet_worker.sim.procs import SimProc, free_port, start_sim, stopping

pytestmark = pytest.mark.timeout(240)

NAMESPACE = "prom-test"
SERVICE = "llama-8b"
PRESET = "llama-3.1-8b-h200"
# Metrics are in simulated seconds (sim/metrics.py), so the sims could run faster than real
# time, but the moments between a request's arrival and the step that schedules it are wall
# time, divided by --time-scale in the TTFT the sim reports: a scale under 1 inflates that
# noise in the mean TTFT. Real time keeps it at its wall size.
TIME_SCALE = 1.0
REQUESTS = 12
# Histograms only know which bucket an observation fell in. With identical observations
# histogram_quantile(q) answers lower + (upper - lower) * q of that bucket, so the load is
# chosen to put the model's value close to that point at q = 0.5, well inside the bucket:
# * TTFT: one 7,200-token prefill step (under max_num_batched_tokens = 8,192, so no chunking)
#   takes 1.48 + 0.02028 n + 4.13e-7 n^2 ms = 168.9 ms, in vLLM's TTFT bucket (0.10, 0.25]
#   whose midpoint is 0.175 s (+3.6 %); up to 80 ms of wall-clock noise per request would
#   still land in the same bucket.
# * ITL: a lone decode sequence at ~7,230 tokens of context steps in
#   5.02 + 0.0113 + 2.90e-5 * ctx ms = 5.24 ms, in the first ITL bucket (0, 0.01], whose
#   midpoint is 0.005 s (-4.6 %). Decode steps are paced on absolute deadlines, so ITL
#   carries wall-clock noise only when the loop falls 50 ms behind.
PROMPT_TOKENS = 7200
OUTPUT_TOKENS = 64
PERCENTILE = 50.0


@dataclass(frozen=True)
class Loaded:
    """Two sims with a finished load, and the Prometheus that scraped it."""

    prom: prometheus.Prometheus
    prefill: SimProc
    decode: SimProc
    load_s: float  # wall seconds the load took
    window_s: float  # a query window that starts before the first request


def predicted_ttft_s() -> float:
    """TTFT on the prefill worker: one prefill step of the whole prompt."""
    return preset(PRESET).step_seconds([(PROMPT_TOKENS, 0)], 0, 0.0)


def predicted_itls_s() -> list[float]:
    """Every ITL of one request on the decode worker: one-sequence decode steps over the
    growing context.

    After the KV pull the decode recomputes the last prompt token (context = prompt); the
    k-th next token is a decode step with context prompt + k.
    """
    model = preset(PRESET)
    return [model.step_seconds([], 1, PROMPT_TOKENS + k) for k in range(1, OUTPUT_TOKENS)]


def predicted_itl_s() -> float:
    """Mean ITL on the decode worker (every request has the same steps)."""
    return statistics.fmean(predicted_itls_s())


def _pd_request(client: httpx.Client, prefill: SimProc, decode: SimProc) -> None:
    prompt = list(range(PROMPT_TOKENS))  # token ids: the prompt length is exact
    r = client.post(
        f"{prefill.url}/v1/completions",
        json={
            "model": "sim-model",
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        },
    )
    r.raise_for_status()
    params = r.json()["kv_transfer_params"]
    r = client.post(
        f"{decode.url}/v1/completions",
        json={
            "model": "sim-model",
            "prompt": prompt,
            "max_tokens": OUTPUT_TOKENS,
            "kv_transfer_params": params,
        },
    )
    r.raise_for_status()
    assert r.json()["usage"]["completion_tokens"] == OUTPUT_TOKENS


def _target(sim: SimProc, role: str) -> prometheus.StaticTarget:
    labels = {
        promql.NAMESPACE_LABEL: NAMESPACE,
        promql.SERVICE_LABEL: SERVICE,
        promql.ROLE_LABEL: role,
        "pod": f"{SERVICE}-{role}-0",
    }
    return prometheus.StaticTarget(f"127.0.0.1:{sim.port}", labels)


def _finished(prom: prometheus.Prometheus, role: str) -> float:
    target = promql.RoleSeries(NAMESPACE, SERVICE, role)
    return prom.scalar(f"sum({target.selector(promql.REQUESTS)})")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    tmp = tmp_path_factory.mktemp("prom-sims")
    args = ["--preset", PRESET, "--time-scale", str(TIME_SCALE)]
    procs: list[SimProc] = []
    with stopping(procs):  # type: ignore[arg-type]
        prefill = start_sim(str(tmp), extra=args, name="prefill")
        procs.append(prefill)
        decode = start_sim(str(tmp), extra=args, name="decode")
        procs.append(decode)
        targets = [_target(prefill, "prefill"), _target(decode, "decode")]
        with prometheus.start_static(targets, tmp / "prometheus") as prom:
            prom.wait_for_targets(2, timeout_s=30)
            # An all-zero sample of every target before the load: the window starts there.
            prom.wait_for(
                lambda: all(_finished(prom, r) == 0 for r in ("prefill", "decode")),
                30,
                "a first scrape of both sims",
            )
            started = time.monotonic()
            with httpx.Client(timeout=30) as client:
                for _ in range(REQUESTS):
                    _pd_request(client, prefill, decode)
            load_s = time.monotonic() - started
            prom.wait_for(
                lambda: all(_finished(prom, r) == REQUESTS for r in ("prefill", "decode")),
                30,
                "Prometheus to scrape the finished load",
            )
            window_s = math.ceil(time.monotonic() - started) + 3
            yield Loaded(prom, prefill, decode, load_s, window_s)


def _window(loaded: Loaded, service: str = SERVICE) -> MetricsWindow:
    source = PrometheusSource(loaded.prom.url, disable_ssl=True)
    return source.window(NAMESPACE, service, time.time(), PERCENTILE, loaded.window_s)


def _quantile(loaded: Loaded, role: str, histogram: str) -> float:
    """`promql.quantile` of one role's histogram, sent through prometheus-api-client."""
    client = PrometheusConnect(url=loaded.prom.url, disable_ssl=True)
    target = promql.RoleSeries(NAMESPACE, SERVICE, role)
    return parse_scalar(
        client.custom_query(promql.quantile(target, histogram, PERCENTILE, loaded.window_s))
    )


def _err(measured: float, predicted: float) -> float:
    return (measured - predicted) / predicted


def test_ttft_and_itl_quantiles_match_the_latency_model(loaded: Loaded) -> None:
    """p50 of both histograms within 10 %. Bucket-limited: every observation falls in one
    bucket, so the answer is that bucket's midpoint (TTFT 175 ms for anything in
    (100, 250] ms, ITL 5 ms for anything in (0, 10] ms). The check proves the observations
    land in the model's bucket; the mean test below is the fine one."""
    ttft = _quantile(loaded, "prefill", promql.TTFT)
    itl = _quantile(loaded, "decode", promql.ITL)
    want_ttft, want_itl = predicted_ttft_s(), statistics.median(predicted_itls_s())
    print(
        f"\n[prometheus] p50 TTFT predicted {want_ttft * 1e3:.1f} ms, measured "
        f"{ttft * 1e3:.1f} ms ({_err(ttft, want_ttft):+.1%}); "
        f"p50 ITL predicted {want_itl * 1e3:.3f} ms, measured {itl * 1e3:.3f} ms "
        f"({_err(itl, want_itl):+.1%}); load {loaded.load_s:.1f} s"
    )
    assert ttft == pytest.approx(want_ttft, rel=0.10)
    assert itl == pytest.approx(want_itl, rel=0.10)
    # The autoscaler's reader sends the same TTFT quantile query (a moment later).
    m = _window(loaded)
    assert m.prefill is not None
    assert m.prefill.ttft_s == pytest.approx(ttft, rel=0.01)
    assert m.prefill.ttft_s == pytest.approx(want_ttft, rel=0.10)


def test_mean_ttft_and_itl_match_the_latency_model(loaded: Loaded) -> None:
    """Histogram sums are exact: the mean is a much finer check than the bucketed quantile."""

    def mean(role: str, histogram: str) -> float:
        target = promql.RoleSeries(NAMESPACE, SERVICE, role)
        return loaded.prom.scalar(promql.mean(target, histogram, loaded.window_s))

    ttft, itl = mean("prefill", promql.TTFT), mean("decode", promql.ITL)
    print(
        f"\n[prometheus] mean TTFT {ttft * 1e3:.1f} ms ({_err(ttft, predicted_ttft_s()):+.1%}), "
        f"mean ITL {itl * 1e3:.3f} ms ({_err(itl, predicted_itl_s()):+.1%})"
    )
    assert ttft == pytest.approx(predicted_ttft_s(), rel=0.10)
    assert itl == pytest.approx(predicted_itl_s(), rel=0.05)
    # The autoscaler's reader takes decode ITL as this mean (promql.role_queries), not as
    # the bucket midpoint the quantile answers (5.00 ms, 4.6 % away). Its query runs a moment
    # later over a window that slid a little, hence 1 %.
    m = _window(loaded)
    assert m.decode is not None
    assert m.decode.itl_s == pytest.approx(itl, rel=0.01)
    assert m.decode.itl_s == pytest.approx(predicted_itl_s(), rel=0.05)


def test_every_role_query_is_finite_and_sensible(loaded: Loaded) -> None:
    m = _window(loaded)
    assert m.prefill is not None and m.decode is not None
    queried = {
        role: set(promql.role_queries(promql.RoleSeries(NAMESPACE, SERVICE, role), 50, 60))
        for role in ("prefill", "decode")
    }
    p, d = m.prefill, m.decode
    for role, rm in (("prefill", p), ("decode", d)):
        for name in {f.name for f in fields(RoleMetrics)} - queried[role]:
            # Fields no query fills for the role (decode's per-request TPOT on prefill pods)
            # must read as NaN.
            assert math.isnan(getattr(rm, name)), (role, name)
    # Every request finished in the window: the decode's per-request percentile is read.
    assert queried["decode"] - queried["prefill"] == {"tpot_s"}
    assert math.isfinite(d.tpot_s) and d.tpot_s > 0
    for role, rm in (("prefill", p), ("decode", d)):
        for name in ("request_rate", "prompt_tokens_rate", "generation_tokens_rate"):
            assert math.isfinite(getattr(rm, name)) and getattr(rm, name) > 0, (role, name)
        # rate() extrapolates to the window's edges; the mean over the window is N / window.
        assert rm.request_rate == pytest.approx(REQUESTS / loaded.window_s, rel=0.3), role
        # Same target, same scrapes, same extrapolation: per-request ratios are exact.
        assert rm.prompt_tokens_rate / rm.request_rate == pytest.approx(PROMPT_TOKENS, rel=0.01)
        # One request at a time: nothing queues for long, the KV cache is nearly empty.
        assert 0 <= rm.num_requests_waiting < 1, role
        assert 0 <= rm.kv_cache_usage < 0.05, role
    # vllm-router asks the prefill for one token; the decode worker generates all of them.
    assert p.generation_tokens_rate / p.request_rate == pytest.approx(1, rel=0.01)
    assert d.generation_tokens_rate / d.request_rate == pytest.approx(OUTPUT_TOKENS, rel=0.01)
    assert math.isfinite(p.ttft_s) and math.isfinite(d.itl_s)
    # Nothing waited behind another request: the wait is inside vLLM's first bucket (0.3 s).
    assert 0 <= p.queue_time_s < 0.3, p.queue_time_s
    # The decode's TTFT is the KV pull plus the recomputed last prompt token.
    model = preset(PRESET)
    pull = model.kv_transfer_seconds(PROMPT_TOKENS, 50e9) + model.step_seconds([], 1, 7200)
    assert math.isfinite(d.ttft_s) and d.ttft_s >= 0.9 * pull
    # A prefill worker emits a single token per request: no inter-token latency at all.
    assert math.isnan(p.itl_s)
    config = PolicyConfig(ttft_target_s=0.5, itl_target_s=0.02, percentile=PERCENTILE)
    assert metrics_problem(m.at_s, config, m) is None, "the policy trusts this window"


def test_the_documented_peak_rate_subquery_runs(loaded: Loaded) -> None:
    """docs/autoscaling.md's burst signal: the highest 30 s prompt rate in the window.

    The subquery is evaluated at multiples of 5 s, and rate() needs two samples in the
    30 s before each: a series younger than one step has no answer yet, so poll briefly.
    """
    target = promql.RoleSeries(NAMESPACE, SERVICE, "prefill")
    query = promql.peak_rate(target, promql.PROMPT_TOKENS, 60)
    loaded.prom.wait_for(lambda: math.isfinite(loaded.prom.scalar(query)), 15, query)
    peak = loaded.prom.scalar(query)
    # No 30 s range holds more than the whole load (rate() extrapolates to the range's
    # edges by at most about one scrape interval).
    assert 0 < peak <= 1.3 * REQUESTS * PROMPT_TOKENS / promql.PEAK_RATE_S, peak


def test_series_that_do_not_exist_read_as_missing_and_the_policy_holds(loaded: Loaded) -> None:
    m = _window(loaded, service="no-such-service")
    assert m.prefill is None and m.decode is None
    config = PolicyConfig(ttft_target_s=0.5, itl_target_s=0.02, percentile=PERCENTILE)
    assert metrics_problem(m.at_s, config, m) == "MetricsMissing"
    held = decide(config, m.at_s, RoleReplicas(2, 2), RoleReplicas(3, 3), m)
    assert (held.prefill, held.decode) == (2, 3)
    assert ("MetricsAvailable", "False", "MetricsMissing") in {
        (c.type, c.status, c.reason) for c in held.conditions
    }
    # Each query on its own answers an empty vector, which reads as NaN (not zero).
    target = promql.RoleSeries(NAMESPACE, "no-such-service", "decode")
    for name, query in promql.role_queries(target, PERCENTILE, loaded.window_s).items():
        assert loaded.prom.query(query) == [], name


def test_an_unreachable_prometheus_reads_as_missing() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    m = PrometheusSource(url, timeout_s=2).window(NAMESPACE, SERVICE, time.time(), 90, 60)
    assert m.prefill is None and m.decode is None
    assert time.monotonic() - started < 5, "one failed query ends the window's reads"


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("pass", None), ("nan", "MetricsNaN"), ("stale", "MetricsStale"), ("empty", "MetricsMissing")],
)
def test_the_fault_suites_prometheus_proxy_gives_each_reason(
    loaded: Loaded, mode: Mode, reason: str | None
) -> None:
    """e2e/platform/prometheus_proxy.py in front of this Prometheus: what each mode does to real
    answers is what the autoscaler's reader reports (the fault suite relies on it)."""
    proxy = PrometheusProxy(loaded.prom.url)
    with proxy.running():
        proxy.switch(mode)
        source = PrometheusSource(proxy.url, disable_ssl=True)
        m = source.window(NAMESPACE, SERVICE, time.time(), PERCENTILE, loaded.window_s)
        config = PolicyConfig(ttft_target_s=1.0, itl_target_s=0.05)
        assert metrics_problem(time.time(), config, m) == reason
        queries = sum(
            len(promql.role_queries(promql.RoleSeries(NAMESPACE, SERVICE, role), 50, 60))
            for role in ("prefill", "decode")
        )
        queries += len(promql.slo_bucket_queries(NAMESPACE, SERVICE, 60))  # SLO attainment
        assert proxy.rewritten == (0 if mode == "pass" else queries)


def test_the_prometheus_proxy_in_front_of_a_stopped_prometheus_reads_as_missing() -> None:
    proxy = PrometheusProxy(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with proxy.running():
        m = PrometheusSource(proxy.url, timeout_s=2).window(NAMESPACE, SERVICE, time.time(), 90, 60)
    assert metrics_problem(time.time(), PolicyConfig(1.0, 0.05), m) == "MetricsMissing"
