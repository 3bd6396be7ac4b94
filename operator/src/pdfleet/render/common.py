"""Names, labels and metadata shared by every rendered child object.

Names are deterministic (derived from the InferenceService name and a role) so that a
restarted operator finds and re-applies the same objects instead of creating duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService

Manifest = dict[str, Any]

WORKER_COMPONENT_NAME = "vllm-worker"
ROUTER_COMPONENT_NAME = "vllm-router"


@dataclass(frozen=True)
class RenderConfig:
    """Operator-wide settings that are not part of any InferenceService spec."""

    router_image: str = "ghcr.io/pdfleet/vllm-router:0.1.17"
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


def selector_labels(isvc: InferenceService, role: str) -> dict[str, str]:
    """The labels that select one role's pods; immutable once a StatefulSet exists."""
    return {labels.SERVICE: str(isvc.metadata.name), labels.ROLE: role}


def common_labels(isvc: InferenceService, role: str) -> dict[str, str]:
    component = ROUTER_COMPONENT_NAME if role == labels.ROLE_ROUTER else WORKER_COMPONENT_NAME
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
