"""Tests of the trace loaders and the fleet simulator (`traces.py`, `sim.py`), small inputs."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pdfleet.autoscale.metrics import PrometheusSource
from pdfleet.autoscale.policy import MetricsWindow, RoleReplicas
from pdfleet_lab import bench, heldout, traces
from pdfleet_lab.bench import RunSummary, at_equal_cost, count_flaps
from pdfleet_lab.oracle import Fronts, SplitResult, cheapest_plan, clairvoyant, first_window_at
from pdfleet_lab.sim import SimConfig, fixed, simulate
from pdfleet_worker.perfmodel import preset

CFG = SimConfig(perf=preset("llama-3.1-8b-h200"), startup_s=30.0, interval_s=10.0)


def _wl(n: int, gap: float, isl: int = 1000, osl: int = 50) -> traces.Workload:
    return traces.Workload("t", tuple(i * gap for i in range(n)), (isl,) * n, (osl,) * n)


def test_mooncake_plain_and_gzip(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 2000, "input_length": 10, "output_length": 3, "hash_ids": [1]},
        {"timestamp": 500, "input_length": 7, "output_length": 0, "hash_ids": [2]},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    (tmp_path / "a.jsonl").write_text(text)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    for name in ("a.jsonl", "b.jsonl.gz"):
        wl = traces.load(tmp_path / name)
        assert wl.arrival_s == (0.5, 2.0)
        assert wl.output_tokens == (1, 3)  # clamped to one token


def test_azure_csv(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    wl = traces.load(tmp_path / "x.csv", speedup=2.0)
    assert wl.input_tokens == (374, 396)
    assert abs(wl.arrival_s[1] - 4.314579 / 2) < 1e-6


def test_step_draws_sizes_from_the_trace_and_multiplies_the_rate() -> None:
    sizes = traces.Workload("w", (0.0, 1.0), (100, 300), (10, 30))
    wl = traces.step(sizes, rate_rps=2.0, factor=10.0, at_s=500.0, duration_s=1000.0, name="s")
    before = sum(1 for t in wl.arrival_s if t < 500.0)
    after = len(wl) - before
    assert 800 < before < 1200 and 8000 < after < 12000  # Poisson: about 1,000 and 10,000
    assert set(wl.input_tokens) == {100, 300} and wl.arrival_s[-1] < 1000.0
    assert traces.step(sizes, 2.0, 10.0, 500.0, 1000.0, "s") == wl  # seeded


def test_overlay_shifts_each_copy_and_drops_what_passes_the_end() -> None:
    source = _wl(11, 10.0)  # arrivals 0, 10, ..., 100
    wl = traces.overlay(source, copies=3, seed=4, name="o", max_offset_s=15.0)
    assert wl.name == "o" and wl.arrival_s == tuple(sorted(wl.arrival_s))
    assert max(wl.arrival_s) <= source.duration_s
    # each copy loses the one or two arrivals its offset (under 15 s) pushes past 100 s
    assert 3 * 11 - 6 <= len(wl) <= 3 * 11 - 3
    assert traces.overlay(source, 3, 4, "o", 15.0) == wl  # seeded
    assert traces.overlay(source, 1, 4, "o", 0.0).arrival_s == source.arrival_s


def test_poisson_follows_the_rate_and_the_sizes_of_each_phase() -> None:
    short = traces.Workload("a", (0.0,), (100,), (10,))
    long = traces.Workload("b", (0.0,), (5000,), (2,))
    wl = traces.poisson(
        lambda t: 20.0 if t < 500.0 else 2.0,
        lambda t: short if t < 500.0 else long,
        1000.0,
        name="p",
        seed=3,
    )
    early = [i for t, i in zip(wl.arrival_s, wl.input_tokens, strict=True) if t < 500.0]
    late = [i for t, i in zip(wl.arrival_s, wl.input_tokens, strict=True) if t >= 500.0]
    assert 9000 < len(early) < 11000 and 800 < len(late) < 1200  # about 10,000 and 1,000
    assert set(early) == {100} and set(late) == {5000}
    assert traces.poisson(lambda t: 0.0, lambda t: short, 100.0, "z", 1).arrival_s == ()


def test_heldout_workloads_are_built_from_both_sources_with_their_slos() -> None:
    conv = traces.Workload(
        "conv", tuple(float(t) for t in range(0, 3600, 2)), (500,) * 1800, (50,) * 1800
    )
    code = traces.Workload(
        "code", tuple(float(t) for t in range(0, 3600, 4)), (3000,) * 900, (5,) * 900
    )
    src = heldout.Sources(conv=conv, code=code)
    built = {name: make(src) for name, make in heldout.BUILDERS.items()}
    assert set(built) == set(heldout.SLOS)
    for name, wl in built.items():
        assert wl.name[:2] == name and len(wl) > 0 and wl.duration_s <= heldout.HOUR_S
        assert bench.WORKLOAD_SLOS[name] == heldout.SLOS[name]
    assert len(built["H1"]) > 5 * len(conv) and set(built["H2"].input_tokens) == {3000}
    shift = built["H3"]
    assert {i for t, i in zip(shift.arrival_s, shift.input_tokens, strict=True) if t < 1800} == {
        3000
    }
    assert {i for t, i in zip(shift.arrival_s, shift.input_tokens, strict=True) if t >= 1800} == {
        500
    }
    lull = sum(1 for t in built["H5"].arrival_s if 1200 <= t < 2400)
    assert lull < 0.2 * sum(1 for t in built["H5"].arrival_s if t < 1200)

    def rate(name: str, start: float, end: float) -> float:
        return sum(1 for t in built[name].arrival_s if start <= t < end) / (end - start)

    assert rate("H6", 1500, 1560) > 3 * rate("H6", 900, 1500)  # the spike every 15 minutes
    flip = built["H7"]
    sizes = {int(t // 600): i for t, i in zip(flip.arrival_s, flip.input_tokens, strict=True)}
    assert [sizes[k] for k in range(6)] == [500, 3000] * 3
    assert rate("H8", 300, 600) < 0.2 * rate("H8", 600, 900)
    assert len(built["H9"]) > 9 * len(conv)
    long = sum(1 for i in built["P1"].input_tokens if i == 500 + heldout.LONG_CONTEXT_TOKENS)
    assert set(built["P1"].input_tokens) == {500, 500 + heldout.LONG_CONTEXT_TOKENS}
    assert 0.08 < long / len(built["P1"]) < 0.17  # every eighth prompt of the sources


def test_to_mooncake_round_trips_with_a_hash_id_per_block(tmp_path: Path) -> None:
    wl = traces.Workload("m", (0.25, 1.5), (512, 513), (7, 1))
    records = list(traces.to_mooncake(wl))
    assert [r["hash_ids"] for r in records] == [[0], [1, 2]]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert traces.load(path) == wl


def test_light_load_meets_slo_and_counts_gpu_time() -> None:
    res = simulate(_wl(200, 0.5), CFG, fixed(1, 1), (1, 1))
    assert res.attainment(1.0, 0.015) == 1.0
    assert abs(res.gpu_hours - 2 * res.duration_s / 3600) < 1e-9


def test_overload_queues_and_misses_ttft() -> None:
    # 8k-token prompts every 0.1 s need ~2 s of prefill per second on one replica
    res = simulate(_wl(300, 0.1, isl=8000), CFG, fixed(1, 1), (1, 1))
    assert res.attainment(1.0, 1.0) < 0.5


def test_the_prefill_queue_time_is_the_wait_before_a_first_step() -> None:
    """Read through the operator's queries: near nothing at light load, the backlog's wait
    (seconds, and growing) under overload, while TTFT follows it."""

    def waits(wl: traces.Workload) -> list[tuple[float, float]]:
        seen: list[tuple[float, float]] = []

        def hold(now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow) -> tuple[int, int]:
            if m.prefill is not None and math.isfinite(m.prefill.queue_time_s):
                seen.append((m.prefill.queue_time_s, m.prefill.ttft_s))
            return p.current, d.current

        simulate(wl, CFG, hold, (1, 1))
        return seen

    light = waits(_wl(300, 0.5))
    assert light and all(wait < 0.005 < ttft for wait, ttft in light), light
    heavy = waits(_wl(1500, 0.1, isl=8000))
    assert len(heavy) > 3 and heavy[-1][0] > 20 and heavy[-1][0] > 2 * heavy[0][0], heavy
    # the two read from different buckets (vLLM's TTFT bounds, the agent's request latency)
    assert all(ttft >= 0.5 * wait for wait, ttft in heavy), heavy


def test_scale_up_waits_for_startup_and_drain_loses_nothing() -> None:
    calls: list[RoleReplicas] = []

    def ctl(now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow) -> tuple[int, int]:
        calls.append(p)
        return (3, 2) if now < 60 else (1, 1)

    res = simulate(_wl(600, 0.2), CFG, ctl, (1, 1))
    assert calls[1].current == 3 and calls[1].ready == 1  # starting is not ready
    assert any(c.ready == 3 for c in calls)
    assert all(t == t for t in res.ttft_s)  # every request served (no NaN)
    assert count_flaps(res.scale_events, 300.0) == 2  # up then down, per role


def _summary(gpu_hours: float) -> RunSummary:
    return RunSummary("planner", 0.5, 0.5, 1.0, gpu_hours, 1.0, 0, 0, 0.1, 0.01, 0.0)


def test_equal_cost_baseline_is_the_first_headroom_spending_as_much() -> None:
    tried: list[float] = []

    def run(headroom: float) -> RunSummary:
        tried.append(headroom)
        return _summary(2.0 * headroom)

    found = at_equal_cost(run, 3.1, (1.25, 1.5, 1.75, 2.0))
    assert found is not None and found[0] == 1.75 and found[1].gpu_hours == 3.5
    assert tried == [1.25, 1.5, 1.75]  # stops at the first one that costs enough


def test_equal_cost_baseline_is_none_when_it_never_spends_as_much() -> None:
    assert at_equal_cost(lambda h: _summary(h), 10.0, (1.0, 2.0)) is None


def test_cluster_full_leaves_workers_pending() -> None:
    small = SimConfig(perf=CFG.perf, startup_s=30.0, interval_s=10.0, cluster_gpus=3)
    seen: list[RoleReplicas] = []

    def ctl(now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow) -> tuple[int, int]:
        seen.append(p)
        return 4, 1

    simulate(_wl(100, 0.5), small, ctl, (1, 1))
    assert seen[-1].pending == 2 and seen[-1].ready == 2


def test_peak_rate_sees_a_burst_the_mean_hides() -> None:
    from pdfleet_lab.sim import _Window

    w = _Window(60.0)
    for i in range(10):  # 10 x 1000 tokens within 5 s, nothing for the other 55 s
        w.add(30.0 + 0.5 * i, 1000.0)
    assert w.total() / 60.0 == 10_000.0 / 60.0
    assert w.peak_rate(60.0, 60.0, 15.0, 5.0) == 10_000.0 / 15.0


@pytest.mark.parametrize(
    ("name", "options", "need", "want"),
    [
        # greedy by gain per GPU takes B's step first, then A's two steps: cost 5, not 4
        (
            "exact, not greedy",
            [[(1.0, 0.0), (2.0, 10.0), (3.0, 100.0)], [(1.0, 0.0), (2.0, 50.0)]],
            100.0,
            [2, 0],
        ),
        ("cheapest when the target is easy", [[(1.0, 90.0), (2.0, 100.0)]], 80.0, [0]),
        ("most good requests when unreachable", [[(1.0, 50.0), (3.0, 60.0)]], 99.0, [1]),
    ],
)
def test_cheapest_plan(
    name: str, options: list[list[tuple[float, float]]], need: float, want: list[int]
) -> None:
    assert cheapest_plan(options, need) == want, name


# two windows: 1 or 3 GPUs first, then 1 or 2; 30 good requests needed
_RISE = [[(1.0, 10.0), (3.0, 20.0)], [(1.0, 10.0), (2.0, 20.0)]]


@pytest.mark.parametrize(
    ("name", "startup_s", "want"),
    [
        ("no start-up: rise in the second window (3)", 0.0, [0, 1]),
        # the rise adds a GPU started 2 earlier: 3 + 2 = 5 against 4 for starting high
        ("start-up paid: start high and shrink (4)", 2.0, [1, 0]),
    ],
)
def test_cheapest_plan_paying_startup(name: str, startup_s: float, want: list[int]) -> None:
    assert cheapest_plan(_RISE, 30.0, [[1, 3], [1, 2]], startup_s) == want, name


def test_the_benchmark_reads_each_window_through_the_operators_metrics_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One signal path: every window a controller gets in the simulator is what the
    operator's PrometheusSource.window answered, over series the engines' scrapes wrote."""
    answered: list[MetricsWindow] = []
    window = PrometheusSource.window

    def spy(source: PrometheusSource, *args: Any) -> MetricsWindow:
        answered.append(window(source, *args))
        return answered[-1]

    monkeypatch.setattr(PrometheusSource, "window", spy)
    received: list[MetricsWindow] = []

    def hold(now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow) -> tuple[int, int]:
        received.append(m)
        return p.current, d.current

    simulate(_wl(600, 0.25), CFG, hold, (1, 1))
    assert received and all(got is read for got, read in zip(received, answered, strict=True))
    served = [m for m in received[6:] if m.prefill and m.decode]
    assert len(served) == len(received) - 6  # both roles answer once a window has two scrapes
    # Served prompt tokens: 1000 every 0.25 s, as the prefill engine counts them.
    assert all(m.prefill and 3000 < m.prefill.prompt_tokens_rate < 5000 for m in served)


