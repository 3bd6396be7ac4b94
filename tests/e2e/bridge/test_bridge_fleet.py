"""A P/D fleet run by the process bridge: real scheduler and controllers, real router.

One prefill StatefulSet, one decode StatefulSet and the router Deployment, rendered by
``pdfleet.render`` from ``crds/samples/minimal.yaml`` and applied as plain manifests (the
operator is not running). The bridge starts ``pdfleet-agent launch`` (simulator engine) and
``vllm-router`` on the pod IPs. The tests share one fleet (start, discovery, traffic, readiness,
deletion); each but the first waits for it to be Ready (``ready_fleet``), so any order works.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from e2e.platform.bridge import Bridge
from e2e.platform.cluster import REPO_ROOT, Cluster, wait_until
from e2e.platform.loadgen import streamed_text
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render import render_children

pytestmark = pytest.mark.timeout(600)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROLES = ("prefill", "decode", "router")


@dataclass
class Fleet:
    namespace: str
    core: Any
    bridge: Bridge
    created: float

    def pods(self) -> dict[str, dict[str, Any]]:
        """role -> the pod of that role (one each), as the API returns it."""
        resp = self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        items = json.loads(resp.data)["items"]
        return {p["metadata"]["labels"]["pdfleet.dev/role"]: p for p in items}

    def pod(self, role: str) -> dict[str, Any]:
        return self.pods()[role]

    def node(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.core.read_node(name, _preload_content=False).data))

    def router_url(self) -> str:
        return f"http://{self.pod('router')['status']['podIP']}:8000"


def is_ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def all_ready(fleet: Fleet) -> bool:
    pods = fleet.pods()
    return set(pods) == set(ROLES) and all(
        is_ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods.values()
    )


def workers(router_url: str) -> dict[str, str]:
    """worker URL -> type, from the router's own registry (GET /workers)."""
    try:
        body = httpx.get(f"{router_url}/workers", timeout=2).json()
    except httpx.HTTPError:
        return {}
    return {w["url"]: w["worker_type"] for w in body.get("workers", []) if w.get("is_healthy")}


