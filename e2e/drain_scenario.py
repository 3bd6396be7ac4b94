"""Graceful scale-down on the local cluster under streaming load: the drain's end-to-end proof.

Where it fits: docs/drain.md describes the drain and tests/router/test_drain_router.py proves
it against the router alone. Here the whole path runs: the operator as a real process
(e2e/operator_process.py) patches StatefulSets on the local cluster (e2e/cluster.py), the
process bridge (e2e/bridge.py) runs the simulators and the real vllm-router, which finds the
workers through its Kubernetes discovery. tests/e2e_drain uses the pieces; the command line
runs the long version and prints the figures::

    e2e/netns.sh .venv/bin/python -m e2e.drain_scenario --cycles 20

What is counted: at the client, HTTP errors (`failed`) and streams without `[DONE]` or with
fewer tokens than asked (`truncated`); in every simulator's log (it outlives its pod), KV
recomputes, failed KV pulls and expired KV leases; on the router's metrics port, its prefill
and decode error counters. Drain durations come from the operator's `Drained` Events, their
start from the pod annotation (polled), their deregistration from the router's GET /workers
(polled), so each drain is set against the requests it could still hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client, config

from e2e.bridge import OWNED_LABEL, Bridge, BridgeSettings
from e2e.closed_loop import Load, Result, count
from e2e.cluster import (
    REPO_ROOT,
    Cluster,
    ClusterConfig,
    require_private_netns,
    require_toolchain,
    start,
    stop,
    toolchain_bin_dir,
    wait_until,
)
from e2e.operator_process import OperatorProcess, parse_metrics
from pdfleet import labels

SERVICE = "llama-8b"
ENGINE_PORT = 8000
ROUTER_METRICS_PORT = 29000
HIGH = {labels.ROLE_PREFILL: 3, labels.ROLE_DECODE: 4}
LOW = {labels.ROLE_PREFILL: 1, labels.ROLE_DECODE: 1}
#: Wall seconds per simulated second (bridge setting): real time, requests of 0.2-2 s.
TIME_SCALE = 1.0
#: Probe periods capped at this: the startup probe (10 s in the spec) polls faster, and the
#: exec readiness probe (a Python start each time) keeps its spec period.
PROBE_PERIOD_MAX_S = 5.0
#: The exec readiness probe's 3 s timeout is too short for a Python start on two loaded,
#: shared cores: pods would flap NotReady (and out of the router) for no reason of their own.
PROBE_TIMEOUT_MIN_S = 10.0
SIM_LOG_COUNTERS = {
    "recomputed": "Got invalid KVTransferParams",
    "kv_pull_failed": "KV load failed for",
    "kv_expired": "freed KV of",
}
_DRAINED = re.compile(r"^(\S+) \((\w+)\) drained in ([0-9.]+)s")
_FORCED = re.compile(r"^(\S+) \((\w+)\) removed after ([0-9.]+)s")


# ----- the service on the cluster --------------------------------------------------------------


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def replicas_patch(counts: Mapping[str, int]) -> dict[str, Any]:
    """Fixed pool sizes (autoscaling off): min = max = initial."""
    return {
        "spec": {
            role: {"replicas": {"min": n, "max": n, "initial": n}} for role, n in counts.items()
        }
    }


def service_manifest(namespace: str, counts: Mapping[str, int]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO_ROOT / "crds/samples/minimal.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["router"] = {"healthCheckInterval": "2s"}
    doc["spec"]["drain"] = {"timeout": "60s"}
    for role, n in counts.items():
        doc["spec"][role]["replicas"] = {"min": n, "max": n, "initial": n}
    return doc


@dataclass
class Service:
    """One InferenceService and what the tests read about it."""

    api: Any
    namespace: str
    log_dir: Path
    """The bridge's log directory: one folder per pod (uid), kept after the pod is gone."""
    name: str = SERVICE
    bridge: Bridge | None = None
    """The bridge running its pods (process ids, to kill a container's process)."""

    def __post_init__(self) -> None:
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.apps: Any = client.AppsV1Api(self.api)

    def scale(self, counts: Mapping[str, int]) -> None:
        self.custom.patch_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL, self.name,
            replicas_patch(counts),
        )  # fmt: skip

    def pods(self) -> list[dict[str, Any]]:
        resp = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{labels.SERVICE}={self.name}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(resp.data)["items"]
        return items

    def role_pods(self, role: str) -> list[dict[str, Any]]:
        return [p for p in self.pods() if p["metadata"]["labels"].get(labels.ROLE) == role]

    def router_ip(self) -> str:
        """The router pod's IP (one replica; Ready or not: its /readiness follows workers)."""
        (pod,) = [
            p
            for p in self.role_pods(labels.ROLE_ROUTER)
            if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
        ]
        return str(pod["status"]["podIP"])

    def router(self) -> str:
        return f"http://{self.router_ip()}:{ENGINE_PORT}"

    def statefulset_replicas(self, role: str) -> int | None:
        items = self.apps.list_namespaced_stateful_set(
            self.namespace, label_selector=f"{labels.SERVICE}={self.name},{labels.ROLE}={role}"
        ).items
        return int(items[0].spec.replicas) if items else None

    def events(self, reasons: Sequence[str]) -> list[Any]:
        items = self.core.list_namespaced_event(self.namespace).items
        return [e for e in items if e.reason in reasons]


