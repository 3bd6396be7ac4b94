"""PromQL for the autoscaler's signals, built as plain strings (pure, unit-tested).

Where it fits: `pdfleet.autoscale.metrics.PrometheusSource` sends these queries and turns
the answers into a `policy.MetricsWindow`. Series are tied to an InferenceService and a role
by the labels the scrape configuration (`scrape/`) copies from the pods' labels
`pdfleet.dev/service` and `pdfleet.dev/role`: `pdfleet_service`, `pdfleet_role` and
`namespace`.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVICE_LABEL = "pdfleet_service"
ROLE_LABEL = "pdfleet_role"
NAMESPACE_LABEL = "namespace"

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
REQUESTS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
QUEUE_TIME = "vllm:request_queue_time_seconds"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def duration(seconds: float) -> str:
    """A PromQL duration: whole seconds, at least 1s (`60` -> `60s`)."""
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class RoleSeries:
    """Which series: one InferenceService (namespace/name) and one role."""

    namespace: str
    service: str
    role: str

    def selector(self, metric: str) -> str:
        return (
            f"{metric}{{{NAMESPACE_LABEL}={_quote(self.namespace)},"
            f"{SERVICE_LABEL}={_quote(self.service)},{ROLE_LABEL}={_quote(self.role)}}}"
        )


def buckets(target: RoleSeries, histogram: str, window_s: float) -> str:
    """A histogram's bucket rates in the window, summed over the role's pods: one sample
    per bucket, labelled `le`."""
    selector = target.selector(f"{histogram}_bucket")
    return f"sum by (le) (rate({selector}[{duration(window_s)}]))"


def quantile(target: RoleSeries, histogram: str, percentile: float, window_s: float) -> str:
    """The percentile of a histogram over the role's pods, from bucket rates in the window."""
    return f"histogram_quantile({percentile / 100.0:g}, {buckets(target, histogram, window_s)})"


def rate(target: RoleSeries, counter: str, window_s: float) -> str:
    """Per-second rate of a counter summed over the role's pods."""
    return f"sum(rate({target.selector(counter)}[{duration(window_s)}]))"


def gauge_sum(target: RoleSeries, gauge: str, window_s: float) -> str:
    """A gauge averaged over the window per pod, summed over the role's pods (queues)."""
    return f"sum(avg_over_time({target.selector(gauge)}[{duration(window_s)}]))"


def gauge_mean(target: RoleSeries, gauge: str, window_s: float) -> str:
    """A gauge averaged over the window and over the role's pods (utilizations)."""
    return f"avg(avg_over_time({target.selector(gauge)}[{duration(window_s)}]))"


def growth(target: RoleSeries, gauge: str, window_s: float) -> str:
    """How fast a gauge moves per second over the window, summed over the role's pods: a
    least-squares slope (`deriv`), so one noisy scrape does not read as a trend. Signed."""
    return f"sum(deriv({target.selector(gauge)}[{duration(window_s)}]))"


def mean(target: RoleSeries, histogram: str, window_s: float) -> str:
    """The exact mean of a histogram's observations in the window (sum over count)."""
    w = duration(window_s)
    return (
        f"sum(rate({target.selector(histogram + '_sum')}[{w}]))"
        f" / sum(rate({target.selector(histogram + '_count')}[{w}]))"
    )


# The short range of the burst signal. rate() needs two samples inside the range, and
# Prometheus 3's ranges are left-open, so a range as long as the scrape interval holds one
# sample and answers nothing: twice the shipped 15 s interval (scrape/, the chart's
# PodMonitor) always holds two.
PEAK_RATE_S = 30.0


def peak_rate(
    target: RoleSeries, counter: str, window_s: float, short_s: float = PEAK_RATE_S
) -> str:
    """The highest `short_s` rate within the window, sampled every 5 s (a subquery): the
    bursts a batching prefill engine must absorb, which the window mean hides."""
    return f"max_over_time({rate(target, counter, short_s)}[{duration(window_s)}:5s])"


# Fields of `role_queries` that may be negative (a queue that shrinks); every other signal
# is a rate, latency, length or share, never below zero.
SIGNED = frozenset({"waiting_growth"})


def peak_arrivals(target: RoleSeries, window_s: float, short_s: float = PEAK_RATE_S) -> str:
    """The highest `short_s` rate of prompt tokens *arriving* within the window, sampled
    every 5 s: the served rate plus how fast the queue grew over the same interval, in
    tokens (requests x the window's mean prompt). A saturated pool serves its capacity while
    its queue takes the rest; one working off a backlog serves faster than prompts arrive."""
    served = rate(target, PROMPT_TOKENS, short_s)
    queued = growth(target, WAITING, short_s)
    mean_prompt = f"{rate(target, PROMPT_TOKENS, window_s)} / {rate(target, REQUESTS, window_s)}"
    return f"max_over_time(({served} + {queued} * {mean_prompt})[{duration(window_s)}:5s])"


def role_queries(target: RoleSeries, percentile: float, window_s: float) -> dict[str, str]:
    """Every query one role needs, keyed by the `policy.RoleMetrics` field it fills.

    Decode is judged on the percentile of per-request time per output token (`tpot_s`), the
    quantity an ITL objective counts per request: a window-mean ITL under the target hides
    the requests that lived through the busiest batches. The worker's buckets (the agent's
    `--custom-histogram-buckets`, a millisecond apart up to 20 ms; vLLM's own are 10, 25,
    50 ms) make "more than the percentile's share over the target" exact at a target on the
    grid. The mean ITL (`itl_s`) stands in while no request finished in the window, and the
    decode capacity fit learns from it. Prefill pods finish each request after its first
    token, so only decode is asked for it.

    Prefill also reports the percentile of the time requests waited in the engine's queue
    (`queue_time_s`): the part of TTFT that more replicas shorten. The worker's buckets for
    it (the agent's, finer than vLLM's first 0.3 s) resolve the waits of a sub-second TTFT
    target."""
    per_request = {"tpot_s": quantile(target, TPOT, percentile, window_s)}
    queueing = {"queue_time_s": quantile(target, QUEUE_TIME, percentile, window_s)}
    return {
        "ttft_s": quantile(target, TTFT, percentile, window_s),
        "itl_s": mean(target, ITL, window_s),
        **(per_request if target.role == "decode" else queueing),
        "prompt_tokens_rate_peak": peak_rate(target, PROMPT_TOKENS, window_s),
        "request_rate": rate(target, REQUESTS, window_s),
        "prompt_tokens_rate": rate(target, PROMPT_TOKENS, window_s),
        "generation_tokens_rate": rate(target, GENERATION_TOKENS, window_s),
        "num_requests_waiting": gauge_sum(target, WAITING, window_s),
        "waiting_growth": growth(target, WAITING, window_s),
        "prompt_arrivals_peak": peak_arrivals(target, window_s),
        "kv_cache_usage": gauge_mean(target, KV_USAGE, window_s),
    }


def slo_bucket_queries(namespace: str, service: str, window_s: float) -> dict[str, str]:
    """The histograms SLO attainment is estimated from (`attainment.py`), keyed by the
    `policy.MetricsWindow` field each fills: the prefill pods' TTFT, the decode pods'
    per-request time per output token (a request's mean ITL)."""
    return {
        "ttft_buckets": buckets(RoleSeries(namespace, service, "prefill"), TTFT, window_s),
        "tpot_buckets": buckets(RoleSeries(namespace, service, "decode"), TPOT, window_s),
    }
