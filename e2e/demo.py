"""`make demo`: a P/D fleet that rebalances itself under changing load, on one machine.

Where it fits: the README's main command. Inside the private network namespace it starts the
local cluster (kwok GPU nodes), Prometheus (Kubernetes service discovery, the relabelling
users get), the process bridge (simulated vLLM workers and the real vllm-router), and the
operator; applies `e2e/demo-fleet.yaml`; then replays a load that first stresses prefill
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
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from e2e.bridge import OWNED_LABEL, Bridge, BridgeSettings
from e2e.cluster import REPO_ROOT, Cluster, ClusterConfig, start, stop
from e2e.loadgen import OK, LoadRun, Phase, Record, summarize
from e2e.operator_process import OperatorProcess
from pdfleet import labels

NAMESPACE = "default"
FLEET_FILE = Path(__file__).with_name("demo-fleet.yaml")


def demo_phases(speed: float = 1.0) -> list[Phase]:
    """Wall-clock phases (time scale 10): warm up, a long-prompt surge, a long-output surge.

    Sizing with the Llama-3.1-8B/H200 latency model: a prefill replica sustains ~45k prompt
    tokens per simulated second (4.5k per wall second at scale 10), so 2.5 req/s of 4,000-token
    prompts needs 2-3 prefill replicas; a decode step costs 5.0 ms + 0.059 ms per running
    request at a 1.6k-token context, so ~45 concurrent 256-token streams break a 7 ms ITL on
    one decode replica but not on two."""
    return [
        Phase("warm-up", 30 * speed, 0.5, 1000, 32),
        Phase("long prompts", 150 * speed, 2.5, 4000, 16),
        Phase("long outputs", 180 * speed, 2.25, 1500, 256),
        Phase("cool-down", 30 * speed, 0.3, 500, 32),
    ]


@dataclass(frozen=True)
class Sample:
    """One tick of the live view, kept for the plot."""

    t: float
    phase: str
    prefill: dict[str, int]
    decode: dict[str, int]
    ttft_s: float
    itl_s: float
    rate: float
    errors: int
    decision: str


def fleet_manifest(prometheus_url: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(FLEET_FILE.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    manifest["spec"]["autoscaling"]["prometheus"]["url"] = prometheus_url
    return manifest


def _role(status: dict[str, Any], role: str) -> dict[str, int]:
    counts = status.get(role) or {}
    return {k: int(counts.get(k, 0)) for k in ("desired", "ready", "draining", "pending")}


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


def _p90(values: list[float]) -> float:
    values = sorted(v for v in values if not math.isnan(v))
    return values[int(0.9 * (len(values) - 1))] if values else math.nan


def recent(records: Sequence[Record], now: float, window: float = 20.0) -> list[Record]:
    return [r for r in records if r.outcome == OK and now - window <= r.start_s <= now]


def plot(samples: Sequence[Sample], slo_s: tuple[float, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (ax_load, ax_rep, ax_lat) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ax_load.plot(t, [s.rate for s in samples], color="black")
    ax_load.set_ylabel("requests/s (wall)")
    phase_starts: dict[str, float] = {}
    for s in samples:
        phase_starts.setdefault(s.phase, s.t)
    for name, at in phase_starts.items():
        for ax in (ax_load, ax_rep, ax_lat):
            ax.axvline(at, color="grey", linestyle=":", linewidth=0.8)
        ax_load.annotate(name, (at, 0), xytext=(3, 3), textcoords="offset points", fontsize=8)
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
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


async def watch(
    api: Any,
    run: LoadRun,
    started: float,
    samples: list[Sample],
    stop: asyncio.Event,
    live: bool,
) -> None:
    while not stop.is_set():
        now = time.monotonic() - started
        obj = await asyncio.to_thread(read_fleet, api)
        status = obj.get("status") or {}
        window = recent(run.records, now)
        phase = next((p.name for p, end in _phase_ends(run.phases) if now <= end), "done")
        sample = Sample(
            t=now,
            phase=phase,
            prefill=_role(status, "prefill"),
            decode=_role(status, "decode"),
            ttft_s=_p90([r.ttft_s for r in window]),
            itl_s=_p90([r.itl_s for r in window]),
            rate=sum(1 for r in run.records if now - 20 <= r.start_s <= now) / 20.0,
            errors=sum(1 for r in run.records if r.outcome != OK),
            decision=(status.get("autoscaler") or {}).get("lastDecision", ""),
        )
        samples.append(sample)
        if live:
            ok = sum(1 for r in run.records if r.outcome == OK)
            screen = render_view(sample, obj["spec"].get("slo") or {}, len(run.records), ok)
            sys.stdout.write("\x1b[2J\x1b[H" + screen + "\n")
            sys.stdout.flush()
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=2.0)


def _phase_ends(phases: Sequence[Phase]) -> list[tuple[Phase, float]]:
    ends, total = [], 0.0
    for phase in phases:
        total += phase.duration_s
        ends.append((phase, total))
    return ends


async def drive(api: Any, url: str, args: argparse.Namespace) -> tuple[list[Record], list[Sample]]:
    run = LoadRun(
        url=url,
        model="meta-llama/Llama-3.1-8B-Instruct",
        phases=demo_phases(args.speed),
        time_scale=args.time_scale,
    )
    samples: list[Sample] = []
    stop_event = asyncio.Event()
    started = time.monotonic()
    watcher = asyncio.create_task(watch(api, run, started, samples, stop_event, args.live))
    try:
        await run.run()
    finally:
        stop_event.set()
        await watcher
    return run.records, samples


def read_fleet(api: Any) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        labels.GROUP, labels.VERSION, NAMESPACE, labels.PLURAL, "demo"
    )
    return cast(dict[str, Any], obj)


def wait_ready(api: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = read_fleet(api)
        for condition in (obj.get("status") or {}).get("conditions") or ():
            if condition["type"] == "Ready" and condition["status"] == "True":
                return
        time.sleep(1)
    raise TimeoutError("the demo fleet did not become Ready")


def router_url(api: Any) -> str:
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(
            NAMESPACE, label_selector=f"{labels.SERVICE}=demo,{labels.ROLE}={labels.ROLE_ROUTER}"
        )
        .items
    )
    ips = [p.status.pod_ip for p in pods if p.status and p.status.phase == "Running"]
    ips = [ip for ip in ips if ip]
    if not ips:
        raise RuntimeError("no running router pod")
    return f"http://{ips[0]}:8000"


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
    from e2e.prometheus import start_for_cluster  # the Prometheus harness

    wall = time.monotonic()
    with ExitStack() as stack:
        print("starting the local cluster (kwok GPU nodes) ...", flush=True)
        cluster: Cluster = start(
            ClusterConfig(name="pdfleet-demo", workdir=work / "kwok", bridge_label=OWNED_LABEL)
        )
        if not args.keep:
            stack.callback(stop, cluster)
        cluster.apply(
            list(
                yaml.safe_load_all(
                    (REPO_ROOT / "crds" / f"{labels.GROUP}_{labels.PLURAL}.yaml").read_text()
                )
            )
        )
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        print("starting Prometheus (Kubernetes service discovery) ...", flush=True)
        prometheus = start_for_cluster(cluster, work / "prometheus")
        if not args.keep:
            stack.callback(prometheus.stop)
        print(
            "starting the process bridge (simulated vLLM workers, real vllm-router) ...", flush=True
        )
        bridge = Bridge(
            BridgeSettings(
                kubeconfig=cluster.kubeconfig,
                log_dir=work / "bridge",
                time_scale=args.time_scale,
                probe_period_max_s=2.0,
            )
        ).start()
        if not args.keep:
            stack.callback(bridge.stop)
        print("starting the operator ...", flush=True)
        operator = OperatorProcess(
            kubeconfig=cluster.kubeconfig, log_path=args.out / "operator.log", resync_seconds=5.0
        ).start()
        if not args.keep:
            stack.callback(operator.stop)
        operator.wait_healthy()
        manifest = fleet_manifest(prometheus.url)
        cluster.apply([manifest])
        print("applied e2e/demo-fleet.yaml; waiting for the fleet to be Ready ...", flush=True)
        wait_ready(api)
        records, samples = asyncio.run(drive(api, router_url(api), args))
        slo = (0.5, 0.007)
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


def keep_instructions(cluster: Cluster) -> str:
    return (
        "\nThe fleet keeps running in this network namespace. From another terminal:\n"
        f"  e2e/netns.sh --join {os.getpid()} bash\n"
        f"  export KUBECONFIG={cluster.kubeconfig}\n"
        "  kubectl get pdis,pods -o wide\n"
        "Stop everything with: python -m e2e.cluster down (inside the namespace)"
    )


if __name__ == "__main__":
    sys.exit(main())
