"""Prometheus metrics source: the only autoscaler code that does I/O.

Where it fits: the operator's autoscale timer calls `PrometheusSource.window(...)` and passes
the `MetricsWindow` to `policy.decide`. Queries come from `promql.py` (pure); turning answers
into numbers is `parse_sample`/`to_role_metrics` (pure). What the policy then holds on
(`MetricsAvailable=False`): a failed query or an empty answer (no series) makes the role
missing (`MetricsMissing`); a series whose value is NaN, infinite or negative is NaN
(`MetricsNaN`); and the window is as old as the oldest answer's evaluation time
(`MetricsStale` past `PolicyConfig.metrics_max_age_s`). The SLO histograms' buckets
(`parse_buckets`) do not feed the policy: a failed or unusable answer only leaves SLO
attainment unknown.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from pdfleet.autoscale.attainment import Buckets
from pdfleet.autoscale.policy import MetricsWindow, RoleMetrics
from pdfleet.autoscale.promql import SIGNED, RoleSeries, role_queries, slo_bucket_queries

T = TypeVar("T")


class _Client(Protocol):
    def custom_query(self, query: str) -> list[dict[str, Any]]: ...


Sample = tuple[float, float]
"""(value, evaluation time in Unix seconds) of a one-sample answer."""


def parse_sample(result: object, signed: bool = False) -> Sample | None:
    """The sample of a one-sample instant-vector answer; None when there is none ("no data").

    A `sum(...)` over no series answers an empty vector: that is "no data", not zero. Every
    signal read here is finite, and all but the `signed` ones (`promql.SIGNED`: how fast a
    queue grows) are never negative, so a value that is not is a broken source: NaN, on
    which the policy holds. The time is NaN when unreadable.
    """
    if not isinstance(result, list) or len(result) != 1:
        return None
    try:
        pair = result[0]["value"]
        raw = pair[1]
    except (KeyError, IndexError, TypeError):
        return None
    return _finite_or_nan(raw, positive=not signed), _finite_or_nan(pair[0], positive=False)


def parse_signed_sample(result: object) -> Sample | None:
    return parse_sample(result, signed=True)


def _finite_or_nan(raw: object, positive: bool) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) and (value >= 0 or not positive) else math.nan


def parse_scalar(result: object) -> float:
    """The value of a one-sample instant-vector answer; NaN when empty or unusable."""
    sample = parse_sample(result)
    return math.nan if sample is None else sample[0]


def parse_buckets(result: object) -> Buckets:
    """A histogram's buckets from a `sum by (le)` answer, by ascending bound; empty when the
    answer is empty or any sample is unusable (no `le`, a value that is not a finite rate):
    a histogram with a bucket missing would misplace every share above it."""
    if not isinstance(result, list):
        return ()
    rates: defaultdict[float, float] = defaultdict(float)
    for sample in result:
        try:
            bound = float(sample["metric"]["le"])
            rate = _finite_or_nan(sample["value"][1], positive=True)
        except (KeyError, IndexError, TypeError, ValueError):
            return ()
        if math.isnan(bound) or math.isnan(rate):
            return ()
        rates[bound] += rate  # "0.5" and "0.50" are one bound written twice
    return tuple(sorted(rates.items()))


RATES = ("request_rate", "prompt_tokens_rate", "generation_tokens_rate")


def to_role_metrics(values: Mapping[str, float | None]) -> RoleMetrics | None:
    """RoleMetrics from query results (None: the query answered no sample); None when no rate
    query answered one (the role has no series). Rates that answered NaN stay NaN."""
    if all(values.get(k) is None for k in RATES):
        return None

    def get(key: str) -> float:
        value = values.get(key)
        return math.nan if value is None else value

    return RoleMetrics(
        ttft_s=get("ttft_s"),
        itl_s=get("itl_s"),
        tpot_s=get("tpot_s"),
        request_rate=get("request_rate"),
        prompt_tokens_rate=get("prompt_tokens_rate"),
        generation_tokens_rate=get("generation_tokens_rate"),
        num_requests_waiting=get("num_requests_waiting"),
        kv_cache_usage=get("kv_cache_usage"),
        prompt_tokens_rate_peak=get("prompt_tokens_rate_peak"),
        waiting_growth=get("waiting_growth"),
        prompt_arrivals_peak=get("prompt_arrivals_peak"),
        queue_time_s=get("queue_time_s"),
    )


def query_error(error: Exception) -> str:
    """A failed query in a line: the error's type and text, without the query string the
    HTTP client repeats in it (a PromQL expression, URL-encoded, hundreds of characters)."""
    text = re.sub(r"/api/v1/query\?\S*", "/api/v1/query", str(error))
    return f"{type(error).__name__}: {text}"[:300]


# Queries of one window in flight at once: a window is about twenty queries, and one after
# the other they took a second or more against a loaded Prometheus.
QUERIES_AT_ONCE = 4


class PrometheusSource:
    """Reads one InferenceService's window from Prometheus (prometheus-api-client), its
    queries side by side on threads of its own."""

    def __init__(
        self,
        url: str,
        client: _Client | None = None,
        disable_ssl: bool = False,
        timeout_s: int = 5,
    ) -> None:
        self._url = url
        self._queries = ThreadPoolExecutor(QUERIES_AT_ONCE, thread_name_prefix="promql")
        if client is None:
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            # The window is read inside a reconcile pass: fail fast, the policy holds and the
            # next interval tries again (the client's default retries back off for minutes).
            client = PrometheusConnect(
                url=url, disable_ssl=disable_ssl, retry=Retry(total=0), timeout=timeout_s
            )
        self._client = client

    def _query(self, query: str, failed: list[Exception], parse: Callable[[object], T]) -> T | None:
        if failed:  # one failure ends this window's reads: the rest would fail the same way
            return None
        try:
            return parse(self._client.custom_query(query))
        except Exception as error:  # network or server error: the policy holds (missing)
            failed.append(error)
            return None

    def window(
        self, namespace: str, service: str, now_s: float, percentile: float, window_s: float
    ) -> MetricsWindow:
        """Both roles' signals. The window is dated by its oldest answer's evaluation time
        (now_s when nothing answered): an answer computed long ago, by a Prometheus whose
        clock stopped or a cache in front of it, makes the window stale."""
        failed: list[Exception] = []
        sampled = {
            (role, k): self._queries.submit(
                self._query, q, failed, parse_signed_sample if k in SIGNED else parse_sample
            )
            for role in ("prefill", "decode")
            for k, q in role_queries(
                RoleSeries(namespace, service, role), percentile, window_s
            ).items()
        }
        bucketed = {
            k: self._queries.submit(self._query, q, failed, parse_buckets)
            for k, q in slo_bucket_queries(namespace, service, window_s).items()
        }
        samples = {key: future.result() for key, future in sampled.items()}
        slo = {k: future.result() or () for k, future in bucketed.items()}
        times = [s[1] for s in samples.values() if s is not None and math.isfinite(s[1])]
        roles = {
            role: to_role_metrics(
                {k: None if s is None else s[0] for (r, k), s in samples.items() if r == role}
            )
            for role in ("prefill", "decode")
        }
        problem = f"Prometheus {self._url}: {query_error(failed[0])}" if failed else ""
        return MetricsWindow(
            at_s=min(times, default=now_s),
            window_s=window_s,
            prefill=roles["prefill"],
            decode=roles["decode"],
            ttft_buckets=slo["ttft_buckets"],
            tpot_buckets=slo["tpot_buckets"],
            problem=problem[:1000],
        )
