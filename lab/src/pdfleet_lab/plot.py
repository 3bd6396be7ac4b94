"""PNG of one benchmark workload: load, replicas per role, and latency over time.

Where it fits: `pdfleet_lab.bench` calls `plot_workload` with the result dict it also
writes as JSON. matplotlib is a dev/bench dependency only, so it is imported here, lazily.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

_STYLE = {"pdfleet": "-", "pdfleet-learned": "-.", "threshold": ":", "planner": "--"}


def _series(timeline: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    ts = [row["t"] / 60.0 for row in timeline]
    return ts, [row[key] for row in timeline]


def plot_workload(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timelines: dict[str, list[dict[str, float]]] = result["timelines"]
    slo = result["slo"]
    fig, (ax_load, ax_rep, ax_lat) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ref = timelines.get("pdfleet") or next(iter(timelines.values()), [])
    if ref:
        ax_load.plot(*_series(ref, "prompt_tps"), label="prompt tokens/s", color="tab:blue")
        ax2 = ax_load.twinx()
        ax2.plot(*_series(ref, "gen_tps"), label="generated tokens/s", color="tab:orange")
        ax2.set_ylabel("generated tokens/s")
        ax_load.set_ylabel("prompt tokens/s")
        ax_load.legend(loc="upper left")
        ax2.legend(loc="upper right")
    ax_load.set_title(f"{result['workload']}: load, replicas, p95 latency (1-min windows)")
    for name, tl in timelines.items():
        style = _STYLE.get(name, "-")
        ax_rep.step(
            *_series(tl, "prefill"),
            where="post",
            linestyle=style,
            color="tab:blue",
            label=f"{name} prefill",
        )
        ax_rep.step(
            *_series(tl, "decode"),
            where="post",
            linestyle=style,
            color="tab:orange",
            label=f"{name} decode",
        )
    cf = result.get("cheapest_fixed")
    if cf:
        ax_rep.axhline(
            cf["prefill"],
            color="tab:blue",
            alpha=0.3,
            linewidth=4,
            label=f"cheapest fixed {cf['prefill']}P{cf['decode']}D",
        )
        ax_rep.axhline(cf["decode"], color="tab:orange", alpha=0.3, linewidth=4)
    cv = result.get("clairvoyant")
    if cv:
        xs = [row[0] / 60.0 for row in cv["plan"]]
        ax_rep.step(
            xs,
            [row[1] for row in cv["plan"]],
            where="post",
            color="tab:green",
            alpha=0.6,
            label="clairvoyant prefill",
        )
        ax_rep.step(
            xs,
            [row[2] for row in cv["plan"]],
            where="post",
            color="tab:red",
            alpha=0.6,
            label="clairvoyant decode",
        )
    ax_rep.set_ylabel("replicas")
    ax_rep.legend(fontsize=7, ncol=3, loc="upper left")
    if ref:
        t, ttft = _series(ref, "ttft_prefill")
        _, ttft_d = _series(ref, "ttft_decode")
        e2e = [a + (b if not math.isnan(b) else 0.0) for a, b in zip(ttft, ttft_d, strict=True)]
        ax_lat.plot(t, e2e, color="tab:blue", label="pdfleet TTFT p95 (prefill + decode side)")
        ax_lat.axhline(slo["ttft_s"], color="tab:blue", linestyle="--", alpha=0.5)
        ax_lat.set_ylabel("TTFT, s")
        ax_lat.set_yscale("log")
        ax3 = ax_lat.twinx()
        ax3.plot(*_series(ref, "itl"), color="tab:orange", label="pdfleet ITL p95")
        ax3.axhline(slo["itl_s"], color="tab:orange", linestyle="--", alpha=0.5)
        ax3.set_ylabel("ITL, s")
        ax_lat.legend(loc="upper left", fontsize=8)
        ax3.legend(loc="upper right", fontsize=8)
    ax_lat.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
