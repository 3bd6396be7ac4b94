"""What a scale-to-zero test reads from the cluster: a service's activators, its sleep state,
its worker pods, and how a wake's time splits (docs/scale-to-zero.md).

Where it fits: tests/e2e/scale_to_zero (simulated workers) and tests/e2e/engine (real vLLM)
send requests through the activator pods the bridge runs and read the operator's
`status.scaleToZero` and the pods' own timestamps with these.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from e2e.platform.cluster import wait_until
from pdfleet import labels


def activator_urls(api: Any, namespace: str, name: str) -> list[str]:
    """The service's running activator pods, by IP (the e2e cluster has no kube-proxy)."""
    selector = f"{labels.SERVICE}={name},{labels.ROLE}={labels.ROLE_ACTIVATOR}"
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    ips = [p.status.pod_ip for p in pods if p.status and p.status.phase == "Running"]
    return [f"http://{ip}:8000" for ip in ips if ip]


def status_of(api: Any, namespace: str, name: str) -> dict[str, Any]:
    obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name
    )
    return dict(obj.get("status") or {})


def sleep_state(status: dict[str, Any]) -> str:
    return str((status.get("scaleToZero") or {}).get("state", ""))


def worker_pods(api: Any, namespace: str, name: str) -> list[Any]:
    found: Any = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{labels.SERVICE}={name}"
    )
    pods: list[Any] = found.items
    return [p for p in pods if (p.metadata.labels or {}).get(labels.ROLE) in labels.WORKER_ROLES]


def gpus_requested(pods: list[Any]) -> int:
    total = 0
    for pod in pods:
        for container in pod.spec.containers:
            requests = (container.resources.requests or {}) if container.resources else {}
            total += int(requests.get("nvidia.com/gpu", 0))
    return total


def wait_asleep(api: Any, namespace: str, name: str, timeout_s: float) -> dict[str, Any]:
    """The service's status once it reads Idle and no worker pod is left."""

    def asleep() -> dict[str, Any] | None:
        status = status_of(api, namespace, name)
        gone = not worker_pods(api, namespace, name)
        return status if sleep_state(status) == "Idle" and gone else None

    return wait_until(asleep, timeout_s, f"{name} asleep with no worker pod", interval_s=1.0)


def wait_awake(api: Any, namespace: str, name: str, timeout_s: float) -> dict[str, Any]:
    def awake() -> dict[str, Any] | None:
        status = status_of(api, namespace, name)
        return status if sleep_state(status) == "Awake" else None

    return wait_until(awake, timeout_s, f"{name} Awake")


def _condition_time(pod: Any, type_: str) -> float | None:
    for cond in pod.status.conditions or []:
        if cond.type == type_ and cond.status == "True":
            return float(cond.last_transition_time.timestamp())
    return None


def wake_split(pods: list[Any], sent: float, first_token: float) -> dict[str, float]:
    """Where a wake's seconds went, from the woken worker pods' own timestamps: `sent` is when
    the first request went to the sleeping service, `first_token` when its first token came
    (Unix times). The engine-start part ends at the first pair: the first Ready pod of each
    role, the later of the two."""
    created = min(p.metadata.creation_timestamp.timestamp() for p in pods)
    scheduled = max(_condition_time(p, "PodScheduled") or created for p in pods)
    ready = max(
        min(_condition_time(p, "Ready") or first_token for p in pods
            if (p.metadata.labels or {}).get(labels.ROLE) == role)
        for role in labels.WORKER_ROLES
    )  # fmt: skip
    return {
        "operator noticed (pods created)": created - sent,
        "scheduling": scheduled - created,
        "engine start (to a Ready pair)": ready - scheduled,
        "router and activator (to the first token)": first_token - ready,
    }
