"""Tests of the online capacity model (`pdfleet.autoscale.capacity`)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pdfleet.autoscale.capacity import (
    Bracket,
    RoleCapacity,
    anchored,
    bracket_capacity,
    capacity,
    fitted,
    observe,
    observe_bracket,
    violation_cap,
)


def _fit(points: list[tuple[float, float]], target: float) -> RoleCapacity:
    s = RoleCapacity()
    for i, (x, y) in enumerate(points):
        s = observe(s, float(i), x, y, target, half_life_s=1e9)
    return s


def test_recovers_queue_capacity() -> None:
    # y = s / (1 - x/mu) with s = 0.1, mu = 100: at target 1.0 capacity is mu (1 - s/T) = 90
    pts = [(x, 0.1 / (1 - x / 100)) for x in (10.0, 30.0, 50.0, 70.0)]
    assert fitted(_fit(pts, 1.0), 1.0) == pytest.approx(90.0)


@pytest.mark.parametrize(
    ("name", "points", "prior", "want"),
    [
        ("too few points: prior", [(10.0, 0.1)], 50.0, 50.0),
        ("flat latency: prior", [(10.0, 0.1), (20.0, 0.1), (30.0, 0.1)], 50.0, 50.0),
        ("nothing known", [], None, None),
    ],
)
def test_fallbacks(
    name: str, points: list[tuple[float, float]], prior: float | None, want: float | None
) -> None:
    assert capacity(_fit(points, 1.0), 1.0, prior) == want, name


def test_anchored_fit_recovers_queue_capacity_from_one_load_level() -> None:
    # decode ITL = d0 / (1 - x/mu), d0 = 5 ms, mu = 100; one load level only, so the free fit
    # has no spread; the idle latency (seen earlier) gives the second point
    s = replace(_fit([(20.0, 0.005 / (1 - 20 / 100))] * 4, 0.006), floor=0.005)
    assert fitted(s, 0.006) is None
    assert anchored(s, 0.006) == pytest.approx(100 * (1 - 5 / 6))


def test_flat_latency_just_under_target_is_room_within_the_extrapolation_bound() -> None:
    # ITL 5.1-5.3 ms against 6 ms at ~24 tokens/s per replica: flat for the free fit, but the
    # anchored line puts the target several times further; planned for at most 3x what held
    pts = [(22.0, 0.0052), (24.0, 0.0051), (23.0, 0.0053), (24.0, 0.0052)]
    s = _fit(pts, 0.006)
    assert fitted(s, 0.006) is None
    assert capacity(s, 0.006, None) == pytest.approx(3 * 24.0)


@pytest.mark.parametrize(
    ("name", "points", "target", "want"),
    [
        ("too few windows", [(10.0, 0.005), (20.0, 0.006)], 0.01, None),
        ("no rise above the floor", [(10.0, 0.005)] * 4, 0.01, None),
        ("idle already over target", [(10.0, 0.02), (20.0, 0.03), (30.0, 0.04)] * 2, 0.01, 0.0),
    ],
)
def test_anchored_fit_needs_a_rise(
    name: str, points: list[tuple[float, float]], target: float, want: float | None
) -> None:
    assert anchored(_fit(points, target), target) == want, name


def test_violation_cuts_estimate_boundedly() -> None:
    s = observe(RoleCapacity(), 0.0, 80.0, 2.0, 1.0, 1e9, estimate=100.0)
    assert s.ceiling == pytest.approx(40.0)
    # the prior says 100, the violation 40: cut, at most by half
    assert capacity(s, 1.0, 100.0) == pytest.approx(50.0)


def test_a_violation_caps_where_the_queue_model_puts_the_target() -> None:
    # idle 6 ms, 30 ms at 10k per replica: the line of 1/ITL through both reaches 1/15 ms
    # at 7.5k (a proportional cut, x * target / y, would say 5k)
    assert violation_cap(10_000, 0.030, 0.015, 0.006) == pytest.approx(7_500)
    assert violation_cap(10_000, 0.030, 0.015, math.inf) == pytest.approx(5_000)


def test_burst_at_low_load_is_not_a_capacity_limit() -> None:
    s = observe(RoleCapacity(), 0.0, 10.0, 2.0, 1.0, 1e9, estimate=100.0)
    assert math.isinf(s.ceiling)


def test_decay_forgets() -> None:
    s = observe(RoleCapacity(), 0.0, 10.0, 0.1, 1.0, half_life_s=10.0)
    s = observe(s, 100.0, math.nan, 0.1, 1.0, half_life_s=10.0)
    assert s.weight < 0.01


# --- saturation bracket (prefill) ----------------------------------------------------------


def _bracket(points: list[tuple[float, float, float]], prior: float | None = 100.0) -> Bracket:
    s = Bracket()
    for at, x, y in points:
        s = observe_bracket(s, at, x, y, 1.0, half_life_s=1e9, prior=prior)
    return s


@pytest.mark.parametrize(
    ("name", "points", "want"),
    [
        ("nothing seen: the prior", [], 100.0),
        ("held under load: probes up", [(0.0, 90.0, 0.2)], 102.0),
        ("held lightly: no probe", [(0.0, 20.0, 0.2)], 100.0),
        ("violation at the estimate: cut", [(0.0, 100.0, 3.0)], 85.0),
        ("violation above the estimate confirms it", [(0.0, 120.0, 3.0)], 100.0),
        (
            "violation at a load that held: a burst, no cut",
            [(0.0, 90.0, 0.2), (15.0, 80.0, 3.0)],
            102.0,
        ),
        # the second window does not cut again, but what broke bounds the estimate
        ("overlapping windows cut once", [(0.0, 100.0, 3.0), (15.0, 80.0, 3.0)], 0.95 * 80.0),
        ("never far above what held", [(float(i), 90.0, 0.2) for i in range(40)], 125.0),
        (
            "never at what broke",
            [(0.0, 100.0, 0.2), (1.0, 104.0, 3.0)] + [(100.0 + i, 100.0, 0.2) for i in range(20)],
            0.95 * 104.0,
        ),
    ],
)
def test_bracket(name: str, points: list[tuple[float, float, float]], want: float) -> None:
    got = bracket_capacity(_bracket(points), 100.0)
    assert got == pytest.approx(want), name


def test_a_violation_while_the_queue_shrinks_is_not_a_capacity_limit() -> None:
    # a pool working off a backlog serves at full speed and misses the target on the wait
    # of prompts queued before: neither what broke nor the estimate moves
    s = observe_bracket(Bracket(), 0.0, 100.0, 3.0, 1.0, 1e9, 100.0, draining=True)
    assert math.isinf(s.broke)
    assert bracket_capacity(s, 100.0) == 100.0
    s = observe_bracket(Bracket(), 0.0, 100.0, 3.0, 1.0, 1e9, 100.0)
    assert s.broke == 100.0
    assert bracket_capacity(s, 100.0) == 85.0


def test_bracket_without_prior_uses_what_held() -> None:
    assert bracket_capacity(_bracket([(0.0, 40.0, 0.2)], prior=None), None) == 40.0
    assert bracket_capacity(Bracket(), None) is None


def test_the_estimate_probes_up_from_what_held_not_from_a_light_first_window() -> None:
    # the first windows were light (1k/s per replica): the estimate started there; once 20k/s
    # has held, probing continues from 20k (+2 % per window under load), not from 1k
    light = [(float(t), 1_000.0, 0.1) for t in range(0, 60, 15)]
    busy = [(float(t), 20_000.0, 0.3) for t in range(60, 150, 15)]
    got = bracket_capacity(_bracket(light + busy, prior=None), None)
    assert got is not None and got > 1.08 * 20_000
