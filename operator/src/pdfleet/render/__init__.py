"""Pure rendering: an InferenceService (plus the replica counts decided elsewhere) becomes the
list of child manifests the operator applies. No I/O; `pdfleet render` prints the same list."""

from __future__ import annotations

from collections.abc import Mapping

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render.activator import activator_deployment, activator_service
from pdfleet.render.common import Manifest, RenderConfig, client_front, pod_disruption_budget
from pdfleet.render.network import network_policies
from pdfleet.render.router import router_deployment, router_rbac, router_service
from pdfleet.render.worker import headless_service, worker_service_account, worker_statefulset
from pdfleet.rollout.plan import PoolLayout

__all__ = ["Manifest", "RenderConfig", "render_children"]


def render_children(
    isvc: InferenceService,
    replicas: Mapping[str, int],
    config: RenderConfig | None = None,
    layouts: Mapping[str, PoolLayout] | None = None,
    router_revision: str | None = None,
) -> list[Manifest]:
    """Every child object, in apply order (accounts and services before the pods that use
    them). `replicas` holds the decided size of each worker pool; `layouts` and
    `router_revision` what a paired rollout (pdfleet.rollout.plan) places in the pools and
    pins the router to (without them: one revision, the spec's)."""
    config = config or RenderConfig()
    layouts = layouts or {}
    children: list[Manifest] = [worker_service_account(isvc)]
    for role in labels.WORKER_ROLES:
        children += [
            headless_service(isvc, role),
            pod_disruption_budget(isvc, role),
            worker_statefulset(isvc, role, replicas[role], config, layouts.get(role)),
        ]
    if isvc.spec.router.type == "vllm-router":
        router = router_deployment(isvc, config, router_revision)
        children += [*router_rbac(isvc), router_service(isvc), router]
        if isvc.spec.router.replicas > 1:
            children.append(pod_disruption_budget(isvc, labels.ROLE_ROUTER))
        if client_front(isvc) == labels.ROLE_ACTIVATOR:
            children += [
                activator_service(isvc),
                pod_disruption_budget(isvc, labels.ROLE_ACTIVATOR),
                activator_deployment(isvc, config),
            ]
    return children + network_policies(isvc, config)
