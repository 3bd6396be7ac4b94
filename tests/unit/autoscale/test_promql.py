"""Tests of the pure PromQL builders and answer parsing (`promql.py`, `metrics.py`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.autoscale import promql
from pdfleet.autoscale.metrics import (
    PrometheusSource,
    parse_buckets,
    parse_sample,
    parse_scalar,
    query_error,
    to_role_metrics,
)
from pdfleet.autoscale.policy import PolicyConfig, metrics_problem
from tests.spec_cases import ROOT

T = promql.RoleSeries("serving", "llama-8b", "prefill")
SEL = 'namespace="serving",pdfleet_service="llama-8b",pdfleet_role="prefill"'


@pytest.mark.parametrize(
    ("name", "got", "want"),
    [
        (
            "ttft quantile",
            promql.quantile(T, promql.TTFT, 95, 60),
            "histogram_quantile(0.95, sum by (le) "
            f"(rate(vllm:time_to_first_token_seconds_bucket{{{SEL}}}[60s])))",
        ),
        (
            "itl p90",
            promql.quantile(T, promql.ITL, 90, 120.4),
            "histogram_quantile(0.9, sum by (le) "
            f"(rate(vllm:inter_token_latency_seconds_bucket{{{SEL}}}[120s])))",
        ),
        (
            "rate",
            promql.rate(T, promql.PROMPT_TOKENS, 60),
            f"sum(rate(vllm:prompt_tokens_total{{{SEL}}}[60s]))",
        ),
        (
            "queue",
            promql.gauge_sum(T, promql.WAITING, 30),
            f"sum(avg_over_time(vllm:num_requests_waiting{{{SEL}}}[30s]))",
        ),
        (
            "kv",
            promql.gauge_mean(T, promql.KV_USAGE, 30),
            f"avg(avg_over_time(vllm:kv_cache_usage_perc{{{SEL}}}[30s]))",
        ),
    ],
)
def test_queries(name: str, got: str, want: str) -> None:
    assert got == want, name


def test_slo_histograms_are_bucket_rates_of_the_role_judged_on_each() -> None:
    queries = promql.slo_bucket_queries("serving", "llama-8b", 60)
    decode = SEL.replace('"prefill"', '"decode"')
    assert queries == {
        "ttft_buckets": "sum by (le) "
        f"(rate(vllm:time_to_first_token_seconds_bucket{{{SEL}}}[60s]))",
        "tpot_buckets": "sum by (le) "
        f"(rate(vllm:request_time_per_output_token_seconds_bucket{{{decode}}}[60s]))",
    }


def test_label_values_are_escaped() -> None:
    t = promql.RoleSeries('a"b', "s\\x", "decode")
    assert 'namespace="a\\"b"' in t.selector("m")
    assert 'pdfleet_service="s\\\\x"' in t.selector("m")


def test_role_queries_cover_role_metrics_fields() -> None:
    assert set(promql.role_queries(T, 95, 60)) == {
        "ttft_s",
        "itl_s",
        "request_rate",
        "prompt_tokens_rate",
        "generation_tokens_rate",
        "num_requests_waiting",
        "kv_cache_usage",
        "prompt_tokens_rate_peak",
        "waiting_growth",
        "prompt_arrivals_peak",
        "queue_time_s",
    }
    decode = set(promql.role_queries(promql.RoleSeries("serving", "llama-8b", "decode"), 95, 60))
    prefill = set(promql.role_queries(T, 95, 60))
    assert (decode - prefill, prefill - decode) == ({"tpot_s"}, {"queue_time_s"})


def test_queue_time_is_the_percentile_of_the_prefill_waits() -> None:
    q = promql.role_queries(T, 95, 60)["queue_time_s"]
    assert q == (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(vllm:request_queue_time_seconds_bucket{{{SEL}}}[60s])))"
    )


def test_itl_is_the_exact_window_mean() -> None:
    q = promql.role_queries(T, 95, 60)["itl_s"]
    assert q.startswith("sum(rate(vllm:inter_token_latency_seconds_sum{")
    assert "/ sum(rate(vllm:inter_token_latency_seconds_count{" in q


def test_time_per_output_token_is_the_percentile_of_requests() -> None:
    q = promql.role_queries(promql.RoleSeries("ns", "svc", "decode"), 95, 60)["tpot_s"]
    assert q.startswith("histogram_quantile(0.95, sum by (le) (rate(")
    assert "vllm:request_time_per_output_token_seconds_bucket{" in q


def test_peak_prompt_rate_is_a_subquery_over_the_window() -> None:
    q = promql.role_queries(T, 95, 60)["prompt_tokens_rate_peak"]
    assert q.startswith("max_over_time(sum(rate(vllm:prompt_tokens_total{")
    assert q.endswith("[30s]))[60s:5s])")


def _seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def test_the_peak_range_holds_two_scrapes_of_every_shipped_interval() -> None:
    """rate() answers nothing from one sample, and Prometheus 3's ranges are left-open: the
    burst signal's range must exceed each shipped scrape interval of the workers."""
    scrape = Path(promql.__file__).parent / "scrape"
    job = yaml.safe_load((scrape / "kubernetes_sd.yaml").read_text())[0]
    monitor = yaml.safe_load((scrape / "podmonitor.yaml").read_text())["spec"]
    values = yaml.safe_load((ROOT / "charts" / "pdfleet" / "values.yaml").read_text())
    intervals = [
        job["scrape_interval"],
        *(endpoint["interval"] for endpoint in monitor["podMetricsEndpoints"]),
        values["monitoring"]["workersPodMonitor"]["interval"],
    ]
    assert len(intervals) == 3
    for interval in intervals:
        assert 2 * _seconds(interval) <= promql.PEAK_RATE_S, interval


