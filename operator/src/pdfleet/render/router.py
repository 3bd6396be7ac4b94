"""Render the P/D router: vllm-router in --vllm-pd-disaggregation mode, with its RBAC.

Workers join the router through its Kubernetes service discovery (pods of the service's pools
that are Running and Ready); vllm-router 0.1.17 has no runtime add over HTTP in static P/D mode
(docs/drain.md). Discovery is confined to the service's namespace, so the router needs only a
namespaced Role to watch pods. The admin API shares the serving port, so keep clients on /v1/*
through a path-filtering front (docs/security.md).
"""

from __future__ import annotations

import math
from typing import Any

from pdfleet import labels
from pdfleet.api.types import parse_duration
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render.common import (
    Manifest,
    RenderConfig,
    child_name,
    client_front,
    common_labels,
    metadata,
    quantity_map,
    restricted_security_context,
    selector_labels,
    service_url,
    surge_deployment,
)
from pdfleet.rollout.revision import kv_revision

ROUTER = labels.ROLE_ROUTER
ROUTER_PRESTOP_S = 5


def _selector_args(isvc: InferenceService, role: str, revision: str) -> list[str]:
    """One pool's pods of one KV revision: a router pod never pairs two revisions. (No
    revision: by role alone, while pods made before revision labels are left.)"""
    pods = selector_labels(isvc, role)
    if revision:
        pods = {**pods, labels.KV_REVISION: revision}
    return [f"{key}={value}" for key, value in pods.items()]


def router_args(isvc: InferenceService, revision: str | None = None) -> list[str]:
    """The vllm-router command line (flags as of 0.1.17), pairing workers of `revision` (the
    spec's KV revision unless a paired rollout pins the router to the one serving)."""
    revision = kv_revision(isvc) if revision is None else revision
    spec = isvc.spec
    router = spec.router
    interval = max(1, math.ceil(parse_duration(router.health_check_interval)))
    return [
        "--vllm-pd-disaggregation",
        "--kv-connector", "nixl",
        "--host", "0.0.0.0",
        "--port", str(router.port),
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(router.metrics_port),
        "--policy", router.policy,
        "--service-discovery",
        "--service-discovery-namespace", str(isvc.metadata.namespace or "default"),
        # The --help default (80) differs from the docs (8000): always set it.
        "--service-discovery-port", str(spec.engine.port),
        "--prefill-selector", *_selector_args(isvc, labels.ROLE_PREFILL, revision),
        "--decode-selector", *_selector_args(isvc, labels.ROLE_DECODE, revision),
        # A dead worker gets requests until the checker notices: check often.
        "--health-check-interval-secs", str(interval),
        "--health-failure-threshold", "2",
        "--log-level", "info",
    ]  # fmt: skip


def router_pod_labels(isvc: InferenceService, revision: str) -> dict[str, str]:
    pod_labels = common_labels(isvc, ROUTER)
    return {**pod_labels, labels.KV_REVISION: revision} if revision else pod_labels


def router_deployment(
    isvc: InferenceService, config: RenderConfig, revision: str | None = None
) -> Manifest:
    """The router, pairing workers of `revision` (router_args). A new revision rolls it with
    no replica down (maxUnavailable 0): while it rolls, each request goes to a router pod of
    one revision or the other, and is paired within it."""
    router = isvc.spec.router
    revision = kv_revision(isvc) if revision is None else revision
    name = child_name(isvc, ROUTER)
    probe_port = {"port": "http"}
    container: dict[str, Any] = {
        "name": "router",
        "image": router.image or config.router_image,
        "command": ["vllm-router"],
        "args": router_args(isvc, revision),
        "ports": [
            {"name": "http", "containerPort": router.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": router.metrics_port, "protocol": "TCP"},
        ],
        # /health is 503 as soon as any one worker is unhealthy: probe /liveness and /readiness.
        # The startup probe holds liveness off while the router starts (its Python launcher
        # alone is slow on a busy node): without it liveness would kill a restarted router
        # before it listens, again and again.
        "startupProbe": {
            "httpGet": {"path": "/liveness", **probe_port},
            "periodSeconds": 2,
            "failureThreshold": 60,
        },
        "livenessProbe": {"httpGet": {"path": "/liveness", **probe_port}, "periodSeconds": 10},
        # vllm-router closes its listener at SIGTERM (it finishes the streams it holds): a
        # client that picked this replica just before its endpoint went would be refused.
        # Going on listening a few seconds first lets every endpoint list drop it.
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_S}}},
        "readinessProbe": {"httpGet": {"path": "/readiness", **probe_port}, "periodSeconds": 5},
        "securityContext": restricted_security_context(),
        # The root filesystem is read-only; the Python launcher gets a scratch /tmp.
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    resources = {
        key: quantity_map(values)
        for key, values in (
            ("requests", router.resources.requests),
            ("limits", router.resources.limits),
        )
        if values
    }
    if resources:
        container["resources"] = resources
    pod_spec = {
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    pod_labels = router_pod_labels(isvc, revision)
    return surge_deployment(isvc, ROUTER, router.replicas, pod_labels, pod_spec)


def router_service(isvc: InferenceService) -> Manifest:
    router = isvc.spec.router
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, child_name(isvc, ROUTER), ROUTER),
        "spec": {
            "selector": selector_labels(isvc, ROUTER),
            "ports": [
                {"name": "http", "port": router.port, "targetPort": "http"},
                {"name": "metrics", "port": router.metrics_port, "targetPort": "metrics"},
            ],
        },
    }


def router_rbac(isvc: InferenceService) -> list[Manifest]:
    """ServiceAccount, Role and RoleBinding for pod discovery in the service's namespace."""
    name = child_name(isvc, ROUTER)
    meta = metadata(isvc, name, ROUTER)
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": name}
    if isvc.metadata.namespace:
        subject["namespace"] = isvc.metadata.namespace
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [subject],
        },
    ]


def endpoint(isvc: InferenceService) -> str | None:
    """The URL clients use, or None when the router is external: the activator's Service
    when the service scales to zero (it holds requests while the pools sleep), else the
    router's."""
    if isvc.spec.router.type != "vllm-router":
        return None
    return service_url(isvc, client_front(isvc))
