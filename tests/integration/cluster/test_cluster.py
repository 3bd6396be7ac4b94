"""The local control plane itself: CRD install, fake GPU nodes, scheduling, pod IPs.

These pin down what every other integration and e2e test relies on: the CRD is served,
GPU pods land on tainted GPU nodes and become Ready, pod IPs are real addresses inside
the private network namespace, and bridge-labelled pods are left to the process bridge.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, TypeVar

from kubernetes import client

from e2e.platform.cluster import (
    BRIDGE_LABEL,
    GPU_RESOURCE,
    H100,
    H200,
    POD_CIDR,
    RDMA_RESOURCE,
    wait_until,
)

T = TypeVar("T")

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def in_pod_cidr(ip: str, cidr: str = POD_CIDR) -> bool:
    """True when ``ip`` lies inside ``cidr``."""
    return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)


def condition(obj: client.V1Pod | client.V1Node, kind: str) -> str | None:
    """The status ("True"/"False") of condition ``kind`` on a V1Pod or V1Node, if present."""
    conditions: list[client.V1PodCondition] | list[client.V1NodeCondition] = (
        obj.status.conditions if obj.status else None
    ) or []
    for c in conditions:
        if c.type == kind:
            return str(c.status)
    return None


def is_ready(pod: client.V1Pod) -> bool:
    """Running with Ready=True and a pod IP."""
    status = present(pod.status, pod)
    return bool(status.phase == "Running" and condition(pod, "Ready") == "True") and bool(
        status.pod_ip
    )


def metadata(obj: client.V1Node | client.V1Pod) -> client.V1ObjectMeta:
    return present(obj.metadata, obj)


def node_labels(node: client.V1Node) -> dict[str, str]:
    return metadata(node).labels or {}


def present(value: T | None, owner: object) -> T:
    """A field the API server always sets on these objects (spec, status, metadata)."""
    assert value is not None, owner
    return value


def pod_ip(pod: client.V1Pod) -> str:
    """The pod's IP; fails the test when it has none."""
    ip = present(pod.status, pod).pod_ip
    assert ip, pod
    return ip


def nodes_by_name(core: client.CoreV1Api) -> dict[str, client.V1Node]:
    return {str(metadata(n).name): n for n in core.list_node().items}


def pod_manifest(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A single-container pod; ``spec`` entries are merged into ``spec``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/fake:1"}], **spec},
    }


def gpu_statefulset(name: str, replicas: int) -> dict[str, Any]:
    """A StatefulSet whose pods ask for one GPU (request == limit) and tolerate the taint."""
    gpu = {GPU_RESOURCE: "1"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "worker",
                            "image": "registry.invalid/worker:1",
                            "resources": {"requests": gpu, "limits": gpu},
                        }
                    ],
                },
            },
        },
    }


def test_crds_are_established(crds: list[str], api_client: Any) -> None:
    assert "inferenceservices.pdfleet.dev" in crds
    ext = client.ApiextensionsV1Api(api_client)
    for name in crds:
        status = ext.read_custom_resource_definition(name).status
        assert status is not None, name
        conditions = {c.type: c.status for c in status.conditions or []}
        assert conditions.get("Established") == "True", (name, conditions)
        assert conditions.get("NamesAccepted") == "True", (name, conditions)


def test_nodes_have_gpu_capacity_labels_and_taints(api_client: Any) -> None:
    nodes = nodes_by_name(client.CoreV1Api(api_client))
    gpu_nodes = [n for n in nodes.values() if "nvidia.com/gpu.product" in node_labels(n)]
    cpu_nodes = [n for n in nodes.values() if "nvidia.com/gpu.product" not in node_labels(n)]

    assert {node_labels(n)["nvidia.com/gpu.product"] for n in gpu_nodes} == {H100, H200}
    for node in gpu_nodes:
        capacity = present(node.status, node).capacity or {}
        assert capacity[GPU_RESOURCE] == "8"
        assert (present(node.status, node).allocatable or {})[GPU_RESOURCE] == "8"
        assert int(capacity[RDMA_RESOURCE]) > 0
        assert node_labels(node)["nvidia.com/gpu.present"] == "true"
        taints = [(t.key, t.effect) for t in present(node.spec, node).taints or []]
        assert taints == [(GPU_RESOURCE, "NoSchedule")]
    assert cpu_nodes, "an untainted CPU node for router and other non-GPU pods"
    for node in cpu_nodes:
        assert not present(node.spec, node).taints
        assert GPU_RESOURCE not in (present(node.status, node).capacity or {})
    for node in nodes.values():
        node_cidr = ipaddress.IPv4Network(present(node.spec, node).pod_cidr)
        assert node_cidr.subnet_of(ipaddress.IPv4Network(POD_CIDR)), node_cidr
        assert condition(node, "Ready") == "True"


