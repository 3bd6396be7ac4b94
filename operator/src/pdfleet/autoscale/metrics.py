"""Prometheus metrics source: the only autoscaler code that does I/O.

Where it fits: the operator's autoscale timer calls `PrometheusSource.window(...)` and passes
the `MetricsWindow` to `policy.decide`. Queries come from `promql.py` (pure); turning answers
into numbers is `parse_scalar`/`to_role_metrics` (pure). A failed or empty query becomes NaN
or a missing role, which the policy treats as "hold" (`MetricsAvailable=False`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from pdfleet.autoscale.policy import MetricsWindow, RoleMetrics
from pdfleet.autoscale.promql import Target, role_queries


class _Client(Protocol):
    def custom_query(self, query: str) -> list[dict[str, Any]]: ...


def parse_scalar(result: object) -> float:
    """The value of a one-sample instant-vector answer; NaN when empty or unparsable.

    A `sum(...)` over no series answers an empty vector: that is "no data", not zero. Every
    signal read here (rates, latencies, queue lengths, cache usage) is finite and never
    negative, so a value that is not is a broken source, also NaN: the policy holds on it.
    """
    if not isinstance(result, list) or len(result) != 1:
        return math.nan
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) and value >= 0 else math.nan


def to_role_metrics(values: Mapping[str, float]) -> RoleMetrics | None:
    """RoleMetrics from query results; None when the role has no rate data at all."""
    if all(
        math.isnan(values.get(k, math.nan))
        for k in ("request_rate", "prompt_tokens_rate", "generation_tokens_rate")
    ):
        return None
    return RoleMetrics(
        ttft_s=values.get("ttft_s", math.nan),
        itl_s=values.get("itl_s", math.nan),
        request_rate=values.get("request_rate", math.nan),
        prompt_tokens_rate=values.get("prompt_tokens_rate", math.nan),
        generation_tokens_rate=values.get("generation_tokens_rate", math.nan),
        num_requests_waiting=values.get("num_requests_waiting", math.nan),
        kv_cache_usage=values.get("kv_cache_usage", math.nan),
        prompt_tokens_rate_peak=values.get("prompt_tokens_rate_peak", math.nan),
    )


class PrometheusSource:
    """Reads one InferenceService's window from Prometheus (prometheus-api-client)."""

    def __init__(
        self,
        url: str,
        client: _Client | None = None,
        disable_ssl: bool = False,
        timeout_s: int = 5,
    ) -> None:
        if client is None:
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            # The window is read inside a reconcile pass: fail fast, the policy holds and the
            # next interval tries again (the client's default retries back off for minutes).
            client = PrometheusConnect(
                url=url, disable_ssl=disable_ssl, retry=Retry(total=0), timeout=timeout_s
            )
        self._client = client

    def _query(self, query: str, failed: list[Exception]) -> float:
        if failed:  # one failure ends this window's reads: the rest would fail the same way
            return math.nan
        try:
            return parse_scalar(self._client.custom_query(query))
        except Exception as error:  # network or server error: the policy holds on NaN
            failed.append(error)
            return math.nan

    def window(
        self, namespace: str, service: str, now_s: float, percentile: float, window_s: float
    ) -> MetricsWindow:
        roles = {}
        failed: list[Exception] = []
        for role in ("prefill", "decode"):
            queries = role_queries(Target(namespace, service, role), percentile, window_s)
            roles[role] = to_role_metrics({k: self._query(q, failed) for k, q in queries.items()})
        return MetricsWindow(
            at_s=now_s, window_s=window_s, prefill=roles["prefill"], decode=roles["decode"]
        )
