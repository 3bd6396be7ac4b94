"""`make demo`: a P/D fleet that rebalances itself under changing load, on one machine.

Where it fits: the README's main command. Inside the private network namespace it starts the
local cluster (kwok GPU nodes), Prometheus (Kubernetes service discovery, the relabelling
users get), the process bridge (simulated vLLM workers and the real vllm-router), and the
operator; applies `e2e/scenarios/demo-fleet.yaml`; then replays a load that first stresses prefill
(long prompts) and then decode (long outputs) while a live view shows what the autoscaler
does. At the end it writes a PNG of the run and a summary, and tears everything down (or,
with --keep, leaves it running with instructions).

Times shown are simulated seconds: the simulators run `--time-scale` times slower than real
time so that this 2-core machine can carry the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import config

from e2e.platform.bridge import OWNED_LABEL
from e2e.platform.cluster import REPO_ROOT, Cluster, ClusterConfig, start, stop
from e2e.platform.fleet import Sample, drive, running_fleet, slo_targets
from e2e.platform.loadgen import OK, LoadRun, Phase, Record, summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.transforms import Bbox

__all__ = ["Sample", "demo_phases", "main", "render_view", "summary_text"]

NAMESPACE = "default"


def demo_phases(speed: float = 1.0) -> list[Phase]:
    """Wall-clock phases (time scale 10): warm up, a long-prompt surge, a long-output surge.

    Sizing with the Llama-3.1-8B latency model: a prefill replica sustains ~45k prompt tokens
    per simulated second (4.5k per wall second at scale 10), so 2 req/s of 4,000-token prompts
    (8k/s, bursts above 10k/s) needs 3 prefill replicas and the 4-GPU budget takes one of the
    two decode replicas. A decode step costs 5.0 ms + (0.011 + 0.000029 x context) ms per
    running request, so ~35 concurrent 384-token streams at a 1.7k-token context (1.4 req/s)
    break the 6 ms ITL target on one decode replica (~7 ms) and need three on the policy's
    fitted capacity; their prompts (2.1k/s) fit one prefill replica. The load stays light on
    CPU: ~15 SSE chunks per second per stream."""
    return [
        Phase("warm-up", 20 * speed, 0.5, 1000, 128),
        Phase("long prompts", 80 * speed, 2.0, 4000, 16),
        Phase("long outputs", 200 * speed, 1.4, 1500, 384),
        Phase("cool-down", 20 * speed, 0.3, 500, 32),
    ]


def _fmt_s(value: float) -> str:
    return "   n/a" if math.isnan(value) else f"{value * 1000:6.0f}ms"


def render_view(sample: Sample, slo: dict[str, Any], total: int, ok: int) -> str:
    """Pure: one screen of the live view."""
    ttft_target = slo.get("ttft", {}).get("target", "?")
    itl_target = slo.get("itl", {}).get("target", "?")
    lines = [
        f"pdfleet demo  t={sample.t:5.0f}s  phase: {sample.phase:<13} requests {ok}/{total} ok"
        f", {sample.errors} failed",
        "",
        "  pool      desired  ready  draining  pending",
    ]
    for role in ("prefill", "decode"):
        c = getattr(sample, role)
        lines.append(
            f"  {role:<8} {c['desired']:8d} {c['ready']:6d} {c['draining']:9d} {c['pending']:8d}"
        )
    lines += [
        "",
        f"  TTFT p90 (client, last 20 s) {_fmt_s(sample.ttft_s)}   target {ttft_target}",
        f"  ITL  p90 (client, last 20 s) {_fmt_s(sample.itl_s)}   target {itl_target}",
        f"  request rate {sample.rate:5.2f}/s",
        f"  autoscaler: {sample.decision}",
    ]
    return "\n".join(lines)


def plot(samples: Sequence[Sample], slo_s: tuple[float, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (ax_load, ax_rep, ax_lat) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    rates = [s.rate for s in samples]
    ax_load.plot(t, rates, color="black")
    ax_load.set_ylabel("requests/s (wall)")
    # Headroom above the load for the phase names (label_phases may stack them in rows).
    ax_load.set_ylim(0, max([*rates, 0.1]) * 1.45)
    phase_starts: dict[str, float] = {}
    for s in samples:
        phase_starts.setdefault(s.phase, s.t)
    for at in phase_starts.values():
        for ax in (ax_load, ax_rep, ax_lat):
            ax.axvline(at, color="grey", linestyle=":", linewidth=0.8)
    for role, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
        ax_rep.step(
            t,
            [getattr(s, role)["desired"] for s in samples],
            where="post",
            color=color,
            label=f"{role} desired",
        )
        ax_rep.plot(
            t,
            [getattr(s, role)["ready"] for s in samples],
            color=color,
            linestyle="--",
            label=f"{role} ready",
        )
    ax_rep.set_ylabel("workers")
    ax_rep.legend(loc="upper left", fontsize=8)
    ax_lat.plot(t, [s.ttft_s * 1000 for s in samples], color="tab:blue", label="TTFT p90")
    ax_lat.axhline(slo_s[0] * 1000, color="tab:blue", linestyle=":", label="TTFT target")
    ax_itl = ax_lat.twinx()
    ax_itl.plot(t, [s.itl_s * 1000 for s in samples], color="tab:orange", label="ITL p90")
    ax_itl.axhline(slo_s[1] * 1000, color="tab:orange", linestyle=":", label="ITL target")
    ax_lat.set_ylabel("TTFT ms (simulated)")
    ax_itl.set_ylabel("ITL ms (simulated)")
    ax_lat.set_xlabel("seconds since start (wall)")
    ax_lat.legend(loc="upper left", fontsize=8)
    ax_itl.legend(loc="upper right", fontsize=8)
    fig.suptitle("pdfleet demo: the autoscaler rebalances prefill and decode under a load shift")
    fig.tight_layout()
    label_phases(ax_load, phase_starts)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def label_phases(ax: Axes, phase_starts: dict[str, float]) -> None:
    """Each phase's name at its start, along the top of `ax`, on the first row where it
    overlaps no other name: a short phase would otherwise print its name over the next one's.
    Call it once the axes' limits and the layout are final."""
    ax.get_xlim()  # settles the shared x autoscaling before the names are measured
    placed: list[Bbox] = []
    for name, at in phase_starts.items():
        for row in range(len(phase_starts)):
            label = ax.annotate(
                name,
                (at, 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3 - 11 * row),
                textcoords="offset points",
                va="top",
                fontsize=8,
                annotation_clip=False,
            )
            box = label.get_window_extent().padded(4)  # a gap of a few pixels between names
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()


