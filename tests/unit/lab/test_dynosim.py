"""The pure parts of the DynoSim harness (pdfleet_lab.dynosim), without DynoSim installed:
the timing table, DynoSim's tick data into vLLM metric families and the operator's window,
the ticker driving a controller, and the result rows."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from pdfleet.autoscale.policy import MetricsWindow, PolicyConfig, RoleReplicas
from pdfleet_lab import bench, heldout
from pdfleet_lab.baselines import PolicyController
from pdfleet_lab.dynosim import harness, results, signals, ticker
from pdfleet_lab.dynosim import table as tables
from pdfleet_lab.exporter import EngineFamilies
from pdfleet_lab.traces import load


def _snap(worker: int, wall: float, **kw: float) -> dict[str, Any]:
    base: dict[str, Any] = {
        "worker_id": worker,
        "wall_time": wall,
        "num_prefill_requests": 0,
        "sum_prefill_tokens": 0,
        "sum_prefill_kv_tokens": 0,
        "num_decode_requests": 0,
        "sum_decode_kv_tokens": 0,
        "num_queued_prefill": 0,
        "sum_queued_prefill_tokens": 0,
        "num_queued_decode": 0,
        "sum_queued_decode_kv_tokens": 0,
    }
    return {**base, **kw}


def _linear_table() -> tables.TimingTable:
    # prefill 1 ms + 0.02 ms/token; decode 5 ms + 1e-5 ms per active KV token
    return tables.build(lambda n: 1.0 + 0.02 * n, lambda b, c: 5.0 + 1e-5 * b * c)


def test_dynamo_is_not_imported() -> None:
    assert "dynamo" not in sys.modules
    assert "pdfleet_lab.dynosim.runtime" not in sys.modules


# --- table ------------------------------------------------------------------------------


def test_grid_follows_the_recipe() -> None:
    pts = tables.prefill_points()
    assert pts[0] == 16 and pts[-1] == 32768
    assert pts == sorted(set(pts))
    assert len(pts) == 95  # 32 + 64 points, 1024 in both
    t = _linear_table()
    assert len(t.decode_active_kv_tokens) == 60 and len(t.decode_context_length) == 60
    assert all(len(row) == 60 for row in t.decode_itl)
    assert set(t.arrays()) == {
        "prefill_isl",
        "prefill_ttft_ms",
        "decode_active_kv_tokens",
        "decode_context_length",
        "decode_itl",
    }


@pytest.mark.parametrize(
    ("kv", "ctx", "batch"), [(0.0, 100.0, 1), (4096.0, 2048.0, 2), (1e6, 1.0, 1024)]
)
def test_decode_batch_fills_the_kv(kv: float, ctx: float, batch: int) -> None:
    assert tables.decode_batch(kv, ctx) == batch


def test_interpolation_reads_the_table_back() -> None:
    t = _linear_table()
    assert tables.prefill_ms(t, 4096) == pytest.approx(1.0 + 0.02 * 4096)
    assert tables.prefill_ms(t, 10) == pytest.approx(t.prefill_ttft_ms[0])  # clamped
    # the grid samples b * c only through round(kv / c) * c, close to kv
    assert tables.decode_ms(t, 128, 2048) == pytest.approx(5.0 + 1e-5 * 128 * 2048, rel=0.02)


def test_from_arrays_round_trips_and_refuses_bad_times() -> None:
    t = _linear_table()
    assert tables.from_arrays(t.arrays()) == t
    bad = {**t.arrays(), "prefill_ttft_ms": [0.0] * len(t.prefill_isl)}
    with pytest.raises(ValueError):
        tables.from_arrays(bad)


def test_capacity_priors_meet_the_slos() -> None:
    t = _linear_table()
    prefill, decode = tables.capacity_priors(t, 1.0, 0.015, kv_tokens=800_000)
    # prefill: 4 x 2048 tokens in one 8192-token pass of 164.84 ms, times 0.8
    assert prefill == pytest.approx(4 * 2048 / (1.0 + 0.02 * 8192) * 1000 * 0.8, rel=0.01)
    # decode: the largest batch whose step stays within 15 ms (all 256 seats), context 2112
    step_ms = 5.0 + 1e-5 * 256 * 2112
    assert decode == pytest.approx(256 / (128 * step_ms / 1000) * 128, rel=0.05)


# --- signals ----------------------------------------------------------------------------


def test_prefill_ttft_samples_wait_for_the_queue() -> None:
    passes = [
        _snap(0, 0.1, sum_prefill_tokens=8192, sum_queued_prefill_tokens=16384),
        _snap(0, 0.1, sum_prefill_tokens=8192),
    ]
    out = signals.prefill_ttft_samples(passes, tick_s=1.0, idle_ttft_s=0.02)
    assert out[0] == pytest.approx((0.2 + 0.1, 0.1))  # two passes of queue, then its own
    assert out[1] == pytest.approx((0.1, 0.1))
    assert out[2] == pytest.approx((0.02, 0.8))  # idle the rest of the tick
    assert sum(w for _, w in signals.scaled(out, 10.0)) == pytest.approx(10.0)
    assert signals.scaled(out, 0.0) == []
    # the queue time is the same waits without the pass, none while idle
    waits = [v for pair in signals.prefill_queue_samples(passes, tick_s=1.0) for v in pair]
    assert waits == pytest.approx([0.2, 0.1, 0.0, 0.1, 0.0, 0.8])


def test_apply_prefill_counts_tokens_requests_and_first_tokens() -> None:
    engine = EngineFamilies("prefill", "prefill-0")
    passes = [_snap(0, 0.05, sum_prefill_tokens=3000), _snap(0, 0.05, sum_prefill_tokens=1000)]
    n = signals.apply_prefill(engine, passes, tick_s=15.0, mean_isl=1000.0, idle_ttft_s=0.02)
    assert n == pytest.approx(4.0)
    assert engine.prompt_tokens == 4000
    assert engine.requests == pytest.approx(4.0)
    assert sum(engine.ttft.counts) == pytest.approx(4.0)
    assert engine.generation_tokens == pytest.approx(4.0)  # each request's first token


def test_apply_decode_observes_every_token_at_its_step() -> None:
    engine = EngineFamilies("decode", "decode-0")
    passes = [
        _snap(0, 0.010, num_decode_requests=100, sum_decode_kv_tokens=200_000),
        _snap(0, 0.020, num_decode_requests=100, sum_decode_kv_tokens=200_100),
    ]
    n = signals.apply_decode(engine, passes, mean_isl=2000.0, mean_osl=50.0, kv_transfer_s=0.005)
    assert engine.generation_tokens == 200
    assert engine.itl.total == pytest.approx(100 * 0.010 + 100 * 0.020)
    assert sum(engine.itl.counts) == 200
    assert n == pytest.approx(4.0)
    # half the requests finish after the first pass, half after both (the run's start)
    assert engine.tpot.total == pytest.approx(2.0 * 0.010 + 2.0 * 0.015)
    assert sum(engine.tpot.counts) == pytest.approx(4.0)
    assert engine.ttft.total == pytest.approx(4.0 * (0.005 + 0.015))
    assert signals.mean_step([]) != signals.mean_step([])  # NaN without decode


def test_request_tpot_is_the_mean_of_the_passes_a_request_lived_through() -> None:
    # five earlier passes at 10 ms, then three at 30 ms; outputs of 3 tokens span 2 passes
    steps = [0.010] * 5 + [0.030] * 3
    out = signals.request_tpot_samples(steps, [10.0, 5.0, 20.0], osl=3.0)
    assert [v for v, _ in out] == pytest.approx([0.020, 0.030, 0.030])
    assert [w for _, w in out] == [10.0, 5.0, 20.0]  # each pass's batch
    # a spike shorter than an output is averaged out, one longer is not
    spike = [0.010] * 100 + [0.040] * 10 + [0.010] * 100
    short = signals.request_tpot_samples(spike, [1.0] * len(spike), osl=101.0)
    assert max(v for v, _ in short) == pytest.approx(0.013)
    long = signals.request_tpot_samples(spike, [1.0] * len(spike), osl=6.0)
    assert max(v for v, _ in long) == pytest.approx(0.040)


def test_the_decode_tpot_percentile_sees_busy_stretches_the_mean_hides() -> None:
    engine = EngineFamilies("decode", "decode-0")
    quiet = [_snap(0, 0.010, num_decode_requests=100)] * 900
    busy = [_snap(0, 0.020, num_decode_requests=100)] * 100
    signals.apply_decode(engine, quiet + busy, 1000.0, 50.0, 0.0)
    mean = engine.itl.total / sum(engine.itl.counts)
    assert mean == pytest.approx(0.011)
    over = sum(c for b, c in zip(engine.tpot.bounds, engine.tpot.counts, strict=False) if b > 0.015)
    assert over / sum(engine.tpot.counts) > 0.05  # more than a p95 allows is over 15 ms


def test_last_load_reads_the_last_pass() -> None:
    passes = [
        _snap(0, 0.01, num_queued_decode=9, sum_decode_kv_tokens=10),
        _snap(0, 0.01, num_queued_decode=3, sum_decode_kv_tokens=400_000),
    ]
    assert signals.last_load(passes, "decode", 800_000) == (3.0, 0.5)
    assert signals.last_load([], "prefill", 800_000) == (0.0, 0.0)
    prefill = [_snap(1, 0.1, num_queued_prefill=4, sum_prefill_tokens=8192)]
    assert signals.last_load(prefill, "prefill", 8192) == (4.0, 1.0)


def test_live_ids_keep_the_lowest_and_the_draining() -> None:
    assert signals.live_ids([0, 1, 2, 3], [0, 3], active=2) == [0, 1, 3]
    assert signals.live_ids([0], [], active=3) == [0, 1, 2]
    assert signals.live_ids([], [], active=0) == []


def _tick(now_ms: float, p: int = 2, d: int = 1, **over: Any) -> dict[str, Any]:
    tick: dict[str, Any] = {
        "now_ms": now_ms,
        "active_prefill_count": p,
        "total_prefill_count": p,
        "active_decode_count": d,
        "total_decode_count": d,
        "prefill_fpm_snapshots": [
            _snap(w, 0.1, sum_prefill_tokens=4000, num_queued_prefill=1) for w in range(p)
        ]
        * 30,
        "decode_fpm_snapshots": [
            _snap(w, 0.01, num_decode_requests=64, sum_decode_kv_tokens=64 * 1100) for w in range(d)
        ]
        * 500,
        "traffic": {"duration_s": 15.0, "num_req": 240, "avg_isl": 1000.0, "avg_osl": 100.0},
    }
    return {**tick, **over}


def _signals() -> signals.FleetSignals:
    t = _linear_table()
    return signals.FleetSignals(
        kv_capacity_tokens=800_000,
        kv_transfer_s_per_token=131072 / 50e9,
        idle_prefill_ms=lambda n: tables.prefill_ms(t, n),
    )


def test_the_operator_reads_the_families_through_its_promql() -> None:
    fleet = _signals()
    for k in range(1, 6):
        fleet.observe(15.0 * k, _tick(15000.0 * k))
    w = fleet.window(75.0)
    assert w.prefill is not None and w.decode is not None
    # 2 workers x 30 passes x 4000 tokens per 15 s
    assert w.prefill.prompt_tokens_rate == pytest.approx(2 * 30 * 4000 / 15.0, rel=0.01)
    assert w.decode.generation_tokens_rate == pytest.approx(500 * 64 / 15.0, rel=0.01)
    assert w.decode.itl_s == pytest.approx(0.01, rel=0.01)
    assert w.prefill.num_requests_waiting == pytest.approx(2.0)
    assert w.decode.kv_cache_usage == pytest.approx(64 * 1100 / 800_000, rel=0.01)
    assert w.prefill.request_rate == pytest.approx(240 / 15.0, rel=0.01)
    assert not math.isnan(w.prefill.ttft_s)
    assert w.problem == ""


# --- ticker -----------------------------------------------------------------------------


def test_ticker_drives_a_controller_and_records_scale_events() -> None:
    seen: list[tuple[float, RoleReplicas, RoleReplicas, MetricsWindow]] = []

    def controller(
        now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow
    ) -> tuple[int, int]:
        seen.append((now, p, d, m))
        return (3, 1) if now >= 30.0 else (p.current, d.current)

    tk = ticker.Ticker(_signals(), controller)
    assert tk.initial_tick_ms() == 15000.0
    assert tk.on_tick(_tick(15000.0)) == {
        "target_prefill": None,
        "target_decode": None,
        "next_tick_ms": 30000.0,
    }
    out = tk.on_tick(_tick(30000.0))
    assert out["target_prefill"] == 3 and out["target_decode"] is None
    assert tk.scale_events == [(30.0, "prefill", 2, 3)]
    # DynoSim's counts: desired (total) is current, active is ready
    tk.on_tick(_tick(45000.0, total_prefill_count=3))
    assert seen[-1][1] == RoleReplicas(current=3, ready=2)
    assert len(tk.timeline) == 3


def test_ticker_runs_pdfleet_policy() -> None:
    cfg = PolicyConfig(ttft_target_s=1.0, itl_target_s=0.015, gpu_budget=12, interval_s=15.0)
    tk = ticker.Ticker(_signals(), PolicyController(cfg))
    for k in range(1, 9):
        out = tk.on_tick(_tick(15000.0 * k))
        assert out["next_tick_ms"] == 15000.0 * (k + 1)
    assert tk.ticks == 8


def test_fixed_split_ticks_only_to_drain() -> None:
    tk = ticker.Ticker(_signals(), None)
    assert tk.initial_tick_ms() == ticker.DRAIN_S * 1000.0
    out = tk.on_tick(_tick(60000.0))
    assert out == {"target_prefill": None, "target_decode": None, "next_tick_ms": 120000.0}
    assert tk.signals.engines == {}  # nothing read, nothing kept


# --- harness and results ----------------------------------------------------------------


def test_window_records_rebase_like_workload_window() -> None:
    recs = [{"timestamp": t, "input_length": 10, "output_length": 2} for t in (0, 299_999, 300_000)]
    assert harness.window_records(recs, 0.0, 300.0) == recs[:2]
    assert harness.window_records(recs, 300.0, 600.0) == [{**recs[2], "timestamp": 0.0}]


def test_trace_file_writes_a_heldout_workload_with_the_same_requests(tmp_path: Path) -> None:
    azure = tmp_path / "traces" / "azure"
    azure.mkdir(parents=True)
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    for kind, tokens in (("conv", 900), ("code", 4000)):
        rows = "".join(f"2023-11-16 18:{m:02d}:00.0000000,{tokens},20\n" for m in range(3))
        (azure / f"AzureLLMInferenceTrace_{kind}.csv").write_text(header + rows)
    path = harness.trace_file("H5", tmp_path / "traces" / "workloads", tmp_path / "work")
    assert path.name == "H5_step_down_up.jsonl"
    assert load(path).arrival_s == pytest.approx(heldout.build("H5", azure).arrival_s)


def test_wall_cap_grows_with_the_trace() -> None:
    s = harness.Settings(table="t.npz")
    assert harness.wall_cap(s, 10_000, policy=False) == pytest.approx(30.0)
    assert harness.wall_cap(s, 10_000, policy=True) > harness.wall_cap(s, 10_000, policy=False)


def test_the_policy_runs_start_where_the_command_line_says() -> None:
    from pdfleet_lab.dynosim.__main__ import parse_args, settings_of

    fixed = ["--table", "t.npz", "--work", "w"]
    assert settings_of(parse_args(fixed)).initial == (2, 1)
    larger = settings_of(parse_args([*fixed, "--initial-prefill", "4", "--initial-decode", "2"]))
    assert larger.initial == (4, 2) and larger.table == "t.npz"


def _answer(good: int, gpu_h: float, events: list[list[Any]]) -> dict[str, Any]:
    return {
        "report": {
            "goodput_completed_requests": good,
            "completed_requests": 100,
            "gpu_hours": gpu_h,
            "p95_ttft_ms": 500.0,
            "p95_itl_ms": 12.0,
        },
        "scale_events": events,
        "wall_s": 1.0,
    }


def test_result_rows() -> None:
    events = [[100.0, "prefill", 2, 3], [200.0, "prefill", 3, 2], [900.0, "decode", 1, 2]]
    run = results.summarize("pdfleet", _answer(96, 2.0, events), 100, flap_window_s=300.0)
    assert run["attainment"] == pytest.approx(0.96)
    assert run["flaps"] == 1 and run["scale_events"] == 3
    assert run["p95_itl_s"] == pytest.approx(0.012)
    failed = results.summarize("pdfleet-learned", {"error": "killed"}, 100, 300.0)
    assert failed["failed"] == "killed"
    result = {
        "workload": "W9",
        "runs": {"pdfleet": run, "pdfleet-learned": failed},
        "cheapest_fixed": {"prefill": 3, "decode": 1, "attainment": 0.97, "gpu_hours": 4.0},
        "clairvoyant": {"attainment": 0.95, "gpu_hours": 1.6},
        "clairvoyant_from_initial": {"attainment": 0.951, "gpu_hours": 2.0},
        "clairvoyant_every_window": {"attainment": 0.97, "gpu_hours": 2.4},
    }
    assert bench.ratios(run, bench.references(result)) == {
        "vs_cheapest_fixed": 0.5,
        "vs_clairvoyant": 1.25,
        "vs_every_window": 2.0 / 2.4,
    }
    lines = results.markdown([result]).splitlines()
    for row in (
        "pdfleet (capacity hint) | 96.00% | 2.00 | 0.500 | 1.250 | 0.833 | 1 (3 events) |",
        "pdfleet (no hint) | failed: killed | | | | | |",
        "cheapest fixed 3P1D | 97.00% | 4.00 | 1.000 | 2.500 | 1.667 | 0 |",
        "clairvoyant (5 min windows, no start-up) | 95.00% | 1.60 | 0.400 | 1.000 | 0.667 | |",
        "clairvoyant, first window at the initial split | 95.10% | 2.00 | 0.500 | 1.250 | 0.833 "
        "| |",
        "clairvoyant, every window at the target | 97.00% | 2.40 | 0.600 | 1.500 | 1.000 | |",
    ):
        assert f"| W9 | {row}" in lines, row
    assert results.attainment({}, 100) == 0.0


def test_a_partial_run_keeps_the_rows_of_workloads_it_did_not_rerun(tmp_path: Path) -> None:
    for name, gpu_hours in (("H1_a", 1.0), ("H2_b", 2.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"workload": name, "gpu_h": gpu_hours}))
    (tmp_path / "calibration.json").write_text("[]")
    rerun = [{"workload": "H2_b", "gpu_h": 3.0}, {"workload": "H0_c", "gpu_h": 4.0}]
    merged = bench.with_earlier(bench.results_in(tmp_path), rerun)
    assert [(r["workload"], r["gpu_h"]) for r in merged] == [
        ("H0_c", 4.0),
        ("H1_a", 1.0),
        ("H2_b", 3.0),
    ]
