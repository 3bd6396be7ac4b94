"""The autoscaler benchmark's two simulators side by side, held to the policy's targets.

Where it fits: `make bench-autoscale-all` runs the benchmark in FleetSim (`pdfleet_lab.bench`,
one JSON per workload in a results folder) and in DynoSim (`pdfleet_lab.dynosim`, one JSON per
workload in its `dynosim/` subfolder), then `python -m pdfleet_lab.sidebyside FOLDER ...`
writes `simulators.md` into each folder from those JSONs alone; the single-simulator targets
rewrite it too, so it never lags behind either. Both JSONs name the same things (`runs`
by controller, `cheapest_fixed`, `clairvoyant`, `ratios`), so one reader serves both. A
check in the unit tests fails when a committed `simulators.md` differs from what its JSONs
give. Pure apart from `main`.

The targets are docs/autoscaling.md's (per workload and simulator): attainment at least
95 %, GPU-hours at most 1.15x the clairvoyant bound with a capacity hint and 1.30x without,
below the cheapest fixed split reaching 95 %, no flap.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdfleet_lab.bench import TARGET, results_in

# GPU-hours over the clairvoyant bound, by run: with the capacity hint, and learning online.
BOUND_TARGETS = {"pdfleet": 1.15, "pdfleet-learned": 1.30}
RUN_LABELS = {"pdfleet": "hint", "pdfleet-learned": "no hint"}
SIMULATORS = (("FleetSim", "."), ("DynoSim", "dynosim"))
OUTPUT = "simulators.md"


@dataclass(frozen=True)
class Row:
    """One policy run of one workload in one simulator, with what it is measured against."""

    workload: str
    simulator: str
    run: str  # "pdfleet" (capacity hint) or "pdfleet-learned"
    attainment: float | None  # None: the run failed (DynoSim's wall cap or stall detector)
    gpu_hours: float | None
    fixed: str  # the cheapest fixed split reaching the target, e.g. "3P1D 3.89"
    vs_fixed: float | None
    vs_bound: float | None
    flaps: int | None

    def misses(self) -> tuple[str, ...]:
        """The targets this run misses, in the table's words."""
        if self.attainment is None:
            return ("failed",)
        out = []
        if self.attainment < TARGET:
            out.append("attainment")
        if self.vs_bound is not None and self.vs_bound > BOUND_TARGETS[self.run]:
            out.append("bound")
        if self.vs_fixed is not None and self.vs_fixed >= 1.0:
            out.append("fixed")
        if self.flaps:
            out.append("flaps")
        return tuple(out)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def rows_of(result: Mapping[str, Any], simulator: str) -> list[Row]:
    """The policy rows of one workload's result JSON (either simulator's)."""
    cheapest = result.get("cheapest_fixed")
    fixed = (
        f"{cheapest['prefill']}P{cheapest['decode']}D {cheapest['gpu_hours']:.2f}"
        if cheapest
        else "none reaches the target"
    )
    out = []
    for name in BOUND_TARGETS:
        run = result.get("runs", {}).get(name)
        if run is None:
            continue
        ratios = result.get("ratios", {}).get(name, {})
        failed = "failed" in run
        out.append(
            Row(
                workload=str(result["workload"]),
                simulator=simulator,
                run=name,
                attainment=None if failed else _finite(run.get("attainment")),
                gpu_hours=None if failed else _finite(run.get("gpu_hours")),
                fixed=fixed,
                vs_fixed=_finite(ratios.get("vs_cheapest_fixed")),
                vs_bound=_finite(ratios.get("vs_clairvoyant")),
                flaps=None if failed else int(run.get("flaps", 0)),
            )
        )
    return out


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(rows: Sequence[Row]) -> str:
    """The table, one line per workload, simulator and run, in that order."""
    lines = [
        "| Workload | Simulator | Run | Attainment | GPU-h | Cheapest fixed >= 95 % "
        "| / fixed | / clairvoyant | Flaps | Misses |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {sim: i for i, (sim, _) in enumerate(SIMULATORS)}
    runs = list(BOUND_TARGETS)
    for r in sorted(rows, key=lambda r: (r.workload, order[r.simulator], runs.index(r.run))):
        attainment = "failed" if r.attainment is None else f"{r.attainment:.2%}"
        flaps = "-" if r.flaps is None else str(r.flaps)
        lines.append(
            f"| {r.workload} | {r.simulator} | {RUN_LABELS[r.run]} | {attainment} "
            f"| {_cell(r.gpu_hours, '.2f')} | {r.fixed} | {_cell(r.vs_fixed, '.3f')} "
            f"| {_cell(r.vs_bound, '.3f')} | {flaps} | {', '.join(r.misses()) or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def collect(folder: Path) -> list[Row]:
    """Every policy row in a results folder: its own JSONs (FleetSim) and `dynosim/`'s."""
    out: list[Row] = []
    for simulator, sub in SIMULATORS:
        for result in results_in(folder / sub).values():
            out.extend(rows_of(result, simulator))
    return out


def page(rows: Sequence[Row]) -> str:
    """`simulators.md`: the table and how to read it."""
    return (
        "# The policy in both simulators\n\n"
        "Generated by `python -m pdfleet_lab.sidebyside` from the JSONs beside this file "
        "(FleetSim) and in `dynosim/` (DynoSim); `make bench-autoscale-all` reruns both "
        "simulators and rewrites it. Each simulator's own fixed splits and clairvoyant bound "
        "are the references. The targets (docs/autoscaling.md): attainment >= 95 %, GPU-h "
        f"<= {BOUND_TARGETS['pdfleet']:.2f}x the bound with a capacity hint and <= "
        f"{BOUND_TARGETS['pdfleet-learned']:.2f}x without, below the cheapest fixed split, no "
        'flap; "Misses" names those a run does not meet.\n\n'
        + markdown(rows)
        + f"\n{sum(not r.misses() for r in rows)} of {len(rows)} runs meet every target.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdfleet_lab.sidebyside", description=__doc__)
    ap.add_argument("folders", nargs="+", type=Path, help="results folders")
    args = ap.parse_args(argv)
    for folder in args.folders:
        rows = collect(folder)
        (folder / OUTPUT).write_text(page(rows))
        print(f"{folder / OUTPUT}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
