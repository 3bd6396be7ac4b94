"""The activator's children: rendered only when the service scales to zero, in front of the
router, with no API token, and the client-facing policies and route moved to it."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.cli import build_parser
from pdfleet.reconcile.plan import desired_replicas
from pdfleet.render import RenderConfig, render_children
from pdfleet.render.network import http_route
from pdfleet.render.router import endpoint
from tests.manifests import schema_errors
from tests.spec_cases import merge_patch, sample

SLEEPY = {"spec": {"autoscaling": {"scaleToZero": {"idleAfter": "30m", "maxWait": "90s"}}}}


def _service(patch: dict[str, Any] | None = None) -> InferenceService:
    obj = merge_patch(sample("production"), patch or {})
    obj["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return InferenceService.model_validate(obj)


def _children(isvc: InferenceService) -> dict[tuple[str, str], dict[str, Any]]:
    config = RenderConfig(activator_image="registry.example/pdfleet/operator:1.2.3")
    rendered = render_children(isvc, desired_replicas(isvc, None), config)
    return {(c["kind"], c["metadata"]["name"]): c for c in rendered}


def _activator_kinds(children: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return sorted(kind for kind, name in children if name == "llama-70b-activator")


def test_only_a_service_that_scales_to_zero_gets_an_activator() -> None:
    assert _activator_kinds(_children(_service())) == []
    assert _activator_kinds(_children(_service(SLEEPY))) == [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ]


def test_the_activator_forwards_to_the_router_and_holds_for_max_wait() -> None:
    children = _children(_service(SLEEPY))
    deployment = children[("Deployment", "llama-70b-activator")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/pdfleet/operator:1.2.3"
    args = container["command"] + container["args"]
    # the CLI that runs in the pod accepts exactly these arguments
    parsed = build_parser().parse_args(args[1:])
    assert parsed.upstream == "http://llama-70b-router.serving.svc:8000"
    assert parsed.max_wait == 90
    assert parsed.service == ("serving", "llama-70b")
    assert parsed.listen == ("0.0.0.0", 8000)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # a client-facing proxy carries no credentials
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    service = children[("Service", "llama-70b-activator")]
    assert service["spec"]["selector"] == {
        labels.SERVICE: "llama-70b",
        labels.ROLE: labels.ROLE_ACTIVATOR,
    }
    assert deployment["spec"]["template"]["metadata"]["labels"][labels.ROLE] == "activator"


@pytest.mark.parametrize("kind", ["Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"])
def test_the_activator_children_are_valid_kubernetes_objects(kind: str) -> None:
    child = _children(_service(SLEEPY))[(kind, "llama-70b-activator")]
    assert schema_errors(child) is None, schema_errors(child)
    assert child["metadata"]["ownerReferences"][0]["kind"] == labels.KIND


def test_clients_are_sent_to_the_activator() -> None:
    assert endpoint(_service()) == "http://llama-70b-router.serving.svc:8000"
    sleepy = _service(SLEEPY)
    assert endpoint(sleepy) == "http://llama-70b-activator.serving.svc:8000"
    route = http_route(sleepy, "gateway-system", "public")
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"name": "llama-70b-activator", "port": 8000}
    ]


def _serving_peers(policy: dict[str, Any], port: int) -> list[list[dict[str, Any]]]:
    return [
        r["from"] for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r["ports"])
    ]


def test_router_clients_reach_the_activator_and_the_router_only_the_activator() -> None:
    isvc = _service(SLEEPY)
    children = _children(isvc)
    operator = {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": dict(RenderConfig().operator_labels)},
    }
    clients = list(isvc.spec.network_policy.router_clients)
    activator = children[("NetworkPolicy", "llama-70b-activator")]
    # the operator reads the activator's /metrics on its serving port; monitoring scrapes it
    assert _serving_peers(activator, 8000) == [
        [operator],
        clients,
        list(isvc.spec.network_policy.monitoring),
    ]
    router = children[("NetworkPolicy", "llama-70b-router")]
    activator_pods = {
        "podSelector": {"matchLabels": {labels.SERVICE: "llama-70b", labels.ROLE: "activator"}}
    }
    assert _serving_peers(router, 8000) == [[operator], [activator_pods]]
