"""Render one worker pool (prefill or decode): its StatefulSet and headless Service.

The pod is what vLLM 0.33 with NixlConnector needs (see docs/worker.md): the agent
(`pdfleet-agent launch`) turns the PDFLEET_* environment below into the `vllm serve` command
line, so the pod spec states the intent (role, parallelism, ports, KV config) and the agent owns
the version-specific flag spelling. The side-channel host is the pod IP, one side-channel port
per data-parallel rank, GPUs = tensor x data, the RDMA resource, IPC_LOCK, a memory-backed
/dev/shm, the Multus annotation, UCX env, and a grace period covering preStop + shutdown.
"""

from __future__ import annotations

import json
from typing import Any

from pdfleet import labels
from pdfleet.api.owned import OWNED_ENV
from pdfleet.api.types import parse_duration
from pdfleet.api.v1alpha1 import EnvVar, InferenceService, RoleSpec
from pdfleet.render.common import (
    Manifest,
    RenderConfig,
    child_name,
    common_labels,
    metadata,
    quantity_map,
    selector_labels,
)
from pdfleet.rollout.plan import PoolLayout
from pdfleet.rollout.revision import kv_revision

MODEL_MOUNT = "/models"
CACHE_MOUNT = "/cache"
KV_ROLE = {labels.ROLE_PREFILL: "kv_producer", labels.ROLE_DECODE: "kv_consumer"}


def model_location(isvc: InferenceService) -> str:
    """What `vllm serve` loads: a path on the mounted PVC, or a hub id."""
    source = isvc.spec.model.source
    if source is not None and source.pvc is not None:
        return (
            MODEL_MOUNT + "/" + source.pvc.path.strip("/")
            if source.pvc.path != "/"
            else MODEL_MOUNT
        )
    if source is not None and source.hub is not None and source.hub.id:
        return source.hub.id
    return isvc.spec.model.name


def drain_timeout_s(isvc: InferenceService) -> int:
    return round(parse_duration(isvc.spec.drain.timeout))


def termination_grace_s(isvc: InferenceService, config: RenderConfig) -> int:
    """preStop may take the whole drain timeout, then vLLM gets its shutdown timeout."""
    return drain_timeout_s(isvc) + config.shutdown_timeout_s + config.grace_margin_s


