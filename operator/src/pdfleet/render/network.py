"""Render who may talk to the fleet: NetworkPolicies, and a Gateway API HTTPRoute to the router.

vllm-router serves its admin API (`DELETE /workers/...`, `/remove_worker`, `/add_worker`,
`/flush_cache`) on the same port as `/v1/*`, with no authentication. So the router's serving
port is open only to a path-filtering front (`spec.networkPolicy.routerClients`, e.g. the
Gateway's pods) and to the operator, which deregisters workers while draining; the HTTPRoute
sends clients only `/v1/` and the router's health paths. Workers accept their router, each
other (NIXL side channel and UCX, whose TCP transport listens on ephemeral ports), the
operator (drain reads their /metrics) and monitoring. Ports are in docs/security.md.

NetworkPolicies are written by the operator when `spec.networkPolicy.enabled`. The HTTPRoute
is not: it attaches to a Gateway the platform owns, and Gateway API CRDs are not in every
cluster, so `pdfleet render --http-route NAMESPACE/GATEWAY` prints it for you to commit.
"""

from __future__ import annotations

from typing import Any

from pdfleet import clientpaths, labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render.common import (
    Manifest,
    RenderConfig,
    child_name,
    client_front,
    metadata,
    selector_labels,
)


def _tcp(*ports: int | str) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _operator_peer(config: RenderConfig) -> dict[str, Any]:
    # The operator may run in any namespace (the chart's release namespace).
    return {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(config.operator_labels)}}


def _pool_peer(isvc: InferenceService) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {labels.SERVICE: str(isvc.metadata.name)},
            "matchExpressions": [
                {"key": labels.ROLE, "operator": "In", "values": list(labels.WORKER_ROLES)}
            ],
        }
    }


def _policy(
    isvc: InferenceService, role: str, pod_labels: dict[str, Any], rules: list[dict[str, Any]]
) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(isvc, child_name(isvc, role), role),
        "spec": {"podSelector": pod_labels, "policyTypes": ["Ingress"], "ingress": rules},
    }


def worker_network_policy(isvc: InferenceService, config: RenderConfig) -> Manifest:
    """Ingress of both worker pools (one policy: they accept the same peers)."""
    spec = isvc.spec
    http = spec.engine.port
    rules: list[dict[str, Any]] = [
        # Router -> workers: the two-stage request.
        {
            "from": [{"podSelector": {"matchLabels": selector_labels(isvc, labels.ROLE_ROUTER)}}],
            "ports": _tcp(http),
        },
        # Workers <-> workers: NIXL side channel (base + DP rank) and UCX, any port.
        {"from": [_pool_peer(isvc)]},
        # The operator reads /metrics (and the simulator's /sim/stats) while draining.
        {"from": [_operator_peer(config)], "ports": _tcp(http)},
    ]
    if spec.network_policy.monitoring:
        rules.append({"from": list(spec.network_policy.monitoring), "ports": _tcp(http)})
    return _policy(isvc, "worker", _pool_peer(isvc)["podSelector"], rules)


def _front_network_policy(
    isvc: InferenceService, config: RenderConfig, role: str, clients: list[dict[str, Any]]
) -> Manifest:
    """Ingress of a pod the clients' requests pass: its serving port from `clients` and the
    operator, metrics from the operator and monitoring (the activator serves /metrics on its
    serving port)."""
    policy = isvc.spec.network_policy
    router = isvc.spec.router
    metrics_port = router.metrics_port if role == labels.ROLE_ROUTER else router.port
    rules: list[dict[str, Any]] = [
        {
            "from": [_operator_peer(config)],
            "ports": _tcp(*dict.fromkeys((router.port, metrics_port))),
        }
    ]
    if clients:
        rules.append({"from": clients, "ports": _tcp(router.port)})
    if policy.monitoring:
        rules.append({"from": list(policy.monitoring), "ports": _tcp(metrics_port)})
    pods = {"matchLabels": selector_labels(isvc, role)}
    return _policy(isvc, role, pods, rules)


def network_policies(isvc: InferenceService, config: RenderConfig) -> list[Manifest]:
    """The NetworkPolicies of a service; none unless spec.networkPolicy.enabled. With scale to
    zero, routerClients reach the activator, and the router only the activator."""
    if not isvc.spec.network_policy.enabled:
        return []
    policies = [worker_network_policy(isvc, config)]
    if isvc.spec.router.type != "vllm-router":
        return policies
    clients = list(isvc.spec.network_policy.router_clients)
    if client_front(isvc) == labels.ROLE_ACTIVATOR:
        activator = {"podSelector": {"matchLabels": selector_labels(isvc, labels.ROLE_ACTIVATOR)}}
        policies.append(_front_network_policy(isvc, config, labels.ROLE_ACTIVATOR, clients))
        clients = [activator]
    policies.append(_front_network_policy(isvc, config, labels.ROLE_ROUTER, clients))
    return policies


def http_route(isvc: InferenceService, gateway_namespace: str, gateway: str) -> Manifest:
    """A Gateway API HTTPRoute that forwards only /v1/* and the router's probes to the router.

    Any other path (the admin API above all) matches no rule, and a Gateway answers 404 for a
    request that matches no rule of any route."""
    matches: list[dict[str, Any]] = [
        {"path": {"type": "PathPrefix", "value": prefix}} for prefix in clientpaths.PATH_PREFIXES
    ]
    matches += [{"path": {"type": "Exact", "value": path}} for path in clientpaths.EXACT_PATHS]
    front = client_front(isvc)
    backend = {"name": child_name(isvc, front), "port": isvc.spec.router.port}
    meta = metadata(isvc, child_name(isvc, front), front)
    meta.pop("ownerReferences", None)  # committed by the user, not owned by the operator
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": meta,
        "spec": {
            "parentRefs": [{"name": gateway, "namespace": gateway_namespace}],
            "rules": [{"matches": matches, "backendRefs": [backend]}],
        },
    }
