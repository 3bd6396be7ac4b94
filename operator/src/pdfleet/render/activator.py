"""Render the activator: the proxy in front of the router that holds requests while a service
sleeps (spec.autoscaling.scaleToZero; the process is pdfleet.activator;
docs/design/scale-to-zero.md).

Clients reach the service through the activator's Service, which status.endpoint names once
scale to zero is on; the activator forwards to the router's Service. It runs with two
replicas, so a node drain or a rollout of the operator image never leaves the service with
no front. It holds no API credentials: the operator reads its /metrics to see that requests
are held (a wake) or that none came for idleAfter (sleep), so a client-facing proxy never
carries a token that could write the InferenceService.
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
    common_labels,
    metadata,
    restricted_security_context,
    selector_labels,
    service_url,
    surge_deployment,
)

ACTIVATOR = labels.ROLE_ACTIVATOR
ACTIVATOR_REPLICAS = 2
# The activator finishes the streams it carries after SIGTERM; the longest one bounds this.
ACTIVATOR_GRACE_S = 600


def activator_args(isvc: InferenceService) -> list[str]:
    stz = isvc.spec.autoscaling.scale_to_zero
    assert stz is not None, "rendered only for a service that scales to zero"
    namespace = isvc.metadata.namespace or "default"
    return [
        "activator",
        "--upstream", service_url(isvc, labels.ROLE_ROUTER),
        "--listen", f"0.0.0.0:{isvc.spec.router.port}",
        "--max-wait", str(math.ceil(parse_duration(stz.max_wait))),
        "--service", f"{namespace}/{isvc.metadata.name}",
    ]  # fmt: skip


def activator_deployment(isvc: InferenceService, config: RenderConfig) -> Manifest:
    probe: dict[str, Any] = {"httpGet": {"path": "/healthz", "port": "http"}}
    container: dict[str, Any] = {
        "name": "activator",
        "image": config.activator_image,
        "command": ["pdfleet"],
        "args": activator_args(isvc),
        "ports": [{"name": "http", "containerPort": isvc.spec.router.port, "protocol": "TCP"}],
        # Ready whether or not the router is: holding requests while it is not is the point.
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10},
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": restricted_security_context(),
    }
    selector = selector_labels(isvc, ACTIVATOR)
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": ACTIVATOR_GRACE_S,
        # Two replicas on two nodes: one node's drain leaves the other serving.
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector},
            }
        ],
        "containers": [container],
    }
    pod_labels = common_labels(isvc, ACTIVATOR)
    return surge_deployment(isvc, ACTIVATOR, ACTIVATOR_REPLICAS, pod_labels, pod_spec)


def activator_service(isvc: InferenceService) -> Manifest:
    port = isvc.spec.router.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, child_name(isvc, ACTIVATOR), ACTIVATOR),
        "spec": {
            "selector": selector_labels(isvc, ACTIVATOR),
            "ports": [{"name": "http", "port": port, "targetPort": "http"}],
        },
    }