def router_workers(router: str) -> dict[str, tuple[str, bool]] | None:
    """worker URL -> (type, healthy) from GET /workers; None when the router does not answer."""
    try:
        body = httpx.get(f"{router}/workers", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    return {w["url"]: (w["worker_type"], bool(w["is_healthy"])) for w in body.get("workers", ())}


def pod_url(pod: Mapping[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:{ENGINE_PORT}"


def unsettled(service: Service, counts: Mapping[str, int]) -> str:
    """What keeps the pools from their counts ("" when every StatefulSet is at its count, its
    pods Ready, none leaving or marked, and the router lists exactly those, healthy)."""
    pods = service.pods()
    listed = router_workers(service.router())
    if listed is None:
        return "router does not answer"
    for role, n in counts.items():
        replicas = service.statefulset_replicas(role)
        if replicas != n:
            return f"{role}: StatefulSet at {replicas}"
        mine = [p for p in pods if p["metadata"]["labels"].get(labels.ROLE) == role]
        if len(mine) != n or any(p["metadata"].get("deletionTimestamp") for p in mine):
            return f"{role}: {len(mine)} pods, some may be leaving"
        if not all(is_ready(p) and p["status"].get("podIP") for p in mine):
            return f"{role}: not all Ready"
        if any(labels.DRAINING in (p["metadata"].get("annotations") or {}) for p in mine):
            return f"{role}: a pod is still marked draining"
        expected = {pod_url(p): (role, True) for p in mine}
        actual = {u: v for u, v in listed.items() if v[0] == role}
        if actual != expected:
            return f"{role}: router lists {actual}, pods are {sorted(expected)}"
    return ""


def settled(service: Service, counts: Mapping[str, int]) -> bool:
    return not unsettled(service, counts)


def wait_settled(service: Service, counts: Mapping[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    why = unsettled(service, counts)
    while why:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{service.name} not at {dict(counts)} after {timeout_s:.0f}s: {why}"
            )
        time.sleep(0.5)
        why = unsettled(service, counts)


# ----- what the drains did ---------------------------------------------------------------------


def epoch(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Recorder(threading.Thread):
    """Polls the pods and the router: when each drain started (the annotation) and when the
    worker left the router (first poll without it; an upper bound by one poll)."""

    def __init__(self, service: Service, period_s: float = 0.25):
        super().__init__(name="drain-recorder", daemon=True)
        self.service, self.period_s = service, period_s
        self.marks: dict[tuple[str, str], dict[str, Any]] = {}
        self._halt = threading.Event()
        self.router = service.router()

    def run(self) -> None:
        while not self._halt.wait(self.period_s):
            with contextlib.suppress(Exception):  # a missed poll only widens the bounds
                self._poll()

    def _poll(self) -> None:
        listed = router_workers(self.router)
        now = time.time()
        for pod in self.service.pods():
            since = (pod["metadata"].get("annotations") or {}).get(labels.DRAINING)
            if not since or not pod["status"].get("podIP"):
                continue
            entry = self.marks.setdefault(
                (pod["metadata"]["name"], since),
                {"since": epoch(since), "url": pod_url(pod), "deregistered": None},
            )
            if entry["deregistered"] is None and listed is not None and entry["url"] not in listed:
                entry["deregistered"] = now

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


@dataclass(frozen=True)
class Drain:
    pod: str
    role: str
    since: float
    duration_s: float
    forced: bool
    deregistered: float | None
    holdable_s: float
    """Longest the pod could still be busy, from its mark: the latest end of any request
    started before its deregistration (requests on every worker, so an upper bound)."""


def parse_drain_event(message: str) -> tuple[str, str, float, bool] | None:
    for pattern, forced in ((_DRAINED, False), (_FORCED, True)):
        match = pattern.match(message)
        if match:
            return match.group(1), match.group(2), float(match.group(3)), forced
    return None


def holdable_s(results: Sequence[Result], since: float, deregistered: float | None) -> float:
    """Latest end, after `since`, of any request that started before the worker left the
    router (or before the drain began when that is not known)."""
    cutoff = deregistered if deregistered is not None else since
    ends = [r.ended - since for r in results if r.started < cutoff and r.ended > since]
    return max(ends, default=0.0)


def match_drains(
    events: Sequence[Any], marks: Mapping[tuple[str, str], Mapping[str, Any]],
    results: Sequence[Result],
) -> list[Drain]:  # fmt: skip
    """Pair each Drained/DrainForced Event with the mark it ends (same pod, the one whose
    start + duration is nearest the Event's time, whole seconds)."""
    drains = []
    for event in events:
        parsed = parse_drain_event(event.message or "")
        if parsed is None:
            continue
        pod, role, duration, forced = parsed
        at = (event.last_timestamp or event.first_timestamp).timestamp()
        candidates = [m for (name, _), m in marks.items() if name == pod]
        if not candidates:
            continue
        mark = min(candidates, key=lambda m: abs(m["since"] + duration - (at + 0.5)))
        drains.append(
            Drain(
                pod, role, mark["since"], duration, forced, mark["deregistered"],
                holdable_s(results, mark["since"], mark["deregistered"]),
            )
        )  # fmt: skip
    return sorted(drains, key=lambda d: d.since)


# ----- counters on the simulators and the router ------------------------------------------------


def sim_log_counters(log_dir: Path, namespace: str) -> dict[str, int]:
    """Recomputes, failed KV pulls and expired leases in every worker log of the namespace
    (one directory per pod uid, kept after the pod is gone)."""
    totals = dict.fromkeys(SIM_LOG_COUNTERS, 0)
    for path in log_dir.glob(f"{namespace}_*/vllm.log"):
        text = path.read_text(errors="replace")
        for key, needle in SIM_LOG_COUNTERS.items():
            totals[key] += text.count(needle)
    return totals


def router_error_counters(router_ip: str) -> dict[str, float]:
    text = httpx.get(f"http://{router_ip}:{ROUTER_METRICS_PORT}/metrics", timeout=5).text
    totals: dict[str, float] = {}
    for key, value in parse_metrics(text).items():
        name = key.split("{")[0]
        if name.startswith("vllm_router_pd_") and name.endswith("_errors_total"):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def router_gauges(router_ip: str) -> dict[str, float]:
    """worker URL -> pending + active decode requests, as the router counts them."""
    text = httpx.get(f"http://{router_ip}:{ROUTER_METRICS_PORT}/metrics", timeout=5).text
    loads: dict[str, float] = {}
    for key, value in parse_metrics(text).items():
        if key.startswith(("vllm_router_pd_pending_decode", "vllm_router_pd_active_decode")):
            worker = re.search(r'worker="([^"]+)"', key)
            if worker:
                loads[worker.group(1)] = loads.get(worker.group(1), 0.0) + value
    return loads


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def drain_summary(drains: Sequence[Drain]) -> dict[str, Any]:
    durations = [d.duration_s for d in drains]
    return {
        "drains": len(drains),
        "forced": sum(1 for d in drains if d.forced),
        "median_s": round(statistics.median(durations), 2) if durations else None,
        "p90_s": round(percentile(durations, 0.9), 2),
        "max_s": round(max(durations, default=0.0), 2),
        "max_holdable_s": round(max((d.holdable_s for d in drains), default=0.0), 2),
        "worst_over_holdable_s": round(
            max((d.duration_s - d.holdable_s for d in drains), default=0.0), 2
        ),
    }


# ----- scale cycles -------------------------------------------------------------------------


def scale_and_settle(service: Service, counts: Mapping[str, int], timeout_s: float) -> float:
    started = time.monotonic()
    service.scale(counts)
    wait_settled(service, counts, timeout_s)
    return time.monotonic() - started


def run_cycles(
    service: Service, cycles: int, timeout_s: float = 180.0,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[list[tuple[float, float]], str | None]:  # fmt: skip
    """`cycles` times: every pool HIGH -> LOW -> HIGH, each step settled (down_s, up_s).

    A step that does not settle in `timeout_s` ends the run early; the cycles done so far
    and why it stopped are returned, so that what was measured is still reported."""
    timings: list[tuple[float, float]] = []
    for i in range(cycles):
        try:
            down = scale_and_settle(service, LOW, timeout_s)
            up = scale_and_settle(service, HIGH, timeout_s)
        except TimeoutError as error:
            progress(f"stopped after {i} cycles: {error}")
            return timings, str(error)
        timings.append((down, up))
        progress(f"cycle {i + 1}/{cycles}: down {down:.1f}s, up {up:.1f}s")
    return timings, None


@dataclass
class CycleReport:
    cycles: int
    results: list[Result]
    drains: list[Drain]
    sim: dict[str, int]
    router_errors: dict[str, float]
    timings: list[tuple[float, float]] = field(default_factory=list)
    stopped: str | None = None  # why the run ended before its last cycle

    def figures(self) -> dict[str, Any]:
        longest = max((r.ended - r.started for r in self.results), default=0.0)
        return {
            "cycles": len(self.timings),
            "stopped": self.stopped,
            "sent": len(self.results),
            "ok": count(self.results, "ok"),
            "failed": count(self.results, "failed"),
            "truncated": count(self.results, "truncated"),
            **self.sim,
            "router_errors": sum(self.router_errors.values()),
            "longest_request_s": round(longest, 2),
            "drain": drain_summary(self.drains),
            "cycle_s": {
                "down_median": round(statistics.median(t[0] for t in self.timings), 1)
                if self.timings else None,
                "up_median": round(statistics.median(t[1] for t in self.timings), 1)
                if self.timings else None,
            },
        }  # fmt: skip


def cycles_under_load(
    service: Service, cycles: int, clients: int = 4,
    progress: Callable[[str], None] = lambda _: None,
) -> CycleReport:  # fmt: skip
    """The scenario of docs/drain.md's table: load, `cycles` scale cycles, every counter."""
    recorder = Recorder(service)
    recorder.start()
    try:
        with Load(service.router(), clients=clients) as load:
            time.sleep(3.0)
            timings, stopped = run_cycles(service, cycles, progress=progress)
            time.sleep(2.0)
    finally:
        recorder.stop()
    results = load.snapshot()
    events = service.events(("Drained", "DrainForced"))
    return CycleReport(
        cycles=cycles,
        results=results,
        drains=match_drains(events, recorder.marks, results),
        sim=sim_log_counters(service.log_dir, service.namespace),
        router_errors=router_error_counters(service.router_ip()),
        timings=timings,
        stopped=stopped,
    )


# ----- the environment: cluster, bridge, CRDs, operator, service ----------------------------------


def apply_crds(cluster: Cluster, api: Any) -> None:
    ext: Any = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted((REPO_ROOT / "crds").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        cluster.apply(docs)
        names += [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]

    def established(name: str) -> bool:
        status = ext.read_custom_resource_definition(name).status
        conditions = (status.conditions if status else None) or ()
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for name in names:
        wait_until(partial(established, name), 30, f"CRD {name} Established")


def bridge_settings(
    cluster: Cluster, log_dir: Path, namespace: str, engine_root: Path | None = None
) -> BridgeSettings:
    return BridgeSettings(
        kubeconfig=cluster.kubeconfig,
        log_dir=log_dir,
        namespace=namespace,
        time_scale=TIME_SCALE,
        engine_root=engine_root,
        probe_period_max_s=PROBE_PERIOD_MAX_S,
        probe_timeout_min_s=PROBE_TIMEOUT_MIN_S,
    )


@dataclass(frozen=True)
class Operated:
    """A namespace with its bridge and operator running (see `operated_namespace`)."""

    namespace: str
    bridge: Bridge


@contextlib.contextmanager
def operated_namespace(
    cluster: Cluster, api: Any, log_dir: Path, prefix: str, engine_root: Path | None = None
) -> Iterator[Operated]:
    """A fresh namespace whose pods a bridge runs and whose InferenceServices a real operator
    process reconciles; deleted afterwards, its pods finalized by the bridge. With
    ``engine_root`` (e2e/engine.sh), pods of the real-engine image run real vLLM."""
    core = client.CoreV1Api(api)
    namespace = cluster.create_namespace(f"{prefix}-{uuid.uuid4().hex[:8]}")
    operator = OperatorProcess(
        kubeconfig=cluster.kubeconfig, log_path=log_dir / "operator.log", resync_seconds=5.0
    )
    try:
        apply_crds(cluster, api)
        with Bridge(bridge_settings(cluster, log_dir, namespace, engine_root)) as bridge:
            operator.start().wait_healthy()
            try:
                yield Operated(namespace, bridge)
            finally:
                operator.stop()
                # The bridge finalizes the pods (preStop, stop, delete) while it still runs; each
                # may take its whole grace period.
                grace = _longest_grace_period_s(core.list_namespaced_pod(namespace).items)
                core.delete_namespace(namespace)
                wait_until(
                    lambda: not core.list_namespaced_pod(namespace).items, 60 + grace, "pods gone"
                )
    finally:
        operator.stop()


def _longest_grace_period_s(pods: list[Any]) -> int:
    return max((p.spec.termination_grace_period_seconds or 30 for p in pods), default=0)


@contextlib.contextmanager
def deployed_service(
    cluster: Cluster, api: Any, log_dir: Path, counts: Mapping[str, int] = HIGH
) -> Iterator[Service]:
    """A namespace with the InferenceService at `counts`, its pods run by a bridge and
    reconciled by a real operator process; everything removed afterwards."""
    with operated_namespace(cluster, api, log_dir, "drain") as operated:
        service = Service(api, operated.namespace, log_dir, bridge=operated.bridge)
        service.custom.create_namespaced_custom_object(
            labels.GROUP, labels.VERSION, operated.namespace, labels.PLURAL,
            service_manifest(operated.namespace, counts),
        )  # fmt: skip
        wait_until(lambda: _router_up(service), 180, "router Ready")
        wait_settled(service, counts, 240)
        yield service


def _router_up(service: Service) -> bool:
    return any(is_ready(p) for p in service.role_pods(labels.ROLE_ROUTER))


@contextlib.contextmanager
def local_cluster(
    workdir: Path, name: str = "pdfleet-drain", bridge_label: str | None = OWNED_LABEL
) -> Iterator[Cluster]:
    """A cluster of its own for a command (not a test session); its pods with a
    `bridge_label` are left to a bridge (None: kwok runs every pod)."""
    bin_dir = toolchain_bin_dir()
    require_toolchain(bin_dir)
    require_private_netns()
    cfg = ClusterConfig(name=name, workdir=workdir, bin_dir=bin_dir, bridge_label=bridge_label)
    started = start(cfg)
    try:
        yield started
    finally:
        stop(started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pdfleet-drain-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"logs: {workdir}", flush=True)
    with local_cluster(workdir / "kwok") as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            with deployed_service(cluster, api, workdir / "pods") as service:
                report = cycles_under_load(
                    service, args.cycles, args.clients,
                    progress=lambda line: print(line, flush=True),
                )  # fmt: skip
        finally:
            api.close()
    figures = report.figures()
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    bad = [r for r in report.results if r.outcome != "ok"]
    for r in bad[:10]:
        print(f"lost: {r}", file=sys.stderr)
    lost = figures["failed"] + figures["truncated"] + sum(report.sim.values())
    return 1 if lost or figures["router_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