def test_gpu_statefulset_lands_on_gpu_nodes_and_becomes_ready(
    api_client: Any, namespace: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_stateful_set(
        namespace, client.V1StatefulSet.model_validate(gpu_statefulset("decode", replicas=3))
    )

    def all_ready() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=decode").items
        return pods if len(pods) == 3 and all(is_ready(p) for p in pods) else None

    pods = wait_until(all_ready, 60, "3 Ready decode pods")
    nodes = nodes_by_name(core)
    for pod in pods:
        node_name = present(pod.spec, pod).node_name
        node = nodes[str(node_name)]
        assert node_labels(node).get("nvidia.com/gpu.present") == "true", node_name
        cidr = present(node.spec, node).pod_cidr
        assert cidr is not None, node
        assert in_pod_cidr(pod_ip(pod), cidr), (pod_ip(pod), node)
    assert len({pod_ip(p) for p in pods}) == 3

    def ready_statefulset() -> client.V1StatefulSet | None:
        s = apps.read_namespaced_stateful_set("decode", namespace)
        return s if s.status is not None and s.status.ready_replicas == 3 else None

    sts = wait_until(ready_statefulset, 30, "StatefulSet readyReplicas == 3")
    assert sts.status is not None
    assert sts.status.replicas == 3


def test_gpu_pod_without_toleration_is_unschedulable(api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    gpu = {GPU_RESOURCE: "1"}
    pod = pod_manifest("no-toleration")
    pod["spec"]["containers"][0]["resources"] = {"requests": gpu, "limits": gpu}
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))

    def unschedulable() -> bool:
        p = core.read_namespaced_pod("no-toleration", namespace)
        return condition(p, "PodScheduled") == "False"

    wait_until(unschedulable, 30, "PodScheduled=False")
    pending = core.read_namespaced_pod("no-toleration", namespace)
    assert present(pending.spec, pending).node_name is None


def test_pod_ip_answers_tcp_inside_the_namespace(api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod_manifest("echo")))

    def ready_pod() -> client.V1Pod | None:
        p = core.read_namespaced_pod("echo", namespace)
        return p if is_ready(p) else None

    ip = pod_ip(wait_until(ready_pod, 30, "pod echo Ready"))
    assert in_pod_cidr(ip)
    # Stand in for the pod's process: listen on the pod IP, then connect to it.
    with socket.create_server((ip, 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection((ip, port), timeout=5) as conn:
            peer, _ = server.accept()
            with peer:
                conn.sendall(b"ping")
                assert peer.recv(4) == b"ping"


def test_bridge_labelled_pod_gets_an_ip_but_is_left_to_the_bridge(
    api_client: Any, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    bridged = pod_manifest("bridged", labels={"app": "bridged", BRIDGE_LABEL: "true"})
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(bridged))

    def pod_with_ip() -> client.V1Pod | None:
        p = core.read_namespaced_pod("bridged", namespace)
        return p if p.status is not None and p.status.pod_ip else None

    pod = wait_until(pod_with_ip, 30, "pod IP for the bridged pod")
    assert in_pod_cidr(pod_ip(pod))
    status = present(pod.status, pod)
    assert status.phase == "Pending"
    assert condition(pod, "Ready") == "False"
    state = (status.container_statuses or [])[0].state
    assert state is not None and state.waiting is not None, status
    assert state.waiting.reason == "ContainerCreating"

    # What the bridge does once its process answers: report Running and Ready.
    assert status.start_time is not None, status
    now = status.start_time.isoformat()
    ready = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
    ]
    running = {
        "name": "main",
        "image": "registry.invalid/fake:1",
        "ready": True,
        "started": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": now}},
    }
    core.patch_namespaced_pod_status(
        "bridged",
        namespace,
        {"status": {"phase": "Running", "conditions": ready, "containerStatuses": [running]}},
    )
    assert is_ready(core.read_namespaced_pod("bridged", namespace))

    # Deletion waits for the bridge; without one, kwok removes the pod at the end of
    # the grace period, like kubelet after SIGKILL.
    core.delete_namespaced_pod("bridged", namespace, grace_period_seconds=3)
    terminating = core.read_namespaced_pod("bridged", namespace)
    assert metadata(terminating).deletion_timestamp is not None
    wait_until(
        lambda: (
            not core.list_namespaced_pod(namespace, field_selector="metadata.name=bridged").items
        ),
        20,
        "bridged pod deleted after its grace period",
    )
