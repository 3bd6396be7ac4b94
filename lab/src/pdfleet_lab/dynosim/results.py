"""Run results of the DynoSim benchmark: summaries, ratios and the Markdown table.

Where it fits: `harness.py` turns each replay's answer from `runtime.run` (DynoSim's report,
the ticker's scale events) into a row here and writes `results.md` and one JSON per workload.
Attainment is DynoSim's goodput count (TTFT <= SLO and mean ITL (e2e - TTFT) / (output - 1)
<= SLO, per request) over the requests of the trace; a run that failed (wall cap, DynoSim
error) has none. Flaps are `pdfleet_lab.bench.count_flaps` over the scale events. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet_lab.bench import count_flaps, ratios, references

# Marks the answer lines of `runtime serve` on its stdout (DynoSim may print there too).
RESULT_PREFIX = "PDFLEET-RESULT "
PROGRESS_PREFIX = "PDFLEET-TICK "
RUN_LABELS = {
    "pdfleet": "pdfleet (capacity hint)",
    "pdfleet-learned": "pdfleet (no hint)",
}
BOUND_LABELS = {
    "clairvoyant": "clairvoyant (5 min windows, no start-up)",
    "clairvoyant_from_initial": "clairvoyant, first window at the initial split",
    "clairvoyant_every_window": "clairvoyant, every window at the target",
}


def attainment(report: Mapping[str, Any], requests: int) -> float:
    """Share of the trace's requests meeting both SLOs (unfinished ones do not)."""
    good = report.get("goodput_completed_requests")
    if not requests or good is None:
        return 0.0
    return float(good) / requests


def summarize(
    name: str, answer: Mapping[str, Any], requests: int, flap_window_s: float
) -> dict[str, Any]:
    """One run as a row: a failed run keeps its error and no numbers."""
    if "error" in answer:
        return {"name": name, "failed": str(answer["error"]), "requests": requests}
    report = answer["report"]
    events = [(float(t), str(r), int(a), int(b)) for t, r, a, b in answer["scale_events"]]
    return {
        "name": name,
        "requests": requests,
        "completed": report.get("completed_requests"),
        "attainment": attainment(report, requests),
        "gpu_hours": float(report.get("gpu_hours") or math.nan),
        "scale_events": len(events),
        "flaps": count_flaps(events, flap_window_s),
        "p95_ttft_s": float(report.get("p95_ttft_ms") or math.nan) / 1000.0,
        "p95_itl_s": float(report.get("p95_itl_ms") or math.nan) / 1000.0,
        "wall_s": float(answer.get("wall_s", math.nan)),
    }


def _pct(x: float | None) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.2%}"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _row(name: str, label: str, run: Mapping[str, Any], refs: Mapping[str, float | None],
         flaps: str) -> str:  # fmt: skip
    ra = ratios(run, refs)
    return (
        f"| {name} | {label} | {_pct(run['attainment'])} | {_num(run['gpu_hours'])} | "
        f"{_num(ra.get('vs_cheapest_fixed'), '.3f')} | {_num(ra.get('vs_clairvoyant'), '.3f')} "
        f"| {_num(ra.get('vs_every_window'), '.3f')} |{f' {flaps}' if flaps else ''} |"
    )


def rows(result: Mapping[str, Any]) -> list[str]:
    """The workload's lines of the results table."""
    name, refs = result["workload"], references(result)
    out = []
    for key, run in result["runs"].items():
        label = RUN_LABELS.get(key, key)
        if "failed" in run:
            out.append(f"| {name} | {label} | failed: {run['failed']} | | | | | |")
            continue
        out.append(_row(name, label, run, refs, f"{run['flaps']} ({run['scale_events']} events)"))
    cf = result.get("cheapest_fixed")
    if cf:
        out.append(_row(name, f"cheapest fixed {cf['prefill']}P{cf['decode']}D", cf, refs, "0"))
    else:
        out.append(f"| {name} | cheapest fixed | none reached the target | | | | | |")
    out += [
        _row(name, label, result[key], refs, "")
        for key, label in BOUND_LABELS.items()
        if result.get(key)
    ]
    return out


HEADER = (
    "| Workload | Run | Attainment | GPU-hours | GPU-h / cheapest fixed | GPU-h / clairvoyant "
    "| GPU-h / every window at the target | Flaps |",
    "|---|---|---|---|---|---|---|---|",
)


def markdown(results: Sequence[Mapping[str, Any]]) -> str:
    lines = list(HEADER)
    for r in results:
        lines += rows(r)
    return "\n".join(lines) + "\n"
