"""The one module that imports DynoSim (`dynamo`) and aiconfigurator-core.

Where it fits: the harness (`harness.py`) runs each replay as
`python -m pdfleet_lab.dynosim.runtime serve` in DynoSim's venv: one long-lived process per
core reads run specs (JSON lines) on stdin and answers one JSON line each, so `dynamo` is
imported once, not once per replay. Every run has a wall-time cap (DynoSim's engines can stop
making progress under a long decode overload): checked at each tick here (the run stops with
an error), and enforced from outside by the harness, which kills a process that does not
answer in time; either way the run counts as failed. `... table OUT.npz` builds the timing
table; `... run SPEC.json OUT.json` runs one spec. Nothing else in the repository imports
this module, and the unit tests run without `dynamo` installed.

A run: a disaggregated `PlannerReplayBridge` over a Mooncake JSONL trace, engines of the
vLLM mocker with the NPZ timing table (`planner_profile_data`), and a `ticker.Ticker` as the
planner (pdfleet's policy through `baselines.PolicyController`, or none for a fixed split).
The goodput SLA given to DynoSim is the benchmark's, so `goodput_completed_requests` counts
the requests meeting both (DynoSim: TTFT <= SLO and (e2e - TTFT) / (output - 1) <= SLO).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from pdfleet.autoscale.policy import PolicyConfig
from pdfleet_lab.baselines import PolicyController
from pdfleet_lab.dynosim import table as tables
from pdfleet_lab.dynosim.results import PROGRESS_PREFIX, RESULT_PREFIX
from pdfleet_lab.dynosim.signals import FleetSignals
from pdfleet_lab.dynosim.ticker import Ticker

MODEL = "meta-llama/Meta-Llama-3.1-8B"
SYSTEM = "h200_sxm"
BACKEND = "vllm"
REPORT_KEYS = (
    "num_requests",
    "completed_requests",
    "goodput_completed_requests",
    "gpu_hours",
    "prefill_worker_seconds",
    "decode_worker_seconds",
    "duration_ms",
    "wall_time_ms",
    "p95_ttft_ms",
    "p95_itl_ms",
    "mean_ttft_ms",
    "mean_itl_ms",
)


def build_table(out: Path) -> None:
    """Sample aiconfigurator-core (Llama-3.1-8B, H200 SXM, vLLM, TP1) and save the NPZ."""
    import numpy as np
    from aiconfigurator_core.sdk.engine import EngineHandle

    engine = EngineHandle.compile(MODEL, SYSTEM, BACKEND, tp_size=1)
    t = tables.build(
        lambda n: float(engine.predict_prefill_latency(1, n)),
        lambda b, c: float(engine.predict_decode_latency(b, c, 2)),
    )
    arrays = {k: np.asarray(v, dtype=float) for k, v in t.arrays().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(out)


def load_table(path: Path) -> tables.TimingTable:
    import numpy as np

    with np.load(path) as data:
        return tables.from_arrays({k: data[k].tolist() for k in data.files})


def _engine_args(spec: dict[str, Any], worker_type: str) -> Any:
    from dynamo.replay.main import _load_engine_args

    raw = {
        "block_size": spec["block_size"],
        "num_gpu_blocks": spec["kv_blocks"],
        "max_num_seqs": spec["max_num_seqs"],
        "max_num_batched_tokens": spec["max_num_batched_tokens"],
        "kv_bytes_per_token": spec["kv_bytes_per_token"],
        "kv_transfer_bandwidth": spec["kv_bandwidth_gbps"],
        "startup_time": spec["startup_s"],
        "planner_profile_data": spec["table"],
        "worker_type": worker_type,
    }
    return _load_engine_args(json.dumps(raw))


class WallCapError(RuntimeError):
    pass


class OverloadError(RuntimeError):
    pass


class _Guarded:
    """The ticker, stopped by an error once the run has used up its wall time or (a fixed
    split, with `abort_ttft_s`) once a tick's mean TTFT shows a hopeless backlog; each tick
    is reported on stdout, so the harness can tell a stalled replay from a slow one."""

    def __init__(self, ticker: Ticker, cap_s: float, abort_ttft_s: float | None) -> None:
        self.ticker = ticker
        self.deadline = time.monotonic() + cap_s
        self.cap_s = cap_s
        self.abort_ttft_s = abort_ttft_s

    def initial_tick_ms(self) -> float:
        return self.ticker.initial_tick_ms()

    def on_tick(self, metrics: dict[str, Any]) -> dict[str, Any]:
        at = float(metrics["now_ms"]) / 1000.0
        sys.stdout.write(f"{PROGRESS_PREFIX}{at:.0f}\n")
        sys.stdout.flush()
        if time.monotonic() > self.deadline:
            raise WallCapError(f"over {self.cap_s:.0f} s of wall time at {at:.0f} s simulated")
        traffic = metrics.get("traffic") or {}
        ttft_s = float(traffic.get("avg_ttft_ms") or 0.0) / 1000.0
        if self.abort_ttft_s is not None and ttft_s > self.abort_ttft_s:
            raise OverloadError(f"mean TTFT {ttft_s:.0f} s at {at:.0f} s simulated")
        return self.ticker.on_tick(metrics)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One replay; the report's main numbers, the scale events and the timeline."""
    from dynamo.mocker import PlannerReplayBridge

    timing = load_table(Path(spec["table"]))
    controller = None
    if spec.get("policy") is not None:
        names = {f.name for f in fields(PolicyConfig)}
        controller = PolicyController(
            PolicyConfig(**{k: v for k, v in spec["policy"].items() if k in names})
        )
    signals = FleetSignals(
        kv_capacity_tokens=spec["kv_blocks"] * spec["block_size"],
        kv_transfer_s_per_token=spec["kv_bytes_per_token"] / (spec["kv_bandwidth_gbps"] * 1e9),
        idle_prefill_ms=lambda n: tables.prefill_ms(timing, n),
        percentile=spec["percentile"],
        window_s=spec["window_s"],
    )
    ticker = Ticker(
        signals,
        controller,
        interval_s=spec["interval_s"],
        scrape_interval_s=spec["scrape_interval_s"],
    )
    bridge = PlannerReplayBridge.create_disagg(
        trace_file=spec["trace"],
        prefill_engine_args=_engine_args(spec, "prefill"),
        decode_engine_args=_engine_args(spec, "decode"),
        num_prefill_workers=spec["prefill"],
        num_decode_workers=spec["decode"],
        trace_block_size=spec["block_size"],
        sla_ttft_ms=spec["ttft_s"] * 1000.0,
        sla_itl_ms=spec["itl_s"] * 1000.0,
    )
    t0 = time.perf_counter()
    guard = _Guarded(ticker, float(spec.get("wall_cap_s", 1e9)), spec.get("abort_ttft_s"))
    report = bridge.run(guard)
    return {
        "report": {k: report.get(k) for k in REPORT_KEYS},
        "scale_events": [list(e) for e in ticker.scale_events],
        "timeline": ticker.timeline,
        "ticks": ticker.ticks,
        "wall_s": time.perf_counter() - t0,
    }


def serve() -> None:
    """Specs in, one JSON line out each: the result, or {"error": ...} for a failed run."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out: dict[str, Any] = run(json.loads(line))
        except Exception as error:  # a failed run (wall cap, DynoSim error): report it
            out = {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(RESULT_PREFIX + json.dumps(out) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "table":
        build_table(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "run":
        spec = json.loads(Path(argv[1]).read_text())
        out = run(spec)
        Path(argv[2]).write_text(json.dumps(out))
        return 0
    if argv == ["serve"]:
        serve()
        return 0
    print("usage: runtime.py table OUT.npz | run SPEC.json OUT.json | serve", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