def summary_text(
    records: Sequence[Record], samples: Sequence[Sample], wall_s: float, slo_s: tuple[float, float]
) -> str:
    stats = summarize(records)
    ok = [r for r in records if r.outcome == OK]
    met = sum(1 for r in ok if r.ttft_s <= slo_s[0] and r.itl_s <= slo_s[1])
    peak = {
        role: max((getattr(s, role)["desired"] for s in samples), default=0)
        for role in ("prefill", "decode")
    }
    decisions = sorted({s.decision for s in samples if s.decision})
    return "\n".join(
        [
            "pdfleet demo summary",
            f"  wall time            {wall_s:.0f} s",
            f"  requests             {int(stats['requests'])} sent, {int(stats['ok'])} ok, "
            f"{int(stats['errors'])} failed, {int(stats['truncated'])} truncated",
            f"  SLO attainment       {met / max(len(ok), 1):.1%} of completed requests met both "
            f"TTFT <= {slo_s[0] * 1000:.0f} ms and ITL <= {slo_s[1] * 1000:.0f} ms",
            f"  TTFT p50/p90         {_fmt_s(stats['ttft_p50_s'])} / {_fmt_s(stats['ttft_p90_s'])}",
            f"  ITL  p50/p90         {_fmt_s(stats['itl_p50_s'])} / {_fmt_s(stats['itl_p90_s'])}",
            f"  peak workers         prefill {peak['prefill']}, decode {peak['decode']}",
            f"  distinct decisions   {len(decisions)}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave everything running at the end")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "demo")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="wall seconds per simulated second in the worker simulators",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="phase length multiplier")
    parser.add_argument("--no-live", dest="live", action="store_false", help="no live view")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "state"

    wall = time.monotonic()
    with ExitStack() as stack:
        print("starting the local cluster (kwok GPU nodes) ...", flush=True)
        cluster: Cluster = start(
            ClusterConfig(name="pdfleet-demo", workdir=work / "kwok", bridge_label=OWNED_LABEL)
        )
        if not args.keep:
            stack.callback(stop, cluster)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        fleet = stack.enter_context(
            running_fleet(
                cluster,
                api,
                work,
                NAMESPACE,
                args.time_scale,
                operator_log=args.out / "operator.log",
                keep=args.keep,
                progress=lambda line: print(line, flush=True),
            )
        )
        show = _live_view if args.live else None
        state = asyncio.run(drive(fleet, demo_phases(args.speed), args.time_scale, show))
        records, samples = state.run.records, state.samples
        slo = slo_targets(fleet.manifest)
        plot(samples, slo, args.out / "demo.png")
        text = summary_text(records, samples, time.monotonic() - wall, slo)
        (args.out / "summary.txt").write_text(text + "\n")
        (args.out / "samples.json").write_text(json.dumps([asdict(s) for s in samples], indent=1))
        (args.out / "requests.jsonl").write_text(
            "".join(json.dumps(asdict(r)) + "\n" for r in records)
        )
        print("\n" + text)
        print(f"\nwrote {args.out / 'demo.png'} and {args.out / 'summary.txt'}")
        if args.keep:
            print(keep_instructions(cluster))
    return 0


def _live_view(sample: Sample, obj: dict[str, Any], run: LoadRun) -> None:
    ok = sum(1 for r in run.records if r.outcome == OK)
    screen = render_view(sample, obj["spec"].get("slo") or {}, len(run.records), ok)
    sys.stdout.write("\x1b[2J\x1b[H" + screen + "\n")
    sys.stdout.flush()


def keep_instructions(cluster: Cluster) -> str:
    return (
        "\nThe fleet keeps running in this network namespace. From another terminal:\n"
        f"  e2e/platform/netns.sh --join {os.getpid()} bash\n"
        f"  export KUBECONFIG={cluster.kubeconfig}\n"
        "  kubectl get pdis,pods -o wide\n"
        "Stop everything with: python -m e2e.platform.cluster down (inside the namespace)"
    )


if __name__ == "__main__":
    sys.exit(main())
