"""The benchmark's in-memory Prometheus: the operator's queries parse, other PromQL is refused,
and the operator's own PrometheusSource reads a window through it.

Its answers are held to the real Prometheus in tests/integration/prometheus/test_sim_tsdb.py.
"""

from __future__ import annotations

import math

import pytest

from pdfleet.autoscale import promql
from pdfleet.autoscale.metrics import PrometheusSource
from pdfleet_lab.tsdb import (
    PromQLError,
    SimPrometheus,
    bucket_quantile,
    extrapolated_rate,
    parse,
    slope,
)

TARGET = promql.RoleSeries("ns", "svc", "prefill")


def test_every_operator_query_parses() -> None:
    queries = [
        *promql.role_queries(TARGET, 95, 60).values(),
        *promql.slo_bucket_queries("ns", "svc", 60).values(),
    ]
    for query in queries:
        parse(query)


@pytest.mark.parametrize(
    "query",
    [
        'up{job="x"}',  # an instant selector
        "irate(x[1m])",  # a function outside the subset
        'x{a=~"b"}[1m]',  # a regex matcher
        "sum(rate(x[1m])) by (le)",  # the trailing `by` form
        "rate(x[1m]",
    ],
)
def test_other_promql_is_refused(query: str) -> None:
    store = SimPrometheus()
    with pytest.raises(PromQLError):
        store.custom_query(query)


def test_rate_extrapolates_to_the_window_edges_but_not_below_zero() -> None:
    # Samples 15 s apart cover 45 s of a 60 s window: extrapolated to the window, 1 a second.
    assert extrapolated_rate([(15, 15), (30, 30), (45, 45), (60, 60)], 0, 60) == pytest.approx(1.0)
    # A counter that started inside the window is not extrapolated below zero.
    assert extrapolated_rate([(30, 1), (45, 16), (60, 31)], 0, 60) == pytest.approx(31 / 60)
    # A reset adds the value before it back.
    assert extrapolated_rate([(15, 10), (30, 20), (45, 5), (60, 15)], 0, 60) == pytest.approx(
        25 * 60 / 45 / 60
    )
    assert extrapolated_rate([(60, 5)], 0, 60) is None


def test_deriv_is_the_least_squares_slope() -> None:
    assert slope([(0, 4), (15, 4), (30, 4)]) == 0.0
    assert slope([(0, 0), (15, 30), (30, 30), (45, 60)]) == pytest.approx(1.2)
    assert slope([(0, 20), (15, 5)]) == pytest.approx(-1.0)  # a queue worked off
    assert slope([(60, 5)]) is None


def test_arithmetic_binds_products_before_sums() -> None:
    store = SimPrometheus()
    for t, served, queue in ((0, 0, 10), (15, 300, 40), (30, 600, 70)):
        store.add("p", {}, t, served)
        store.add("w", {}, t, queue)
    store.now = 30.0
    # 20/s served, the queue grows 2/s, 10 tokens each: 40 arriving
    answer = store.custom_query("sum(rate(p[30s])) + sum(deriv(w[30s])) * 100 / 10")
    assert float(answer[0]["value"][1]) == pytest.approx(40.0)
    assert float(store.custom_query("sum(rate(p[30s])) - 5")[0]["value"][1]) == pytest.approx(15)


def test_max_over_time_skips_nan_unless_all_are() -> None:
    store = SimPrometheus()
    for t, v in ((0, math.nan), (15, 3.0), (30, math.nan)):
        store.add("g", {}, t, v)
    store.now = 30.0
    assert float(store.custom_query("max_over_time(g[45s])")[0]["value"][1]) == 3.0


def test_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (math.inf, 40.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (10 / 20))
    assert bucket_quantile(0.99, buckets) == 0.5  # in +Inf: the highest finite bound
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1.0)]))  # no +Inf bucket


def test_the_operator_source_reads_its_window_from_the_simulated_prometheus() -> None:
    store = SimPrometheus()
    labels = {"namespace": "ns", "pdfleet_service": "svc", "pdfleet_role": "prefill", "pod": "p"}
    for step in range(9):
        t = 15.0 * step
        store.add(promql.PROMPT_TOKENS, labels, t, 1500.0 * step)
        store.add(promql.REQUESTS, labels, t, 1.0 * step)
        store.add(promql.WAITING, labels, t, 2.0)
    store.now = 120.0
    window = PrometheusSource("sim", client=store).window("ns", "svc", 120.0, 95, 60)
    assert window.problem == "" and window.at_s == 120.0
    assert window.prefill is not None and window.decode is None
    assert window.prefill.prompt_tokens_rate == pytest.approx(100.0)
    assert window.prefill.num_requests_waiting == 2.0
    assert math.isnan(window.prefill.ttft_s)  # no TTFT series: unknown, not zero