def _plain_env(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": name, "value": value} for name, value in values.items()]


def _user_env(env: list[EnvVar]) -> list[dict[str, Any]]:
    return [item.model_dump(by_alias=True, exclude_none=True) for item in env]


def merge_env(operator: list[dict[str, Any]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per name (the API server refuses a pod template that names one twice): a
    user entry replaces the operator's entry of that name in its place, and a later user
    entry an earlier one (a role's env over the engine's). Names the operator owns
    (pdfleet.api.owned.OWNED_ENV) keep the operator's value: admission refuses them, so a user
    entry for one can only come from a spec stored before that rule."""
    merged = {item["name"]: item for item in operator}
    for item in user:
        if item["name"] not in OWNED_ENV:
            merged[item["name"]] = item
    return list(merged.values())


def worker_env(isvc: InferenceService, role: str, config: RenderConfig) -> list[dict[str, Any]]:
    """The container environment: the agent's PDFLEET_* contract, NIXL and UCX settings."""
    spec = isvc.spec
    pool = spec.role(role)
    kv = spec.kv_transfer
    # The agent's contract (docs/worker.md): it builds the `vllm serve` line from these.
    agent = {
        "PDFLEET_ROLE": role,
        "PDFLEET_MODEL": model_location(isvc),
        "PDFLEET_SERVED_MODEL_NAME": spec.model.name,
        "PDFLEET_PORT": str(spec.engine.port),
        "PDFLEET_TP": str(pool.parallelism.tensor),
        "PDFLEET_DP": str(pool.parallelism.data),
        "PDFLEET_SIDE_CHANNEL_PORT": str(kv.side_channel_port),
        "PDFLEET_KV_CONNECTOR": kv.connector,
        "PDFLEET_KV_ROLE": KV_ROLE[role],
        "PDFLEET_KV_BACKENDS": ",".join(kv.backends),
        "PDFLEET_KV_BUFFER_DEVICE": kv.buffer_device,
        "PDFLEET_KV_LOAD_FAILURE_POLICY": kv.load_failure_policy,
        "PDFLEET_SHUTDOWN_TIMEOUT": str(config.shutdown_timeout_s),
        "PDFLEET_DRAIN_TIMEOUT": str(drain_timeout_s(isvc)),
        "PDFLEET_EXTRA_ARGS": json.dumps([*spec.engine.extra_args, *pool.extra_args]),
    }
    if spec.model.max_model_len:
        agent["PDFLEET_MAX_MODEL_LEN"] = str(spec.model.max_model_len)
    if spec.router.type == "vllm-router" and spec.router.policy == "cache_aware":
        # The router's cache-aware policy asks every worker for /render on each request, and
        # vLLM answers 403 unless its scale-out endpoints are on.
        agent["PDFLEET_ENABLE_SCALE_OUT"] = "true"
    if kv.lease_seconds is not None:
        agent["PDFLEET_KV_LEASE_SECONDS"] = str(kv.lease_seconds)
    if kv.preflight.enabled:
        # The agent starts the KV transport preflight listener beside the engine.
        agent["PDFLEET_PREFLIGHT_PORT"] = str(kv.preflight.port)
    nixl = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(spec.kv_transfer.side_channel_port)}
    pod_ip = {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    env: list[dict[str, Any]] = [
        # The side channel binds to this address and the peer dials it: it must be the pod IP.
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", **pod_ip},
        {"name": "PDFLEET_POD_IP", **pod_ip},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        *_plain_env(agent),
        *_plain_env(nixl),
        *_plain_env(_ucx_env(isvc)),
        {"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"},
    ]
    hub = spec.model.source.hub if spec.model.source else None
    if hub is not None and hub.token_secret_ref is not None:
        ref = hub.token_secret_ref
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    if hub is not None and hub.revision:
        env.append({"name": "PDFLEET_MODEL_REVISION", "value": hub.revision})
    return merge_env(env, _user_env(spec.engine.env) + _user_env(pool.env))


def _ucx_env(isvc: InferenceService) -> dict[str, str]:
    fabric = isvc.spec.kv_transfer.fabric
    if fabric is None or fabric.ucx is None:
        return {}
    ucx = fabric.ucx
    values = {"UCX_TLS": ucx.tls, "UCX_NET_DEVICES": ucx.net_devices}
    env = {name: value for name, value in values.items() if value}
    if ucx.gid_index is not None:
        env["UCX_IB_GID_INDEX"] = str(ucx.gid_index)
    return env


def worker_resources(isvc: InferenceService, pool: RoleSpec) -> dict[str, Any]:
    """User resources plus the derived GPU and RDMA requests (extended resources: limits)."""
    extended = {pool.gpu_resource: str(pool.gpus_per_replica)}
    fabric = isvc.spec.kv_transfer.fabric
    if fabric is not None and fabric.rdma_resource:
        extended[fabric.rdma_resource] = str(fabric.rdma_per_replica)
    resources: dict[str, Any] = {"limits": {**quantity_map(pool.resources.limits), **extended}}
    if pool.resources.requests:
        resources["requests"] = {**quantity_map(pool.resources.requests), **extended}
    return resources


def side_channel_ports(isvc: InferenceService, pool: RoleSpec) -> list[dict[str, Any]]:
    """vLLM >= 0.20 binds one ZMQ side channel per engine (DP rank) at base + rank."""
    base = isvc.spec.kv_transfer.side_channel_port
    return [
        {"name": f"nixl-{rank}", "containerPort": base + rank, "protocol": "TCP"}
        for rank in range(pool.parallelism.data)
    ]


def preflight_ports(isvc: InferenceService) -> list[dict[str, Any]]:
    preflight = isvc.spec.kv_transfer.preflight
    if not preflight.enabled:
        return []
    return [{"name": "kv-preflight", "containerPort": preflight.port, "protocol": "TCP"}]


def _health_check() -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}}


def _probes() -> dict[str, Any]:
    return {
        # Loading weights and compiling can take many minutes on big models.
        "startupProbe": {**_health_check(), "periodSeconds": 10, "failureThreshold": 180},
        # The agent reports not-ready while draining and when vLLM's /health fails.
        "readinessProbe": {
            "exec": {"command": ["pdfleet-agent", "ready"]},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            **_health_check(),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    }


def _volumes(isvc: InferenceService, pool: RoleSpec) -> tuple[list[Manifest], list[Manifest]]:
    volumes: list[Manifest] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(pool.shared_memory)}},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts: list[Manifest] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    source = isvc.spec.model.source
    if source is not None and source.pvc is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    return volumes, mounts