@pytest.mark.parametrize(
    ("name", "answer", "want"),
    [
        ("one sample", [{"metric": {}, "value": [1.0, "0.25"]}], 0.25),
        ("NaN string", [{"metric": {}, "value": [1.0, "NaN"]}], math.nan),
        ("empty vector", [], math.nan),
        ("several series", [{"value": [1, "1"]}, {"value": [1, "2"]}], math.nan),
        ("garbage", [{"nope": 1}], math.nan),
    ],
)
def test_parse_scalar(name: str, answer: list[dict[str, Any]], want: float) -> None:
    got = parse_scalar(answer)
    assert (math.isnan(got) and math.isnan(want)) or got == want, name


def test_only_a_queue_growth_may_be_negative() -> None:
    answer = [{"metric": {}, "value": [1.0, "-0.5"]}]
    assert math.isnan(parse_scalar(answer))  # a negative rate or latency is a broken source
    assert parse_sample(answer, signed=True) == (-0.5, 1.0)
    assert set(promql.role_queries(T, 95, 60)) >= promql.SIGNED
    assert "deriv(vllm:num_requests_waiting{" in promql.role_queries(T, 95, 60)["waiting_growth"]


def test_role_without_rates_is_missing() -> None:
    assert to_role_metrics({"ttft_s": 0.1}) is None


class _Fake:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.queries: list[str] = []

    def custom_query(self, query: str) -> list[dict[str, Any]]:
        self.queries.append(query)
        if self.fail:
            raise ConnectionError("down")
        return [{"metric": {}, "value": [0, "2"]}]


def test_source_builds_window() -> None:
    fake = _Fake()
    w = PrometheusSource("http://prom", client=fake).window("serving", "llama-8b", 10.0, 95, 60)
    assert w.prefill is not None and w.prefill.prompt_tokens_rate == 2.0
    assert len(fake.queries) == 24  # 10 per role, decode's TPOT, prefill's queue time, 2 SLO
    assert w.ttft_buckets == () and w.tpot_buckets == ()  # answers without `le`


def _bucket(le: str, value: str) -> dict[str, Any]:
    return {"metric": {"le": le}, "value": [10.0, value]}


BUCKETS = [_bucket("+Inf", "3"), _bucket("0.5", "1"), _bucket("1.0", "2.5")]


@pytest.mark.parametrize(
    ("name", "answer", "want"),
    [
        ("real shape", BUCKETS, ((0.5, 1.0), (1.0, 2.5), (math.inf, 3.0))),
        ("one bound written twice", [*BUCKETS, _bucket("0.50", "1")],
         ((0.5, 2.0), (1.0, 2.5), (math.inf, 3.0))),
        ("empty vector", [], ()),
        ("a sample without le", [*BUCKETS, {"metric": {}, "value": [10.0, "1"]}], ()),
        ("a NaN rate", [*BUCKETS, _bucket("2.5", "NaN")], ()),
        ("a bad bound", [*BUCKETS, _bucket("fast", "1")], ()),
        ("not a vector", {"result": BUCKETS}, ()),
        ("garbage sample", [*BUCKETS, "le"], ()),
    ],
)  # fmt: skip
def test_parse_buckets(name: str, answer: object, want: tuple[tuple[float, float], ...]) -> None:
    assert parse_buckets(answer) == want, name


