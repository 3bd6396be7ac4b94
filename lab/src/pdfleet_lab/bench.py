"""The autoscaler's benchmark: replay workloads through the fleet simulator, policy vs baselines.

Where it fits: `make bench-autoscale` runs `python -m pdfleet_lab.bench`. Every controller
reads its windows as the operator does (`--signals prometheus`, the default: the operator's
PromQL over the engines' scraped series, `sim.py`). For each workload it runs pdfleet's policy
(`policy.decide` via `baselines.PolicyController`), the threshold autoscaler, the Dynamo
planner's throughput formula, every fixed P:D split that can matter and the clairvoyant
bound (`oracle.py`; also its plan with the start-up paid, which splits the distance to the
bound into start-up and the rest, and the plan that holds the target in every window), then
prints a table and writes `<name>.json` and
`<name>.png` per workload plus `results.md` into `--out` (keeping the rows of workloads an
earlier run left there, so that one workload can be run again alone).

Attainment: share of requests whose TTFT and whose mean ITL ((e2e - TTFT) / (output - 1))
both meet the SLO. GPU-hours: GPUs held (starting, ready, draining) over the trace.
Goodput per GPU-hour: requests meeting the SLO per GPU-hour.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pdfleet.autoscale.policy import PolicyConfig, following_scale_down_window
from pdfleet_lab import heldout, oracle
from pdfleet_lab.baselines import (
    PlannerController,
    PolicyController,
    ThresholdController,
    decode_engine_rps,
    prefill_engine_rps,
)
from pdfleet_lab.sim import Controller, SimConfig, SimResult, simulate
from pdfleet_lab.traces import Workload, load, step

# SLOs of the shared workloads (../shared/traces/workloads/README.md): (TTFT s, mean ITL s).
# S1 is W1's requests in a synthetic tenfold step, with W1's SLO; H1-H9: `heldout.SLOS`.
WORKLOAD_SLOS = {
    "W1": (1.0, 0.015),
    "W2": (0.5, 0.015),
    "W3": (1.0, 0.015),
    "S1": (1.0, 0.015),
    **heldout.SLOS,
}
# The step: 4 requests/s for 20 minutes, then 40 for 20 more (two prefill replicas carry
# it, one does not: a pool that shrank at light load meets it saturated).
STEP_RPS, STEP_FACTOR, STEP_AT_S, STEP_END_S = 4.0, 10.0, 1200.0, 2400.0
ALL_RUNS = ("pdfleet", "pdfleet-learned", "threshold", "planner", "fixed", "clairvoyant")
TARGET = 0.95
INITIAL_FLEET = (2, 1)  # prefill, decode replicas the policy runs start from
# (key, start-up paid, every window at the target) of each clairvoyant plan written out
BOUNDS = (
    ("clairvoyant", False, False),
    ("clairvoyant_startup", True, False),
    ("clairvoyant_every_window", False, True),
)
# The planner formula sizes for the mean load with no room to queue, so it costs less and
# misses the SLO. To compare attainment at equal cost it gets headroom (its load multiplied by
# these factors, in order) until it holds at least as many GPU-hours as pdfleet.
PLANNER_HEADROOMS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0)


@dataclass(frozen=True)
class RunSummary:
    name: str
    attainment: float
    ttft_attainment: float
    itl_attainment: float
    gpu_hours: float
    goodput_per_gpu_hour: float
    scale_events: int
    flaps: int
    p95_ttft_s: float
    p95_itl_s: float
    wall_s: float


def _quantile(values: Sequence[float], q: float) -> float:
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    return finite[min(len(finite) - 1, math.ceil(q * len(finite)) - 1)]


def count_flaps(events: Sequence[tuple[float, str, int, int]], window_s: float) -> int:
    """Reversals: a role scaled in one direction, then the other within `window_s`."""
    flaps = 0
    last: dict[str, tuple[float, int]] = {}
    for t, role, old, new in events:
        direction = 1 if new > old else -1
        prev = last.get(role)
        if prev is not None and prev[1] != direction and t - prev[0] < window_s:
            flaps += 1
        last[role] = (t, direction)
    return flaps


def summarize(
    name: str, res: SimResult, ttft: float, itl: float, flap_window_s: float, wall_s: float
) -> RunSummary:
    att = res.attainment(ttft, itl)
    good = att * len(res.ttft_s)
    return RunSummary(
        name=name,
        attainment=att,
        ttft_attainment=res.attainment(ttft, math.inf),
        itl_attainment=res.attainment(math.inf, itl),
        gpu_hours=res.gpu_hours,
        goodput_per_gpu_hour=good / res.gpu_hours if res.gpu_hours else 0.0,
        scale_events=len(res.scale_events),
        flaps=count_flaps(res.scale_events, flap_window_s),
        p95_ttft_s=_quantile(res.ttft_s, 0.95),
        p95_itl_s=_quantile(res.itl_s, 0.95),
        wall_s=wall_s,
    )


def at_equal_cost(
    run: Callable[[float], RunSummary], gpu_hours: float, headrooms: Sequence[float]
) -> tuple[float, RunSummary] | None:
    """The first headroom whose run holds at least `gpu_hours`, with that run; None if none
    does (the baseline cannot be made to spend as much)."""
    for headroom in headrooms:
        summary = run(headroom)
        if summary.gpu_hours >= gpu_hours:
            return headroom, summary
    return None


def capacity_priors(sim: SimConfig, ttft: float, itl: float) -> tuple[float, float]:
    """Starting capacities from the perf model at a nominal request (2k prompt, 128 out), as
    a pre-deployment profile would give them; the policy corrects them online."""
    isl, osl = 2048.0, 128.0
    prefill = prefill_engine_rps(sim.perf, isl, ttft) * isl * 0.8  # room to queue
    decode = decode_engine_rps(sim.perf, isl, osl, itl) * osl
    return prefill, decode


def policy_config(sim: SimConfig, ttft: float, itl: float, budget: int) -> PolicyConfig:
    prefill_prior, decode_prior = capacity_priors(sim, ttft, itl)
    return PolicyConfig(
        ttft_target_s=ttft,
        itl_target_s=itl,
        percentile=sim.percentile,
        prefill_max=budget - 1,
        decode_max=budget - 1,
        gpu_budget=budget,
        interval_s=sim.interval_s,
        startup_s=sim.startup_s,
        prefill_capacity_prior=prefill_prior,
        decode_capacity_prior=decode_prior,
    )


def _run(
    name: str,
    wl: Workload,
    sim: SimConfig,
    ctl: Controller,
    initial: tuple[int, int],
    ttft: float,
    itl: float,
    flap_window_s: float,
) -> tuple[RunSummary, SimResult]:
    t0 = time.perf_counter()
    res = simulate(wl, sim, ctl, initial)
    summary = summarize(name, res, ttft, itl, flap_window_s, time.perf_counter() - t0)
    print(
        f"  {name:<12} attainment {summary.attainment:6.2%}  GPU-h {summary.gpu_hours:5.2f}"
        f"  events {summary.scale_events:3d}  flaps {summary.flaps}  ({summary.wall_s:.1f}s)",
        flush=True,
    )
    return summary, res


def bench_workload(
    wl: Workload, ttft: float, itl: float, args: argparse.Namespace
) -> dict[str, Any]:
    from pdfleet_worker.perfmodel import preset

    sim = SimConfig(
        perf=preset(args.preset),
        startup_s=args.startup,
        interval_s=args.interval,
        cluster_gpus=args.budget,
        signals=args.signals,
    )
    pcfg = policy_config(sim, ttft, itl, args.budget)
    pcfg = following_scale_down_window(pcfg, args.scale_down_stabilization)
    flap_window = pcfg.scale_down_stabilization_s
    initial = (args.initial_prefill, args.initial_decode)
    runs: dict[str, RunSummary] = {}
    timelines: dict[str, list[dict[str, float]]] = {}
    controllers: dict[str, Controller] = {
        "pdfleet": PolicyController(pcfg),
        # what a spec without autoscaling.capacityHint gets: everything learned online
        "pdfleet-learned": PolicyController(
            replace(pcfg, prefill_capacity_prior=None, decode_capacity_prior=None)
        ),
        "threshold": ThresholdController(budget=args.budget, max_replicas=args.budget - 1),
        "planner": PlannerController(sim.perf, ttft, itl, args.budget),
    }
    for name, ctl in controllers.items():
        if name in args.only:
            summary, res = _run(name, wl, sim, ctl, initial, ttft, itl, flap_window)
            runs[name] = summary
            timelines[name] = res.timeline
    equal_cost: dict[str, Any] = {}
    if "planner" in args.only:
        tried: dict[float, RunSummary] = {}

        def planner_with(headroom: float) -> RunSummary:
            if headroom not in tried:
                ctl = PlannerController(sim.perf, ttft, itl, args.budget, headroom=headroom)
                label = f"planner x{headroom:g}"
                tried[headroom] = _run(label, wl, sim, ctl, initial, ttft, itl, flap_window)[0]
            return tried[headroom]

        for name in (k for k in runs if k.startswith("pdfleet")):
            found = at_equal_cost(planner_with, runs[name].gpu_hours, PLANNER_HEADROOMS)
            equal_cost[name] = {"headroom": found[0], **asdict(found[1])} if found else None
    out: dict[str, Any] = {
        "workload": wl.name,
        "requests": len(wl),
        "duration_s": wl.duration_s,
        "slo": {"ttft_s": ttft, "itl_s": itl, "attainment_target": TARGET},
        "sim": {
            "preset": args.preset,
            "startup_s": sim.startup_s,
            "interval_s": sim.interval_s,
            "metrics_window_s": sim.metrics_window_s,
            "signals": sim.signals,
            "scrape_interval_s": sim.scrape_interval_s,
            "percentile": sim.percentile,
            "gpu_budget": args.budget,
            "initial": list(initial),
        },
        "policy_config": asdict(pcfg),
        "runs": {k: asdict(v) for k, v in runs.items()},
        "planner_equal_cost": equal_cost,
    }
    if "fixed" in args.only:
        t0 = time.perf_counter()
        splits = oracle.fixed_splits(wl, oracle.runner(sim, ttft, itl), args.budget)
        cheapest = oracle.cheapest_reaching(splits, TARGET)
        out["fixed"] = [asdict(s) for s in splits]
        out["cheapest_fixed"] = asdict(cheapest) if cheapest else None
        print(
            f"  fixed splits: {len(splits)} simulated ({time.perf_counter() - t0:.0f}s); "
            f"cheapest >= {TARGET:.0%}: "
            + (
                f"{cheapest.prefill}P{cheapest.decode}D {cheapest.attainment:.2%} "
                f"{cheapest.gpu_hours:.2f} GPU-h"
                if cheapest
                else "none"
            ),
            flush=True,
        )
    if "clairvoyant" in args.only:
        t0 = time.perf_counter()
        fronts = oracle.window_fronts(wl, sim, ttft, itl, args.budget)
        # the bound, the same knowledge paying the start-up, and the bound that holds the
        # target in every window as a latency-following policy does (oracle.py)
        for key, paid, every_window in BOUNDS:
            startup_s = sim.startup_s if paid else 0.0
            cv = oracle.clairvoyant(
                wl,
                sim,
                ttft,
                itl,
                args.budget,
                TARGET,
                startup_s=startup_s,
                fronts=fronts,
                every_window=every_window,
            )
            out[key] = {
                "gpu_hours": cv.gpu_hours,
                "attainment": cv.attainment,
                "startup_s": startup_s,
                "every_window": every_window,
                "plan": [list(p) for p in cv.plan],
            }
            print(
                f"  {key}: {cv.attainment:.2%} "
                f"{cv.gpu_hours:.2f} GPU-h ({time.perf_counter() - t0:.0f}s)",
                flush=True,
            )
    out["ratios"] = _ratios(out)
    out["timelines"] = timelines
    return out


def references(result: Mapping[str, Any]) -> dict[str, float | None]:
    """GPU-hours of each reference a workload's result holds, by the name of the ratio to it
    (None where it was not computed: DynoSim's results have no plan paying start-up)."""
    return {
        "vs_cheapest_fixed": (result.get("cheapest_fixed") or {}).get("gpu_hours"),
        "vs_clairvoyant": (result.get("clairvoyant") or {}).get("gpu_hours"),
        "vs_clairvoyant_startup": (result.get("clairvoyant_startup") or {}).get("gpu_hours"),
        "vs_every_window": (result.get("clairvoyant_every_window") or {}).get("gpu_hours"),
    }


def ratios(run: Mapping[str, Any], refs: Mapping[str, float | None]) -> dict[str, float]:
    """GPU-hours of a run over each reference that exists (none for a run that failed)."""
    if "gpu_hours" not in run:
        return {}
    return {k: run["gpu_hours"] / ref for k, ref in refs.items() if ref}


def results_in(folder: Path) -> dict[str, dict[str, Any]]:
    """The per-workload results (one JSON each) a benchmark run left in `folder`, by workload;
    DynoSim's `calibration.json` beside them is not one."""
    found: dict[str, dict[str, Any]] = {}
    for path in folder.glob("*.json"):
        if path.name != "calibration.json":
            result = json.loads(path.read_text())
            found[result["workload"]] = result
    return found


def with_earlier(
    earlier: dict[str, dict[str, Any]], done: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """This run's results and an earlier run's for other workloads, by workload name: a run
    of some workloads updates their rows in `results.md` and keeps the rest."""
    by_name = {**earlier, **{r["workload"]: r for r in done}}
    return [by_name[name] for name in sorted(by_name)]


def _ratios(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each pdfleet run's ratios to the cheapest fixed split and the clairvoyant bounds."""
    refs = references(out)
    return {
        name: ratios(run, refs) for name, run in out["runs"].items() if name.startswith("pdfleet")
    }


def _run_row(workload: str, label: str, run: dict[str, Any]) -> str:
    """One simulated run (a `RunSummary` as a dict) as a row of the results table."""
    return (
        f"| {workload} | {label} | {run['attainment']:.2%} | "
        f"{run['ttft_attainment']:.2%} | {run['itl_attainment']:.2%} | "
        f"{run['gpu_hours']:.2f} | {run['goodput_per_gpu_hour']:.0f} | "
        f"{run['scale_events']} | {run['flaps']} |"
    )


def markdown(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| Workload | Run | Attainment | TTFT ok | ITL ok | GPU-hours | Good req / GPU-h "
        "| Scale events | Flaps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        name = r["workload"]
        for run in r["runs"].values():
            lines.append(_run_row(name, run["name"], run))
        for run_name, eq in (r.get("planner_equal_cost") or {}).items():
            if eq:
                label = f"planner, load x{eq['headroom']:g} (>= {run_name}'s GPU-hours)"
                lines.append(_run_row(name, label, eq))
        cf = r.get("cheapest_fixed")
        if cf:
            good = cf["attainment"] * cf["requests"] / cf["gpu_hours"]
            lines.append(
                f"| {name} | cheapest fixed {cf['prefill']}P{cf['decode']}D | "
                f"{cf['attainment']:.2%} | | | {cf['gpu_hours']:.2f} | {good:.0f} | 0 | 0 |"
            )
        for key, _, _ in BOUNDS:
            cv = r.get(key)
            if cv:
                good = cv["attainment"] * r["requests"] / cv["gpu_hours"]
                paid = cv.get("startup_s", 0.0)
                label = f"{paid:.0f} s start-up paid" if paid else "no start-up"
                if cv.get("every_window"):
                    label += ", every window at the target"
                lines.append(
                    f"| {name} | clairvoyant (5 min, {label}) | {cv['attainment']:.2%} "
                    f"| | | {cv['gpu_hours']:.2f} | {good:.0f} | | |"
                )
    lines += [
        "",
        "| Workload | Run | GPU-h / cheapest fixed | GPU-h / clairvoyant "
        "| GPU-h / clairvoyant paying start-up | GPU-h / clairvoyant, every window |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, ra in r.get("ratios", {}).items():
            lines.append(
                f"| {r['workload']} | {name} | {ra.get('vs_cheapest_fixed', math.nan):.3f} | "
                f"{ra.get('vs_clairvoyant', math.nan):.3f} | "
                f"{ra.get('vs_clairvoyant_startup', math.nan):.3f} | "
                f"{ra.get('vs_every_window', math.nan):.3f} |"
            )
    return "\n".join(lines) + "\n"


def workload(spec: str, workloads_dir: Path, speedup: float) -> Workload:
    """A trace file, a shared workload by its prefix (W1...), the synthetic step (S1) or a
    held-out workload (H1...) built from the Azure traces beside the shared workloads."""
    if spec == "S1":
        sizes = load(_resolve("W1", workloads_dir))
        return step(sizes, STEP_RPS, STEP_FACTOR, STEP_AT_S, STEP_END_S, name="S1_step_x10")
    if spec in heldout.BUILDERS:
        return heldout.build(spec, workloads_dir.parent / "azure")
    return load(_resolve(spec, workloads_dir), speedup=speedup)


def _resolve(spec: str, workloads_dir: Path) -> Path:
    p = Path(spec)
    if p.exists():
        return p
    matches = sorted(workloads_dir.glob(f"{spec}*.jsonl*"))
    if not matches:
        raise SystemExit(f"no workload {spec!r} (not a file, nothing in {workloads_dir})")
    return matches[0]


def _default_workloads_dir() -> Path:
    env = os.environ.get("PDFLEET_WORKLOADS")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:  # <repo>/../shared/traces/workloads
        cand = parent.parent / "shared" / "traces" / "workloads"
        if (parent / "pyproject.toml").exists() and cand.exists():
            return cand
    return Path("../shared/traces/workloads")


def add_initial_fleet(ap: argparse.ArgumentParser) -> None:
    """The policy runs' starting fleet, the same options and default in both simulators'
    benchmarks (fixed splits and the plain bound do not depend on it)."""
    ap.add_argument("--initial-prefill", type=int, default=INITIAL_FLEET[0])
    ap.add_argument("--initial-decode", type=int, default=INITIAL_FLEET[1])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m pdfleet_lab.bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "workloads",
        nargs="*",
        default=["W1", "W2", "W3", "S1"],
        help="trace files (Mooncake .jsonl[.gz] or Azure .csv), W1/W2/W3, S1 (a tenfold "
        "load step of W1's requests), or H1-H9 (held-out workloads, heldout.py)",
    )
    ap.add_argument("--workloads-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("bench-autoscale"))
    ap.add_argument(
        "--only", default=",".join(ALL_RUNS), help="comma-separated subset of " + ",".join(ALL_RUNS)
    )
    ap.add_argument("--ttft", type=float, default=None, help="TTFT SLO, s (default per W*)")
    ap.add_argument("--itl", type=float, default=None, help="mean ITL SLO, s (default per W*)")
    ap.add_argument("--budget", type=int, default=12, help="GPU budget (and cluster size)")
    ap.add_argument("--startup", type=float, default=120.0, help="worker start-up, s")
    ap.add_argument("--interval", type=float, default=15.0, help="control interval, s")
    ap.add_argument("--preset", default="llama-3.1-8b-h200")
    ap.add_argument(
        "--signals",
        choices=["prometheus", "direct"],
        default="prometheus",
        help="windows from the operator's queries over scraped series (as in production), "
        "or the simulator's exact ones",
    )
    ap.add_argument(
        "--scale-down-stabilization",
        type=float,
        default=300.0,
        help="the spec's scaleDownStabilization, s: the policy's memory follows it",
    )
    ap.add_argument("--speedup", type=float, default=1.0, help="time compression of the trace")
    add_initial_fleet(ap)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    args.only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = args.only - set(ALL_RUNS)
    if unknown:
        ap.error(f"unknown runs: {sorted(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wdir = args.workloads_dir or _default_workloads_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    earlier = results_in(args.out)  # read before this run writes its own
    results = []
    for spec in args.workloads:
        wl = workload(spec, wdir, args.speedup)
        ttft, itl = WORKLOAD_SLOS.get(wl.name[:2], (1.0, 0.015))
        ttft = args.ttft if args.ttft is not None else ttft
        itl = args.itl if args.itl is not None else itl
        print(
            f"{wl.name}: {len(wl)} requests, {wl.duration_s:.0f}s, SLO TTFT<={ttft}s "
            f"ITL<={itl * 1000:.0f}ms",
            flush=True,
        )
        res = bench_workload(wl, ttft, itl, args)
        if not args.no_plot:
            from pdfleet_lab.plot import plot_workload

            plot_workload(res, args.out / f"{wl.name}.png")
        timelines = res.pop("timelines")
        res["timeline_pdfleet"] = timelines.get("pdfleet", [])
        (args.out / f"{wl.name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        results.append(res)
    table = markdown(with_earlier(earlier, results))
    (args.out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
