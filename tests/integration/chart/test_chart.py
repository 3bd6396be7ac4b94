"""The Helm chart: lint, render with several values sets, validate every object against the
Kubernetes 1.36 schemas, and check the contract with the operator (flags, ports, RBAC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.kube.api import KINDS
from pdfleet.reconcile.plan import OWNED_KINDS, desired_replicas
from pdfleet.render import render_children
from tests.integration.chart.helm import (
    CHART,
    NAMESPACE,
    PROMETHEUS_OPERATOR_KINDS,
    VALUE_SETS,
    helm,
    render,
    render_text,
)
from tests.manifests import Manifest, by_kind, one, schema_errors
from tests.spec_cases import ROOT, sample

SCRAPE_PODMONITOR = ROOT / "operator/src/pdfleet/autoscale/scrape/podmonitor.yaml"
FULLNAME = "pdfleet"


@pytest.fixture(params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[Manifest]]:
    name = request.param
    return name, render(VALUE_SETS[name], tmp_path)


def _rules_allow(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", ())
        and resource in rule.get("resources", ())
        and verb in rule.get("verbs", ())
        and not rule.get("resourceNames")
        for rule in rules
    )


def _operator_rules(manifests: list[Manifest]) -> list[dict[str, Any]]:
    roles = by_kind(manifests, "ClusterRole") or [
        r for r in by_kind(manifests, "Role") if not r["metadata"]["name"].endswith("-election")
    ]
    assert roles, "no operator role rendered"
    rules: list[dict[str, Any]] = roles[0]["rules"]
    return rules


def test_helm_lint_passes_for_every_values_set(tmp_path: Path) -> None:
    for name, values in VALUE_SETS.items():
        values_file = tmp_path / f"{name}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        result = helm("lint", "--strict", str(CHART), "--values", str(values_file), check=False)
        assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"


def test_every_object_is_valid_for_kubernetes_1_36(rendered: tuple[str, list[Manifest]]) -> None:
    name, manifests = rendered
    errors = {
        f"{m['kind']}/{m['metadata']['name']}": schema_errors(m)
        for m in manifests
        if m["kind"] not in PROMETHEUS_OPERATOR_KINDS | {"CustomResourceDefinition"}
    }
    assert {key: error for key, error in errors.items() if error} == {}, name


def test_chart_crd_is_valid_for_kubernetes_1_36(tmp_path: Path) -> None:
    crd = one(render({}, tmp_path), "CustomResourceDefinition")
    assert schema_errors(crd) is None


def test_prometheus_operator_objects_are_well_formed(rendered: tuple[str, list[Manifest]]) -> None:
    name, manifests = rendered
    extra_labels = VALUE_SETS[name].get("monitoring", {}).get("labels", {})
    for manifest in manifests:
        if manifest["kind"] not in PROMETHEUS_OPERATOR_KINDS:
            continue
        assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
        assert manifest["metadata"]["namespace"] == NAMESPACE
        assert extra_labels.items() <= manifest["metadata"]["labels"].items()
        spec = manifest["spec"]
        if manifest["kind"] == "ServiceMonitor":
            assert spec["endpoints"][0]["port"] == "metrics"
        elif manifest["kind"] == "PodMonitor":
            assert spec["podMetricsEndpoints"][0]["port"] in ("metrics", "http")
        else:
            rules = [rule for group in spec["groups"] for rule in group["rules"]]
            assert rules and all(rule["alert"] and rule["expr"] for rule in rules)


def test_objects_are_namespaced_into_the_release_or_watched_namespaces(
    rendered: tuple[str, list[Manifest]],
) -> None:
    name, manifests = rendered
    allowed = {NAMESPACE, "monitoring", *VALUE_SETS[name].get("watchNamespaces", ())}
    for manifest in manifests:
        if manifest["kind"] in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in manifest["metadata"]
        else:
            assert manifest["metadata"]["namespace"] in allowed, manifest["metadata"]["name"]


def test_crd_ships_in_the_chart(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)
    crd = one(manifests, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == f"{labels.PLURAL}.{labels.GROUP}"


def test_operator_deployment_contract(tmp_path: Path) -> None:
    deployment = one(render({}, tmp_path), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[1:3] == ["operator", "run"]
    assert {"--leader-election", f"--lease-name={FULLNAME}", "--metrics-port=8080"} <= set(args)
    assert "--health-port=8081" in args and "--bind=0.0.0.0" in args
    assert not [a for a in args if a.startswith("--namespace")], "cluster mode watches all"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    probe = container["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "health"}
    assert pod["serviceAccountName"] == FULLNAME


def test_operator_pod_is_locked_down(tmp_path: Path) -> None:
    pod = one(render({}, tmp_path), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = pod["containers"][0]["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in context["capabilities"]
    assert not pod.get("hostNetwork") and not pod.get("hostPID")


def test_cluster_mode_rbac_is_exactly_what_the_operator_needs(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)
    rules = _operator_rules(manifests)
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    writes = ("get", "list", "watch", "create", "patch", "delete")
    expected = {(labels.GROUP, labels.PLURAL, v) for v in ("get", "list", "watch")}
    expected |= {(labels.GROUP, f"{labels.PLURAL}/status", "patch")}
    for kind in OWNED_KINDS:
        expected |= {(KINDS[kind].group, KINDS[kind].plural, v) for v in writes}
    expected |= {("", "pods", v) for v in ("get", "list", "watch", "patch")}
    expected |= {("", "events", "create")}
    nad = KINDS["NetworkAttachmentDefinition"]
    expected |= {(nad.group, nad.plural, v) for v in ("list", "watch")}
    assert granted == expected
    binding = one(manifests, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]


def test_no_dangerous_rights_in_any_mode(rendered: tuple[str, list[Manifest]]) -> None:
    _, manifests = rendered
    for role in by_kind(manifests, "ClusterRole") + by_kind(manifests, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], role["metadata"]["name"]
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
            assert not {"secrets", "configmaps", "nodes", "clusterroles"} & set(rule["resources"])


def test_leases_are_confined_to_the_release_namespace(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)
    lease_role = one(manifests, "Role", f"{FULLNAME}-leader-election")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    named = [r for r in lease_role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [FULLNAME],
            "verbs": ["get", "update"],
        }
    ]
    assert not any("leases" in r["resources"] for r in _operator_rules(manifests))


def test_namespaced_mode_has_no_cluster_wide_rights(tmp_path: Path) -> None:
    manifests = render(VALUE_SETS["namespaced"], tmp_path, include_crds=False)
    assert not by_kind(manifests, "ClusterRole") and not by_kind(manifests, "ClusterRoleBinding")
    roles = [r for r in by_kind(manifests, "Role") if r["metadata"]["name"] == FULLNAME]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [b for b in by_kind(manifests, "RoleBinding") if b["metadata"]["name"] == FULLNAME]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]


def test_operator_holds_every_right_it_grants_the_router(tmp_path: Path) -> None:
    """RBAC refuses to create a Role (or bind one) granting more than the creator holds,
    unless it has `escalate`/`bind`, which the chart does not give."""
    rules = _operator_rules(render({}, tmp_path))
    isvc = InferenceService.model_validate(
        {**sample("production"), "metadata": {"name": "x", "namespace": "n", "uid": "u"}}
    )
    children = render_children(isvc, desired_replicas(isvc, None))
    granted_to_router = [rule for role in by_kind(children, "Role") for rule in role["rules"]]
    assert granted_to_router
    for rule in granted_to_router:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert _rules_allow(rules, group, resource, verb), (group, resource, verb)


def test_operator_may_write_every_kind_it_renders(tmp_path: Path) -> None:
    rules = _operator_rules(render({}, tmp_path))
    isvc = InferenceService.model_validate(
        {**sample("production"), "metadata": {"name": "x", "namespace": "n", "uid": "u"}}
    )
    for child in render_children(isvc, desired_replicas(isvc, None)):
        kind = KINDS[child["kind"]]
        for verb in ("create", "patch", "list", "watch", "delete"):
            assert _rules_allow(rules, kind.group, kind.plural, verb), (child["kind"], verb)


def test_workers_podmonitor_matches_the_autoscalers_scrape_config(tmp_path: Path) -> None:
    shipped = yaml.safe_load(SCRAPE_PODMONITOR.read_text())
    manifests = render(VALUE_SETS["monitoring"], tmp_path)
    chart = one(manifests, "PodMonitor", f"{FULLNAME}-workers")
    assert chart["spec"]["selector"] == shipped["spec"]["selector"]
    assert chart["spec"]["namespaceSelector"] == {"any": True}
    endpoint = chart["spec"]["podMetricsEndpoints"][0]
    expected = shipped["spec"]["podMetricsEndpoints"][0]
    for key in ("port", "path", "relabelings"):
        assert endpoint[key] == expected[key], key
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"pdfleet_service", "pdfleet_role", "namespace"} <= targets


def test_workers_podmonitor_watches_only_the_watched_namespaces(tmp_path: Path) -> None:
    manifests = render(VALUE_SETS["namespaced-monitoring"], tmp_path)
    chart = one(manifests, "PodMonitor", f"{FULLNAME}-workers")
    assert chart["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}


def test_single_replica_without_leader_election(tmp_path: Path) -> None:
    manifests = render(VALUE_SETS["single"], tmp_path)
    args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-election" in args
    assert not [r for r in by_kind(manifests, "Role") if "election" in r["metadata"]["name"]]
    assert not by_kind(manifests, "PodDisruptionBudget")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCout": 2}, "replicaCout"),
        ({"replicaCount": 2, "leaderElection": {"enabled": False}}, "leaderElection"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"monitoring": {"prometheusRule": {"attainmentObjective": 2}}}, "attainmentObjective"),
    ],
)
def test_bad_values_are_refused(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    result = render_text(values, tmp=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr


def test_image_defaults_to_app_version_and_digest_wins(tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = one(render({}, tmp_path), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == f"ghcr.io/pdfleet/operator:{chart['appVersion']}"
    digest = "sha256:" + "a" * 64
    pinned = render({"image": {"digest": digest}}, tmp_path)
    container = one(pinned, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/pdfleet/operator@{digest}"
