"""The autoscaled demo fleet on a running local cluster, and a load run that samples it.

Where it fits: `make demo` (e2e/scenarios/demo.py) and the autoscaling e2e tests
(tests/e2e/autoscale) run the same fleet. Given a local cluster (``e2e.platform.cluster``, pods left
to the bridge), inside the private network namespace, :func:`running_fleet` starts Prometheus
(Kubernetes service discovery, the shipped relabelling), the process bridge (simulated vLLM workers
at a time scale, the real vllm-router) and the operator, applies ``e2e/scenarios/demo-fleet.yaml``
in a namespace and waits until the service is Ready; everything is stopped again on exit.
:func:`drive` replays load phases through the router while sampling the service's status every
couple of seconds (:class:`Sample`), which is what the demo plots and the tests assert on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client

from e2e.platform.bridge import Bridge, BridgeSettings
from e2e.platform.cluster import REPO_ROOT, Cluster, wait_until
from e2e.platform.loadgen import OK, LoadRun, Phase, Record, arrivals
from e2e.platform.operator_process import OperatorProcess
from e2e.platform.prometheus import Prometheus, operator_job, start_for_cluster
from e2e.platform.service import apply_crds
from pdfleet import labels

#: The demo's service (a scenario's file: data, not an import).
FLEET_FILE = REPO_ROOT / "e2e" / "scenarios" / "demo-fleet.yaml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
METRICS_AVAILABLE = "MetricsAvailable"
#: The namespace the operator's scrape target is labelled with: the chart's release namespace
#: (its ServiceMonitor's), which the chart's operator alerts select on.
OPERATOR_NAMESPACE = "pdfleet-system"


def fleet_manifest(prometheus_url: str, namespace: str, name: str = "demo") -> dict[str, Any]:
    """``e2e/scenarios/demo-fleet.yaml`` pointed at a Prometheus, in ``namespace``."""
    manifest: dict[str, Any] = yaml.safe_load(FLEET_FILE.read_text())
    manifest["metadata"]["namespace"] = namespace
    manifest["metadata"]["name"] = name
    manifest["spec"]["autoscaling"]["prometheus"]["url"] = prometheus_url
    return manifest


def slo_targets(manifest: dict[str, Any]) -> tuple[float, float]:
    """(TTFT, ITL) targets of a manifest in seconds."""
    from pdfleet.api.types import parse_duration

    slo = manifest["spec"]["slo"]
    return parse_duration(slo["ttft"]["target"]), parse_duration(slo["itl"]["target"])


@dataclass(frozen=True)
class Sample:
    """One look at the service during a load run (times in wall seconds since its start)."""

    t: float
    phase: str
    prefill: dict[str, int]
    decode: dict[str, int]
    ttft_s: float  # client p90 of the requests that ended in the last 20 s, simulated s
    itl_s: float
    rate: float  # offered: arrivals per second over the last 20 s
    errors: int
    decision: str
    metrics_available: str = ""  # the condition's status and reason, e.g. "False/MetricsMissing"
    decision_time: str = ""  # status.autoscaler.lastDecisionTime


def role_counts(status: dict[str, Any], role: str) -> dict[str, int]:
    counts = status.get(role) or {}
    return {k: int(counts.get(k, 0)) for k in ("desired", "ready", "draining", "pending")}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for item in status.get("conditions") or ():
        if item.get("type") == type_:
            return cast(dict[str, Any], item)
    return None


def p90(values: Sequence[float]) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    return ordered[int(0.9 * (len(ordered) - 1))] if ordered else math.nan


def recent(records: Sequence[Record], now: float, window: float = 20.0) -> list[Record]:
    """Completed requests that ended in the last ``window`` seconds (started, if no end)."""
    return [
        r
        for r in records
        if r.outcome == OK
        and now - window <= (r.end_s if not math.isnan(r.end_s) else r.start_s) <= now
    ]


def phase_ends(phases: Sequence[Phase]) -> list[tuple[Phase, float]]:
    ends, total = [], 0.0
    for phase in phases:
        total += phase.duration_s
        ends.append((phase, total))
    return ends


def phase_starts(phases: Sequence[Phase]) -> dict[str, float]:
    return {p.name: end - p.duration_s for p, end in phase_ends(phases)}


@dataclass
class Fleet:
    """The running service and what serves it."""

    api: Any
    namespace: str
    name: str
    manifest: dict[str, Any]
    prometheus: Prometheus
    bridge: Bridge
    operator: OperatorProcess

    def read(self) -> dict[str, Any]:
        obj = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL, self.name
        )
        return cast(dict[str, Any], obj)

    def status(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.read().get("status") or {})

    def ready(self) -> bool:
        found = condition(self.status(), "Ready")
        return found is not None and found.get("status") == "True"

    def router_url(self) -> str:
        selector = f"{labels.SERVICE}={self.name},{labels.ROLE}={labels.ROLE_ROUTER}"
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=selector
        )
        ips = [p.status.pod_ip for p in pods.items if p.status and p.status.phase == "Running"]
        ips = [ip for ip in ips if ip]
        if not ips:
            raise RuntimeError("no running router pod")
        return f"http://{ips[0]}:8000"

    def sample(self, run: LoadRun, now: float) -> tuple[Sample, dict[str, Any]]:
        obj = self.read()
        status = obj.get("status") or {}
        window = recent(run.records, now)
        phase = next((p.name for p, end in phase_ends(run.phases) if now <= end), "done")
        available = condition(status, METRICS_AVAILABLE) or {}
        autoscaler = status.get("autoscaler") or {}
        sample = Sample(
            t=now,
            phase=phase,
            prefill=role_counts(status, labels.ROLE_PREFILL),
            decode=role_counts(status, labels.ROLE_DECODE),
            ttft_s=p90([r.ttft_s for r in window]),
            itl_s=p90([r.itl_s for r in window]),
            rate=sum(1 for at, _ in arrivals(run.phases, run.seed) if now - 20 <= at <= now) / 20,
            errors=sum(1 for r in run.records if r.outcome != OK),
            decision=autoscaler.get("lastDecision", ""),
            metrics_available=(
                f"{available.get('status', '')}/{available.get('reason', '')}" if available else ""
            ),
            decision_time=autoscaler.get("lastDecisionTime", ""),
        )
        return sample, obj


Show = Callable[[Sample, dict[str, Any], LoadRun], None]
"""Called with every sample, the object it was read from, and the run (the live view)."""


async def watch(
    fleet: Fleet,
    run: LoadRun,
    started: float,
    samples: list[Sample],
    stop: asyncio.Event,
    show: Show | None = None,
    period_s: float = 2.0,
) -> None:
    while not stop.is_set():
        sample, obj = await asyncio.to_thread(fleet.sample, run, time.monotonic() - started)
        samples.append(sample)
        if show is not None:
            show(sample, obj, run)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=period_s)


@dataclass
class Drive:
    """A load run with its samples; `records` and `samples` fill in while it runs."""

    run: LoadRun
    samples: list[Sample] = field(default_factory=list)
    started: float = 0.0


async def drive(
    fleet: Fleet,
    phases: Sequence[Phase],
    time_scale: float,
    show: Show | None = None,
    during: Callable[[Drive], Any] | None = None,
    seed: int = 1,
) -> Drive:
    """Replay ``phases`` through the router while sampling the service; ``during`` (if given)
    runs in a thread alongside, e.g. to stop Prometheus mid-run."""
    run = LoadRun(
        url=fleet.router_url(), model=MODEL, phases=phases, time_scale=time_scale, seed=seed
    )
    state = Drive(run=run, started=time.monotonic())
    stop_event = asyncio.Event()
    watcher = asyncio.create_task(watch(fleet, run, state.started, state.samples, stop_event, show))
    try:
        if during is None:
            await run.run()
        else:
            await asyncio.gather(run.run(), asyncio.to_thread(during, state))
    finally:
        stop_event.set()
        await watcher
    return state


@contextlib.contextmanager
def running_fleet(
    cluster: Cluster,
    api: Any,
    workdir: Path,
    namespace: str = "default",
    time_scale: float = 10.0,
    operator_log: Path | None = None,
    keep: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    ready_timeout_s: float = 180.0,
    rule_files: Sequence[Path] = (),
    edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Iterator[Fleet]:
    """Prometheus, bridge, operator and the demo service, Ready; stopped on exit (unless
    ``keep``). A namespace other than ``default`` is created and gets a bridge of its own.
    Prometheus scrapes the workers (the shipped Kubernetes SD job) and the operator (as the
    chart's ServiceMonitor does) and evaluates ``rule_files``. ``edit`` turns the demo
    service's manifest into the one applied."""
    core = client.CoreV1Api(api)
    with contextlib.ExitStack() as stack:
        apply_crds(cluster, api)
        if namespace != "default":
            cluster.create_namespace(namespace)
            if not keep:
                stack.callback(_delete_namespace, core, namespace)
        operator = OperatorProcess(
            kubeconfig=cluster.kubeconfig,
            log_path=operator_log or workdir / "operator.log",
            resync_seconds=5.0,
        )
        progress("starting Prometheus (Kubernetes service discovery) ...")
        scrape_operator = operator_job(
            f"127.0.0.1:{operator.metrics_port}", OPERATOR_NAMESPACE, operator.identity
        )
        prometheus = start_for_cluster(
            cluster, workdir / "prometheus", extra_jobs=[scrape_operator], rule_files=rule_files
        )
        if not keep:
            stack.callback(prometheus.stop)
        progress("starting the process bridge (simulated vLLM workers, real vllm-router) ...")
        bridge = Bridge(
            BridgeSettings(
                kubeconfig=cluster.kubeconfig,
                log_dir=workdir / "bridge",
                namespace=None if namespace == "default" else namespace,
                time_scale=time_scale,
                probe_period_max_s=3.0,
                # the exec readiness probe is a Python start: on two shared, loaded cores its
                # spec timeout (3 s) flaps every pod NotReady and out of the router at once
                probe_timeout_min_s=10.0,
            )
        ).start()
        if not keep:
            stack.callback(bridge.stop)
        progress("starting the operator ...")
        operator.start()
        if not keep:
            stack.callback(operator.stop)
        operator.wait_healthy()
        manifest = fleet_manifest(prometheus.url, namespace)
        if edit is not None:
            manifest = edit(manifest)
        cluster.apply([manifest])
        fleet = Fleet(api, namespace, manifest["metadata"]["name"], manifest, prometheus, bridge,
                      operator)  # fmt: skip
        if not keep:
            stack.callback(_delete_service, fleet)
        progress("applied e2e/scenarios/demo-fleet.yaml; waiting for the fleet to be Ready ...")
        wait_until(fleet.ready, ready_timeout_s, "the demo fleet Ready", interval_s=1.0)
        yield fleet


def _delete_service(fleet: Fleet) -> None:
    """Delete the service while the bridge still runs, so that its pods are finalized."""
    with contextlib.suppress(client.ApiException):
        client.CustomObjectsApi(fleet.api).delete_namespaced_custom_object(
            labels.GROUP, labels.VERSION, fleet.namespace, labels.PLURAL, fleet.name
        )
    core = client.CoreV1Api(fleet.api)
    selector = f"{labels.SERVICE}={fleet.name}"
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: not core.list_namespaced_pod(fleet.namespace, label_selector=selector).items,
            60,
            "the service's pods gone",
            interval_s=1.0,
        )


def _delete_namespace(core: Any, namespace: str) -> None:
    with contextlib.suppress(client.ApiException):
        core.delete_namespace(namespace)