def sim_stats(pod: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{pod['status']['podIP']}:8000/sim/stats"
    data: dict[str, Any] = httpx.get(url, timeout=5).json()
    return data


def report(name: str, value: float) -> None:
    print(f"[bridge-e2e] {name}: {value:.2f}s")


@pytest.fixture(scope="module")
def fleet(bridge_cluster: Cluster, api_client: Any, bridge: Bridge) -> Iterator[Fleet]:
    core = client.CoreV1Api(api_client)
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    bridge_cluster.create_namespace(namespace)
    doc = yaml.safe_load((REPO_ROOT / "crds/samples/minimal.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    isvc = InferenceService.model_validate(doc)
    manifests = render_children(isvc, {"prefill": 1, "decode": 1})
    created = time.time()
    bridge_cluster.apply(manifests)
    try:
        yield Fleet(namespace, core, bridge, created)
    finally:
        core.delete_namespace(namespace)
        # The bridge finalizes the pods (preStop, stop, delete) while it still runs.
        wait_until(lambda: not core.list_namespaced_pod(namespace).items, 60, "pods deleted")


@pytest.fixture
def ready_fleet(fleet: Fleet) -> Fleet:
    """The fleet with its three pods Ready (and none leaving), whatever an earlier test did."""
    wait_until(lambda: all_ready(fleet), 120, "fleet Ready")
    return fleet


def test_pods_run_on_their_pod_ips(fleet: Fleet) -> None:
    def workers_ready_router_placed() -> bool:
        pods = fleet.pods()
        return (
            all(role in pods and is_ready(pods[role]) for role in ("prefill", "decode"))
            and "router" in pods
            and bool(pods["router"].get("status", {}).get("podIP"))
        )

    wait_until(workers_ready_router_placed, 120, "prefill and decode pods Ready")
    ready_at = []
    for role in ("prefill", "decode"):
        proc = fleet.bridge.process(fleet.namespace, fleet.pod(role)["metadata"]["name"])
        assert proc is not None
        ready_at.append(proc.timeline["ready"])
    wait_until(lambda: len(workers(fleet.router_url())) == 2, 60, "router to list 2 workers")
    report("both workers Ready -> router lists both", time.time() - max(ready_at))
    wait_until(lambda: all_ready(fleet), 120, "prefill, decode and router pods Ready")
    report("apply -> all three pods Ready", time.time() - fleet.created)
    for role, pod in fleet.pods().items():
        status = pod["status"]
        assert status["phase"] == "Running", role
        (cs,) = status["containerStatuses"]
        assert cs["ready"] and cs["started"] and "running" in cs["state"], (role, cs)
        assert cs["containerID"].startswith("bridge://")
        node = fleet.node(pod["spec"]["nodeName"])
        cidr = ipaddress.ip_network(node["spec"]["podCIDR"])
        assert ipaddress.ip_address(status["podIP"]) in cidr, (role, status["podIP"], cidr)
        assert status["hostIP"] == node["status"]["addresses"][0]["address"]
        gpu_node = "nvidia.com/gpu.product" in node["metadata"]["labels"]
        assert gpu_node == (role != "router"), (role, node["metadata"]["name"])
        proc = fleet.bridge.process(fleet.namespace, pod["metadata"]["name"])
        assert proc is not None and proc.pod_ip == status["podIP"]
        report(f"{role}: bridge saw pod -> Ready", proc.timeline["ready"] - proc.timeline["seen"])
    # The engines answer on their pod IPs (and only there: nothing binds 0.0.0.0).
    for role in ("prefill", "decode"):
        stats = sim_stats(fleet.pod(role))
        assert stats["time_scale"] == 0.1


def test_router_discovers_both_workers(ready_fleet: Fleet) -> None:
    fleet = ready_fleet
    pods = fleet.pods()
    expected = {
        f"http://{pods['prefill']['status']['podIP']}:8000": "prefill",
        f"http://{pods['decode']['status']['podIP']}:8000": "decode",
    }
    t0 = time.time()
    wait_until(lambda: workers(fleet.router_url()) == expected, 60, f"router to list {expected}")
    report("router lists both workers (after all Ready)", time.time() - t0)
    ready = httpx.get(f"{fleet.router_url()}/readiness", timeout=2)
    assert ready.status_code == 200, ready.text


def test_steady_pods_cause_no_status_writes(ready_fleet: Fleet) -> None:
    fleet = ready_fleet
    before = {role: p["metadata"]["resourceVersion"] for role, p in fleet.pods().items()}
    time.sleep(6)  # three probe periods: every probe ran, nothing changed
    after = {role: p["metadata"]["resourceVersion"] for role, p in fleet.pods().items()}
    assert after == before


def _stream(url: str, body: dict[str, Any]) -> str:
    with httpx.stream("POST", url, json=body, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        return streamed_text(resp.iter_lines())


def test_completions_go_prefill_then_decode(ready_fleet: Fleet) -> None:
    fleet = ready_fleet
    wait_until(lambda: len(workers(fleet.router_url())) == 2, 60, "router workers")
    before = {role: sim_stats(fleet.pod(role)) for role in ("prefill", "decode")}
    url = f"{fleet.router_url()}/v1/completions"
    prompt = "the cat sat on the mat " * 40
    r = httpx.post(url, json={"model": MODEL, "prompt": prompt, "max_tokens": 8}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    text = _stream(url, {"model": MODEL, "prompt": prompt, "max_tokens": 8, "stream": True})
    assert len(text.split()) == 8
    after = {role: sim_stats(fleet.pod(role)) for role in ("prefill", "decode")}

    def delta(role: str, key: str) -> int:
        return int(after[role][key]) - int(before[role][key])

    assert delta("prefill", "prefill_requests") == 2
    assert delta("prefill", "kv_served_reads") == 2
    assert delta("decode", "kv_pulls") == 2
    assert delta("decode", "kv_pull_failures") == 0
    assert delta("decode", "recompute_invalid_params") == 0
    assert delta("decode", "plain_requests") == 0
    assert delta("prefill", "kv_pulls") == 0


def test_readiness_follows_the_engine(ready_fleet: Fleet) -> None:
    fleet = ready_fleet
    name = fleet.pod("decode")["metadata"]["name"]
    proc = fleet.bridge.process(fleet.namespace, name)
    assert proc is not None and proc.pid is not None
    os.kill(proc.pid, signal.SIGSTOP)  # the engine stops answering; the process stays
    t0 = time.time()
    try:
        wait_until(lambda: not is_ready(fleet.pod("decode")), 60, "decode pod NotReady")
        report("engine frozen -> pod NotReady", time.time() - t0)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    t0 = time.time()
    wait_until(lambda: is_ready(fleet.pod("decode")), 60, "decode pod Ready again")
    report("engine back -> pod Ready", time.time() - t0)
    again = fleet.bridge.process(fleet.namespace, name)
    assert again is not None and again.pid == proc.pid, "readiness only, no restart"
    events = proc.events_path.read_text()
    assert "readiness failed" in events and "readiness succeeded" in events


def test_an_engine_that_exits_is_restarted(ready_fleet: Fleet) -> None:
    fleet = ready_fleet
    name = fleet.pod("decode")["metadata"]["name"]
    proc = fleet.bridge.process(fleet.namespace, name)
    assert proc is not None and proc.pid is not None
    restarts = fleet.pod("decode")["status"]["containerStatuses"][0]["restartCount"]
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.time()

    def restarted_and_ready() -> bool:
        pod = fleet.pod("decode")
        return (
            is_ready(pod) and pod["status"]["containerStatuses"][0]["restartCount"] == restarts + 1
        )

    wait_until(restarted_and_ready, 60, f"decode restarted (restartCount {restarts + 1}) and Ready")
    report("engine killed -> restarted and Ready", time.time() - t0)
    pod = fleet.pod("decode")
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["lastState"]["terminated"]["exitCode"] == 137  # 128 + SIGKILL, as kubelet says
    assert pod["status"]["phase"] == "Running"
    again = fleet.bridge.process(fleet.namespace, name)
    assert again is not None and again.pid != proc.pid and again.pod_ip == proc.pod_ip
    # The router's health checker takes it back; traffic flows again.
    url = f"http://{proc.pod_ip}:8000"
    wait_until(lambda: workers(fleet.router_url()).get(url) == "decode", 60, "decode healthy")
    r = httpx.post(
        f"{fleet.router_url()}/v1/completions",
        json={"model": MODEL, "prompt": "hello there", "max_tokens": 4},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_deleting_a_pod_runs_prestop_then_stops_the_process(ready_fleet: Fleet) -> None:
    fleet = ready_fleet
    pod = fleet.pod("prefill")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 340
    proc = fleet.bridge.process(fleet.namespace, name)
    assert proc is not None and proc.pid is not None
    t0 = time.time()
    fleet.core.delete_namespaced_pod(name, fleet.namespace)

    def replaced() -> bool:
        current = fleet.pods().get("prefill")
        return current is None or current["metadata"]["uid"] != uid

    # Finalized by the bridge, long before the 340 s grace period would let kwok reap it.
    wait_until(replaced, 60, "the old prefill pod object to be gone")
    report("delete -> pod object removed", time.time() - t0)
    events = proc.events_path.read_text()
    assert "preStop exited 0" in events and '"drained": true' in events, events
    assert "stopped, exit code 0" in events, events
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    # The StatefulSet controller recreates the pod; the bridge runs it again.
    t0 = time.time()
    wait_until(lambda: all_ready(fleet), 120, "replacement prefill pod Ready")
    report("replacement prefill pod Ready", time.time() - t0)
    new = fleet.pod("prefill")
    assert new["metadata"]["uid"] != uid
    url = f"http://{new['status']['podIP']}:8000"
    t0 = time.time()
    wait_until(lambda: workers(fleet.router_url()).get(url) == "prefill", 60, "router re-discovery")
    report("router lists the replacement", time.time() - t0)


def test_kwok_only_gives_an_ip_to_pods_the_bridge_owns(
    bridge_cluster: Cluster, api_client: Any, bridge: Bridge
) -> None:
    """The harness contract: kwok runs unlabelled pods itself; for a labelled pod it only
    allocates the IP (Pending, ContainerCreating), and a labelled pod the bridge has no
    runner for is left exactly so."""
    core: Any = client.CoreV1Api(api_client)
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    bridge_cluster.create_namespace(namespace)

    def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "example.com/tool:1"}],
            },
        }

    try:
        bridge_cluster.apply([pod("kwok-run", {}), pod("tool", {"pdfleet.dev/role": "tool"})])

        def read(name: str) -> dict[str, Any]:
            resp = core.read_namespaced_pod(name, namespace, _preload_content=False)
            return dict(json.loads(resp.data))

        wait_until(lambda: is_ready(read("kwok-run")), 30, "kwok to run the plain pod")
        wait_until(lambda: read("tool").get("status", {}).get("podIP"), 30, "kwok's pod IP")
        time.sleep(2)  # nobody else touches it
        status = read("tool")["status"]
        assert status["phase"] == "Pending"
        assert not is_ready(read("tool"))
        (cs,) = status["containerStatuses"]
        assert cs["state"] == {"waiting": {"reason": "ContainerCreating"}}
        node = json.loads(
            core.read_node(read("tool")["spec"]["nodeName"], _preload_content=False).data
        )
        cidr = ipaddress.ip_network(node["spec"]["podCIDR"])
        assert ipaddress.ip_address(status["podIP"]) in cidr
        assert bridge.process(namespace, "tool") is None
    finally:
        core.delete_namespace(namespace)
