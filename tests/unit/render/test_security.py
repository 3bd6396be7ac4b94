"""What the rendered pods may do and who may reach them (docs/security.md).

Workers: IPC_LOCK and nothing else, no privilege escalation, no API token. Router: non-root,
read-only root filesystem, no capabilities, RuntimeDefault seccomp. The hub token only by
reference. NetworkPolicies (opt-in) keep the router's unauthenticated admin API away from
clients, and the HTTPRoute lets only /v1/* and the probes through.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.plan import desired_replicas
from pdfleet.render import RenderConfig, render_children
from pdfleet.render.network import http_route
from tests.http_route import route_allows
from tests.manifests import schema_errors
from tests.spec_cases import SAMPLES_DIR, merge_patch, sample

TOKEN_REF = {"name": "hub-token", "key": "hf"}
# The router's admin API as observed (reference/router-behaviour.md §2), and paths that try
# to reach it through an allowed prefix.
ADMIN_PATHS = (
    "/workers", "/workers/http%3A%2F%2F10.244.1.5%3A8000", "/remove_worker", "/add_worker",
    "/list_workers", "/flush_cache", "/get_loads", "/scheduling/diagnostics",
    "/finish_session", "/health_generate", "/metrics", "/v10/workers", "/v1workers",
)  # fmt: skip
CLIENT_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/liveness")


def _service(name: str, patch: dict[str, Any] | None = None) -> InferenceService:
    obj = merge_patch(sample(name), patch or {})
    obj["metadata"].update(namespace="serving", uid="00000000-0000-0000-0000-000000000001")
    return InferenceService.model_validate(obj)


def _children(isvc: InferenceService) -> list[dict[str, Any]]:
    return render_children(isvc, desired_replicas(isvc, None), RenderConfig())


def _of_kind(children: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == kind}


def _pod(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _of_kind(children, kind)[name]["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("name", ["minimal", "production"])
def test_workers_get_ipc_lock_and_nothing_else(name: str) -> None:
    children = _children(_service(name))
    isvc_name = children[0]["metadata"]["labels"][labels.SERVICE]
    for role in labels.WORKER_ROLES:
        pod = _pod(children, "StatefulSet", f"{isvc_name}-{role}")
        assert pod["automountServiceAccountToken"] is False
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
        (container,) = pod["containers"]
        context = container["securityContext"]
        assert context == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        }


def test_router_runs_locked_down() -> None:
    pod = _pod(_children(_service("minimal")), "Deployment", "llama-8b-router")
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]


def test_the_hub_token_is_only_a_reference() -> None:
    isvc = _service(
        "minimal", {"spec": {"model": {"source": {"hub": {"tokenSecretRef": TOKEN_REF}}}}}
    )
    children = _children(isvc)
    assert not [c for c in children if c["kind"] == "Secret"]
    for role in labels.WORKER_ROLES:
        (container,) = _pod(children, "StatefulSet", f"llama-8b-{role}")["containers"]
        token = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
        assert token == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": TOKEN_REF}}]
    # The router never sees the model source at all.
    assert "hub-token" not in yaml.safe_dump(_of_kind(children, "Deployment"))


def test_no_network_policy_unless_asked() -> None:
    assert not _of_kind(_children(_service("minimal")), "NetworkPolicy")


def test_network_policies_are_valid_kubernetes_objects() -> None:
    policies = _of_kind(_children(_service("production")), "NetworkPolicy")
    assert sorted(policies) == ["llama-70b-router", "llama-70b-worker"]
    for policy in policies.values():
        assert schema_errors(policy) is None, schema_errors(policy)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"


def _rules_for(policy: dict[str, Any], port: int) -> list[list[dict[str, Any]]]:
    """The peers of each rule that opens `port` (a rule without ports opens every port)."""
    return [
        rule["from"]
        for rule in policy["spec"]["ingress"]
        if "ports" not in rule or any(p["port"] == port for p in rule["ports"])
    ]


def test_router_serving_port_is_open_only_to_the_front_and_the_operator() -> None:
    isvc = _service("production")
    router = _of_kind(_children(isvc), "NetworkPolicy")["llama-70b-router"]
    assert router["spec"]["podSelector"] == {
        "matchLabels": {labels.SERVICE: "llama-70b", labels.ROLE: labels.ROLE_ROUTER}
    }
    operator = {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": dict(RenderConfig().operator_labels)},
    }
    serving = _rules_for(router, isvc.spec.router.port)
    assert serving == [[operator], list(isvc.spec.network_policy.router_clients)]
    metrics = _rules_for(router, isvc.spec.router.metrics_port)
    assert metrics == [[operator], list(isvc.spec.network_policy.monitoring)]
    # No client peers given: only the operator reaches the router.
    bare = _service(
        "production", {"spec": {"networkPolicy": {"routerClients": [], "monitoring": []}}}
    )
    router = _of_kind(_children(bare), "NetworkPolicy")["llama-70b-router"]
    assert _rules_for(router, bare.spec.router.port) == [[operator]]


def test_workers_accept_their_router_each_other_the_operator_and_monitoring() -> None:
    isvc = _service("production")
    worker = _of_kind(_children(isvc), "NetworkPolicy")["llama-70b-worker"]
    pool = {
        "matchLabels": {labels.SERVICE: "llama-70b"},
        "matchExpressions": [
            {"key": labels.ROLE, "operator": "In", "values": ["prefill", "decode"]}
        ],
    }
    assert worker["spec"]["podSelector"] == pool
    http = _rules_for(worker, isvc.spec.engine.port)
    side_channel = _rules_for(worker, isvc.spec.kv_transfer.side_channel_port)
    # Only the pool itself reaches the side channel (and UCX's ephemeral ports).
    assert side_channel == [[{"podSelector": pool}]]
    peers = [peer for rule in http for peer in rule]
    assert {"podSelector": {"matchLabels": {labels.SERVICE: "llama-70b",
                                            labels.ROLE: "router"}}} in peers  # fmt: skip
    assert {"podSelector": pool} in peers
    assert all(peer in peers for peer in isvc.spec.network_policy.monitoring)
    assert len(http) == 4


def test_an_external_router_gets_no_router_policy() -> None:
    isvc = _service("production", {"spec": {"router": {"type": "external"}}})
    assert sorted(_of_kind(_children(isvc), "NetworkPolicy")) == ["llama-70b-worker"]


def test_http_route_forwards_only_the_openai_api_and_probes() -> None:
    route = http_route(_service("minimal"), "gateway-system", "public")
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateway-system"}]
    assert route["spec"]["rules"][0]["backendRefs"] == [{"name": "llama-8b-router", "port": 8000}]
    assert "ownerReferences" not in route["metadata"]
    for path in CLIENT_PATHS:
        assert route_allows(route, path), path
    for path in ADMIN_PATHS:
        assert not route_allows(route, path), path


def test_pdfleet_render_prints_the_route() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pdfleet.cli", "render", "-f", str(SAMPLES_DIR / "minimal.yaml"),
         "--http-route", "gateway-system/public"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    route = [d for d in yaml.safe_load_all(out) if d["kind"] == "HTTPRoute"]
    assert route and route[0]["spec"]["parentRefs"][0]["namespace"] == "gateway-system"
