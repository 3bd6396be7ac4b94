"""One InferenceService on the local cluster, run by the process bridge and reconciled by a real
operator process, and what tests and scenarios read about it.

Where it fits: the drain scenario (e2e/scenarios/drain_scenario.py), the fault suite
(e2e/scenarios/faults.py), the real-engine tier (e2e/platform/real_engine.py) and the e2e tests
deploy their services with these helpers: a namespace with a bridge and an operator
(:func:`operated_namespace`), the sample service in it at fixed pool sizes
(:func:`deployed_service`), the pools settled as the router sees them (:func:`wait_settled`),
and a cluster of its own for a command (:func:`local_cluster`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client

from e2e.platform.bridge import OWNED_LABEL, Bridge, BridgeSettings
from e2e.platform.cluster import (
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
from e2e.platform.operator_process import OperatorProcess
from pdfleet import labels

SERVICE = "llama-8b"
ENGINE_PORT = 8000
#: The pool sizes :func:`deployed_service` starts a service at unless told otherwise (the
#: drain scenario's upper state).
HIGH = {labels.ROLE_PREFILL: 3, labels.ROLE_DECODE: 4}
#: Wall seconds per simulated second (bridge setting): real time, requests of 0.2-2 s.
TIME_SCALE = 1.0
#: Probe periods capped at this: the startup probe (10 s in the spec) polls faster, and the
#: exec readiness probe (a Python start each time) keeps its spec period.
PROBE_PERIOD_MAX_S = 5.0
#: The exec readiness probe's 3 s timeout is too short for a Python start on two loaded,
#: shared cores: pods would flap NotReady (and out of the router) for no reason of their own.
PROBE_TIMEOUT_MIN_S = 10.0


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
        self.patch(replicas_patch(counts))

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

    def routers(self) -> list[str]:
        """The router replicas a Service would send a new connection to now: Ready and not
        leaving (while the router rolls, the old and the new replicas)."""
        return [
            f"http://{p['status']['podIP']}:{ENGINE_PORT}"
            for p in self.role_pods(labels.ROLE_ROUTER)
            if is_ready(p)
            and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        ]

    def patch(self, patch: Mapping[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL, self.name, patch
        )

    def status(self) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL, self.name
        )
        return dict(obj.get("status") or {})

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
    ``engine_root`` (e2e/platform/engine.sh), pods of the real-engine image run real vLLM."""
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