def test_the_bound_from_the_initial_split_and_with_every_window_at_the_target() -> None:
    """Two 300 s windows of 100 requests each. Free, the bound buys 2P1D for the burst in
    the first and 1P1D after (95 %); held at 1P1D through the first (60 % there), no plan
    reaches 95 %, and the one that comes closest takes 3P1D for the second."""
    wl = traces.Workload("w", tuple(float(t) for t in range(0, 600, 3)), (1,) * 200, (2,) * 200)
    first, second = wl.window(0, 300), wl.window(300, 600)

    def split(p: int, att: float) -> SplitResult:
        return SplitResult(p, 1, att, 0.0, 100)

    fronts: Fronts = [
        (0.0, first, [split(1, 0.60), split(2, 0.97)]),
        (300.0, second, [split(1, 0.93), split(2, 0.96), split(3, 1.0)]),
    ]
    free = clairvoyant(wl, CFG, 1.0, 1.0, 8, 0.95, fronts=fronts)
    held = clairvoyant(wl, CFG, 1.0, 1.0, 8, 0.95, fronts=first_window_at(fronts, split(1, 0.6)))
    assert [(p, d) for _, p, d, _ in free.plan] == [(2, 1), (1, 1)]
    assert free.attainment == pytest.approx(0.95)
    # 60 + 100 = 160 of 200 good: 80 %, the most any plan starting at 1P1D reaches
    assert [(p, d) for _, p, d, _ in held.plan] == [(1, 1), (3, 1)]
    assert held.attainment == pytest.approx(0.80)
    assert held.gpu_hours > free.gpu_hours
    # Every window at 95 % itself: no window's misses paid for by another's.
    each = clairvoyant(wl, CFG, 1.0, 1.0, 8, 0.95, fronts=fronts, every_window=True)
    assert [(p, d) for _, p, d, _ in each.plan] == [(2, 1), (2, 1)]
    assert each.attainment == pytest.approx(0.965)
    assert each.gpu_hours > free.gpu_hours


def test_each_policy_run_is_compared_with_every_reference_written() -> None:
    """A reference missing from the results (e.g. the bound not computed) gives no ratio."""
    out: dict[str, Any] = {
        "runs": {"pdfleet": {"gpu_hours": 3.0}, "fixed": {"gpu_hours": 9.0}},
        "cheapest_fixed": {"gpu_hours": 4.0},
        "clairvoyant": {"gpu_hours": 2.0},
        "clairvoyant_every_window": {"gpu_hours": 2.5},
    }
    assert bench._ratios(out) == {
        "pdfleet": {"vs_cheapest_fixed": 0.75, "vs_clairvoyant": 1.5, "vs_every_window": 1.2}
    }