def worker_container(isvc: InferenceService, role: str, config: RenderConfig) -> Manifest:
    spec = isvc.spec
    pool = spec.role(role)
    _, mounts = _volumes(isvc, pool)
    port = spec.engine.port
    return {
        "name": "vllm",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": ["pdfleet-agent", "launch"],
        "env": worker_env(isvc, role, config),
        "ports": [
            {"name": "http", "containerPort": port, "protocol": "TCP"},
            *side_channel_ports(isvc, pool),
            *preflight_ports(isvc),
        ],
        "resources": worker_resources(isvc, pool),
        "volumeMounts": mounts,
        # Pinning memory for RDMA registration (NIXL/UCX) needs IPC_LOCK; vLLM needs none of
        # the runtime's other defaults (chown, setuid, net_raw, ...). The root filesystem
        # stays writable: torch, Triton and FlashInfer write JIT caches under $HOME.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        },
        "lifecycle": {"preStop": {"exec": {"command": ["pdfleet-agent", "prestop"]}}},
        **_probes(),
    }


def worker_pod_template(isvc: InferenceService, role: str, config: RenderConfig) -> Manifest:
    pool = isvc.spec.role(role)
    volumes, _ = _volumes(isvc, pool)
    annotations: dict[str, str] = {}
    fabric = isvc.spec.kv_transfer.fabric
    if fabric is not None and fabric.networks:
        annotations[labels.MULTUS_NETWORKS] = ",".join(fabric.networks)
    pod_spec: dict[str, Any] = {
        "serviceAccountName": child_name(isvc, "worker"),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_s(isvc, config),
        "containers": [worker_container(isvc, role, config)],
        "volumes": volumes,
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in pool.tolerations],
    }
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.affinity:
        pod_spec["affinity"] = pool.affinity
    if pool.priority_class_name:
        pod_spec["priorityClassName"] = pool.priority_class_name
    pod_labels = {**common_labels(isvc, role), labels.KV_REVISION: kv_revision(isvc)}
    template: Manifest = {"metadata": {"labels": pod_labels}, "spec": pod_spec}
    if annotations:
        template["metadata"]["annotations"] = annotations
    return template


def worker_statefulset(
    isvc: InferenceService,
    role: str,
    replicas: int,
    config: RenderConfig,
    layout: PoolLayout | None = None,
) -> Manifest:
    """A pool's StatefulSet. Scale-down removes the highest ordinals, which drain picks.

    `layout` places a paired rollout's two revisions in it (pdfleet.rollout.plan): the pods
    below the partition keep theirs, and a raised `ordinals.start` has removed the old ones.
    Both are left out at their defaults, so a pool that never rolled renders as before."""
    name = child_name(isvc, role)
    strategy: dict[str, Any] = {"type": "RollingUpdate"}
    if layout is not None and layout.partition:
        strategy["rollingUpdate"] = {"partition": layout.partition}
    statefulset: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(isvc, name, role),
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            # Workers are independent: start and replace them in parallel, not one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(isvc, role)},
            "updateStrategy": strategy,
            "template": worker_pod_template(isvc, role, config),
        },
    }
    if layout is not None and layout.start:
        statefulset["spec"]["ordinals"] = {"start": layout.start}
    return statefulset


def headless_service(isvc: InferenceService, role: str) -> Manifest:
    """Stable DNS for each worker; also lets the router and Prometheus find the pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, child_name(isvc, role), role),
        "spec": {
            "clusterIP": "None",
            # Draining (not ready) workers must stay resolvable for their pending KV pulls.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(isvc, role),
            "ports": [{"name": "http", "port": isvc.spec.engine.port, "targetPort": "http"}],
        },
    }


def worker_service_account(isvc: InferenceService) -> Manifest:
    """Workers need no API access: their own account with no token mounted."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(isvc, child_name(isvc, "worker"), "worker"),
        "automountServiceAccountToken": False,
    }
