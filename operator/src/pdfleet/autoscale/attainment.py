"""SLO attainment: the share of a window's requests that met their latency targets, estimated
from Prometheus histogram buckets (pure).

Where it fits: `metrics.PrometheusSource` reads the bucket rates of the prefill pods' TTFT and
of the decode pods' per-request time per output token into the `MetricsWindow`;
`actuator.outcome_of` turns them into `status.slo.attainment` and the operator's
`pdfleet_slo_attainment_ratio` series. The policy does not read them.

Per SLO: `ttft` is the share of requests whose TTFT (prefill pods, as `status.slo.ttft`) met
its target; `itl` the share whose time per output token, the mean of one request's
inter-token latencies (decode pods), met the ITL target, which is how the benchmark counts a
request as served within the ITL SLO; `both` their product, the share meeting both. The
product takes a request's two latencies as independent, which disaggregation makes close to
true: separate pools produce them.
"""

from __future__ import annotations

import itertools
import math

Buckets = tuple[tuple[float, float], ...]
"""(upper bound `le`, cumulative count or rate) of one histogram, ascending, ending at +Inf."""

SLOS = ("ttft", "itl", "both")


def share_within(buckets: Buckets, target: float) -> float:
    """Estimated share of a histogram's observations at or under `target`.

    Inside the bucket that holds the target the observations are taken to be spread evenly,
    the assumption PromQL's `histogram_quantile` makes, so this is its inverse: the share is at
    least q exactly when that q-quantile is at most the target. A target on a bucket bound
    is exact. NaN when there is nothing to estimate from (no observations, no +Inf bucket),
    and when the target lies inside an occupied lowest or +Inf bucket: nothing says where in
    it those observations lie (PromQL spreads the lowest one evenly from zero, far off for
    latencies, which have a floor; the workers' lowest ITL bucket is 5 ms).
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    # rate() over separately scraped buckets can leave one a little below the bucket under
    # it; like histogram_quantile, read the cumulative counts as non-decreasing.
    counts = list(itertools.accumulate((count for _, count in ordered), max))
    total = counts[-1]
    if not total > 0:
        return math.nan
    lower, below = 0.0, 0.0
    for index, ((bound, _), count) in enumerate(zip(ordered, counts, strict=True)):
        if target >= bound:
            lower, below = bound, count
            continue
        inside = count - below
        if inside == 0 or target == lower:  # nothing to place, or the target is a bound
            break
        if index == 0 or bound == math.inf:
            return math.nan
        return (below + inside * (target - lower) / (bound - lower)) / total
    return below / total


def slo_attainment(
    ttft: Buckets, tpot: Buckets, ttft_target_s: float, itl_target_s: float
) -> dict[str, float]:
    """Attainment per SLO (`SLOS`), NaN where unknown (see the module docstring)."""
    first_token, per_token = share_within(ttft, ttft_target_s), share_within(tpot, itl_target_s)
    return dict(zip(SLOS, (first_token, per_token, first_token * per_token), strict=True))