class _Histograms(_Fake):
    """Answers the bucket queries with BUCKETS (or fails them), everything else with 2."""

    def __init__(self, buckets_fail: bool = False) -> None:
        super().__init__()
        self.buckets_fail = buckets_fail

    def custom_query(self, query: str) -> list[dict[str, Any]]:
        if not query.startswith("sum by (le)"):
            return super().custom_query(query)
        if self.buckets_fail:
            raise ConnectionError("down")
        return BUCKETS


def test_the_window_carries_the_slo_histograms() -> None:
    w = PrometheusSource("http://prom", client=_Histograms()).window("n", "s", 10.0, 95, 60)
    assert w.ttft_buckets == w.tpot_buckets == ((0.5, 1.0), (1.0, 2.5), (math.inf, 3.0))


def test_a_failed_histogram_query_leaves_the_policy_its_window() -> None:
    w = PrometheusSource("http://prom", client=_Histograms(buckets_fail=True)).window(
        "n", "s", 10.0, 95, 60
    )
    assert w.ttft_buckets == w.tpot_buckets == ()
    assert metrics_problem(10.0, CFG, w) is None


def test_source_down_means_missing() -> None:
    w = PrometheusSource("http://prom", client=_Fake(fail=True)).window("n", "s", 10.0, 95, 60)
    assert w.prefill is None and w.decode is None
    assert w.problem == "Prometheus http://prom: ConnectionError: down"


def test_a_failed_query_is_told_without_the_query_the_client_repeats() -> None:
    error = ConnectionError(
        "HTTPConnectionPool(host='p', port=9090): Max retries exceeded with url: "
        "/api/v1/query?query=histogram_quantile%280.9%2C+sum+by+%28le%29 (Caused by timeout)"
    )
    assert query_error(error) == (
        "ConnectionError: HTTPConnectionPool(host='p', port=9090): Max retries exceeded with "
        "url: /api/v1/query (Caused by timeout)"
    )


class _Answers:
    """Answers every query with one sample of `value` evaluated at `at_s` (None: no series)."""

    def __init__(self, value: str | None, at_s: float = 10.0) -> None:
        self.value, self.at_s = value, at_s

    def custom_query(self, query: str) -> list[dict[str, Any]]:
        return [] if self.value is None else [{"metric": {}, "value": [self.at_s, self.value]}]


CFG = PolicyConfig(ttft_target_s=1.0, itl_target_s=0.02)


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        (_Answers("2"), None),
        (_Answers(None), "MetricsMissing"),
        (_Answers("NaN"), "MetricsNaN"),
        (_Answers("2", at_s=10.0 - 600), "MetricsStale"),
        (_Answers("NaN", at_s=10.0 - 600), "MetricsStale"),
    ],
    ids=["fresh", "no series", "NaN series", "old answers", "old NaN answers"],
)
def test_what_prometheus_answers_decides_the_reason(answers: _Answers, reason: str | None) -> None:
    w = PrometheusSource("http://prom", client=answers).window("n", "s", 10.0, 95, 60)
    assert metrics_problem(10.0, CFG, w) == reason


def test_the_window_is_dated_by_its_oldest_answer() -> None:
    w = PrometheusSource("http://prom", client=_Answers("2", at_s=7.5)).window(
        "n", "s", 10.0, 95, 60
    )
    assert w.at_s == 7.5
    unreadable = PrometheusSource("http://prom", client=_Answers("2", at_s=math.nan))
    assert unreadable.window("n", "s", 10.0, 95, 60).at_s == 10.0


def test_parse_sample_tells_no_series_from_a_nan_series() -> None:
    assert parse_sample([]) is None
    value, at_s = parse_sample([{"metric": {}, "value": [3.0, "NaN"]}]) or (0.0, 0.0)
    assert math.isnan(value) and at_s == 3.0
