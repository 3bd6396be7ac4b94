"""Names, labels and metadata shared by every rendered child object.

Names are deterministic (derived from the InferenceService name and a role) so that a
restarted operator finds and re-applies the same objects instead of creating duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdfleet import __version__, labels
from pdfleet.api.v1alpha1 import InferenceService

Manifest = dict[str, Any]

WORKER_COMPONENT_NAME = "vllm-worker"
ROUTER_COMPONENT_NAME = "vllm-router"
ACTIVATOR_COMPONENT_NAME = "pdfleet-activator"
_COMPONENT_NAMES = {
    labels.ROLE_ROUTER: ROUTER_COMPONENT_NAME,
    labels.ROLE_ACTIVATOR: ACTIVATOR_COMPONENT_NAME,
}


@dataclass(frozen=True)
class RenderConfig:
    """Operator-wide settings that are not part of any InferenceService spec."""

    router_image: str = "ghcr.io/pdfleet/vllm-router:0.1.17"
    activator_image: str = f"ghcr.io/pdfleet/operator:{__version__}"
    """The operator's own image: the activator is `pdfleet activator`."""
    shutdown_timeout_s: int = 30
    """vLLM --shutdown-timeout once a drained worker gets SIGTERM: only stragglers remain."""
    grace_margin_s: int = 10
    """Slack on top of preStop + shutdown in terminationGracePeriodSeconds."""
    operator_labels: tuple[tuple[str, str], ...] = (
        (labels.APP_NAME, "pdfleet"),
        (labels.APP_COMPONENT, "operator"),
    )
    """Labels of the operator's pods (the chart's), let through the NetworkPolicies."""


def child_name(isvc: InferenceService, role: str) -> str:
    """The name of a role's StatefulSet, Service, PDB, ... (e.g. llama-8b-prefill)."""
    return f"{isvc.metadata.name}-{role}"


def restricted_security_context() -> dict[str, Any]:
    """The restricted Pod Security profile, for the containers that need nothing of the node
    (the router and the activator). A new dict each time: manifests share no objects."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def service_url(isvc: InferenceService, role: str) -> str:
    """A role's Service inside the cluster, on the serving port the router and the activator
    share."""
    namespace = isvc.metadata.namespace or "default"
    return f"http://{child_name(isvc, role)}.{namespace}.svc:{isvc.spec.router.port}"


def client_front(isvc: InferenceService) -> str:
    """The role whose Service clients send requests to: the activator, which holds them while
    the pools sleep, when the service scales to zero; else the router."""
    if isvc.spec.autoscaling.scale_to_zero is not None:
        return labels.ROLE_ACTIVATOR
    return labels.ROLE_ROUTER


def selector_labels(isvc: InferenceService, role: str) -> dict[str, str]:
    """The labels that select one role's pods; immutable once a StatefulSet exists."""
    return {labels.SERVICE: str(isvc.metadata.name), labels.ROLE: role}


def common_labels(isvc: InferenceService, role: str) -> dict[str, str]:
    component = _COMPONENT_NAMES.get(role, WORKER_COMPONENT_NAME)
    return {
        **selector_labels(isvc, role),
        labels.APP_NAME: component,
        labels.APP_INSTANCE: str(isvc.metadata.name),
        labels.APP_COMPONENT: role,
        labels.APP_PART_OF: "pdfleet",
        labels.APP_MANAGED_BY: labels.FIELD_MANAGER,
    }


def owner_reference(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "name": isvc.metadata.name,
        "uid": isvc.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(isvc: InferenceService, name: str, role: str) -> dict[str, Any]:
    """Metadata of a child: name, namespace, labels and (when the owner exists) its owner."""
    meta: dict[str, Any] = {"name": name, "labels": common_labels(isvc, role)}
    if isvc.metadata.namespace:
        meta["namespace"] = isvc.metadata.namespace
    if isvc.metadata.uid:
        meta["ownerReferences"] = [owner_reference(isvc)]
    return meta


def quantity_map(values: dict[str, int | str]) -> dict[str, str]:
    """Resource maps as strings, the form the API server returns."""
    return {key: str(value) for key, value in values.items()}


def pod_disruption_budget(isvc: InferenceService, role: str, max_unavailable: int = 1) -> Manifest:
    """At most one pod of a pool is voluntarily evicted at a time (node drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, child_name(isvc, role), role),
        "spec": {
            "maxUnavailable": max_unavailable,
            "selector": {"matchLabels": selector_labels(isvc, role)},
        },
    }


def surge_deployment(
    isvc: InferenceService,
    role: str,
    replicas: int,
    pod_labels: dict[str, str],
    pod_spec: dict[str, Any],
) -> Manifest:
    """A Deployment that rolls with no replica down (maxUnavailable 0): the router and the
    activator carry every request, so a rollout first adds the new pod, then retires one."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, child_name(isvc, role), role),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(isvc, role)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }
