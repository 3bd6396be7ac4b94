"""SLO attainment from histogram buckets (`attainment.py`): exact on a bucket bound, the inverse
of PromQL's histogram_quantile inside a bucket, unknown where the buckets cannot tell."""

from __future__ import annotations

import math

import pytest

from pdfleet.autoscale.attainment import Buckets, share_within, slo_attainment

INF = math.inf
# vLLM's TTFT bounds up to 2.5 s, with cumulative rates (requests/s) at each.
TTFT: Buckets = (
    (0.1, 0.0), (0.25, 1.0), (0.5, 4.0), (0.75, 7.0), (1.0, 9.0), (2.5, 10.0), (INF, 10.0),
)  # fmt: skip


def histogram_quantile(q: float, buckets: Buckets) -> float:
    """PromQL's histogram_quantile of a classic histogram (promql/quantile.go)."""
    total = buckets[-1][1]
    rank = q * total
    index = next(i for i, (_, count) in enumerate(buckets[:-1]) if count >= rank)
    start, below = (0.0, 0.0) if index == 0 else buckets[index - 1]
    end, count = buckets[index]
    return start + (end - start) * (rank - below) / (count - below)


@pytest.mark.parametrize(("target", "share"), [(0.5, 0.4), (1.0, 0.9), (2.5, 1.0), (0.1, 0.0)])
def test_a_target_on_a_bucket_bound_is_exact(target: float, share: float) -> None:
    assert share_within(TTFT, target) == pytest.approx(share)


@pytest.mark.parametrize("target", [0.3, 0.6, 0.8, 0.95, 1.7])
def test_inside_a_bucket_it_inverts_histogram_quantile(target: float) -> None:
    share = share_within(TTFT, target)
    assert histogram_quantile(share, TTFT) == pytest.approx(target)
    # So the TTFT alert (quantile above target) and the attainment agree.
    assert (histogram_quantile(0.9, TTFT) > target) == (share < 0.9)


def test_an_empty_bucket_around_the_target_is_exact() -> None:
    assert share_within(TTFT, 0.05) == 0.0  # nothing at or under 0.1 s
    assert share_within(TTFT, 5.0) == 1.0  # nothing above 2.5 s


@pytest.mark.parametrize(
    ("name", "buckets", "target"),
    [
        # vLLM's lowest ITL bucket is 10 ms: a 6 ms target inside it cannot be placed.
        ("target inside the occupied lowest bucket", ((0.01, 8.0), (0.025, 9.0), (INF, 9.0)),
         0.006),
        ("target beyond the last finite bound", ((0.01, 8.0), (0.025, 9.0), (INF, 10.0)), 0.05),
        ("no observations", ((0.01, 0.0), (INF, 0.0)), 0.02),
        ("no +Inf bucket", ((0.01, 1.0), (0.025, 2.0)), 0.02),
        ("no buckets", (), 0.02),
    ],
)  # fmt: skip
def test_unknown_where_the_buckets_cannot_tell(name: str, buckets: Buckets, target: float) -> None:
    assert math.isnan(share_within(buckets, target)), name


def test_unsorted_and_dipping_rates_are_read_like_promql() -> None:
    # rate() over separately scraped buckets can leave one a hair below the one under it.
    dipping = ((INF, 10.0), (0.5, 3.9), (0.25, 4.0), (1.0, 9.0))
    assert share_within(dipping, 0.5) == pytest.approx(0.4)


def test_both_is_the_product_and_unknown_when_either_is() -> None:
    tpot: Buckets = ((0.01, 0.0), (0.025, 8.0), (0.05, 10.0), (INF, 10.0))
    shares = slo_attainment(TTFT, tpot, 0.5, 0.025)
    assert shares == pytest.approx({"ttft": 0.4, "itl": 0.8, "both": 0.32})
    unknown = slo_attainment(TTFT, (), 0.5, 0.025)
    assert unknown["ttft"] == pytest.approx(0.4)
    assert math.isnan(unknown["itl"]) and math.isnan(unknown["both"])
