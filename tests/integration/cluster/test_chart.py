"""The Helm chart on the real API server: `helm install`, then the operator runs with exactly
the chart's RBAC (a token of the chart's ServiceAccount) and turns the minimal sample into a
Ready fleet. Both modes: ClusterRole (all namespaces) and namespaced (`watchNamespaces`).

kwok runs no containers, so the operator Deployment's pods are fake; the operator itself runs
as a local process (`pdfleet operator run`) that authenticates as the ServiceAccount.
`kubectl auth can-i` with the same token shows what it may not do; the full matrix of rights
(operator, router, workers; both modes) is in test_security.py.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import Cluster, wait_until
from e2e.platform.operator_process import OperatorProcess
from tests.integration.chart.helm import toolchain_binary
from tests.integration.cluster.kube_helpers import create_isvc, list_children, wait_ready
from tests.integration.cluster.test_reconciler import EXPECTED_CHILDREN
from tests.spec_cases import ROOT, sample

CHART = ROOT / "charts" / "pdfleet"
RELEASE = "pdfleet"  # the full name is then "pdfleet": ServiceAccount, Lease, Roles


@dataclass
class Release:
    namespace: str
    watched: list[str]
    kubeconfig: Path  # authenticates as the chart's ServiceAccount

    @property
    def account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{RELEASE}"


def helm(cluster: Cluster, *args: str) -> str:
    """Run the toolchain's helm against `cluster`; fails the test on a non-zero exit."""
    return helm_run(cluster, *args).stdout


def helm_run(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm` with its stderr too, where helm reports what it did (`helm push`'s digest)."""
    binary = toolchain_binary("helm", "PDFLEET_HELM")
    home = cluster.config.workdir / "helm-home"
    env = {
        **cluster.env(),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def token_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig for the cluster that authenticates with a TokenRequest token of
    `namespace/account`, so every call carries that ServiceAccount's RBAC and nothing more."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    entry = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": entry["cluster"]}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def can_i(cluster: Cluster, release: Release, *args: str) -> bool:
    """`kubectl auth can-i` as the operator's ServiceAccount (a SelfSubjectAccessReview)."""
    binary = cluster.bin_dir / "kubectl"
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(release.kubeconfig), "auth", "can-i", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def make_namespace(api_client: Any, name: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=name, labels={"pdfleet.dev/test": "true"})
        )
    )
    wait_until(
        lambda: (
            core.list_namespaced_service_account(name, field_selector="metadata.name=default").items
        ),
        30,
        f"default ServiceAccount in {name}",
    )


def install(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    values: dict[str, Any],
    chart: str = str(CHART),
    source: tuple[str, ...] = (),
) -> Iterator[Release]:
    """`helm install` of `chart` (the checkout's, or a reference such as oci://... with the
    `source` flags that locate it), then the release's ServiceAccount token."""
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm(
        cluster, "install", RELEASE, chart, *source, "--namespace", namespace,
        "--values", str(values_file), "--wait", "--timeout", "90s",
    )  # fmt: skip
    try:
        kubeconfig = token_kubeconfig(cluster, namespace, RELEASE, tmp_path / "sa.kubeconfig")
        yield Release(namespace, list(values.get("watchNamespaces") or ()), kubeconfig)
    finally:
        # The ClusterRole and its binding are cluster-scoped: the namespace's deletion
        # would not remove them.
        helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--wait")


@pytest.fixture
def cluster_release(
    cluster: Cluster, crds: list[str], namespace: str, tmp_path: Path
) -> Iterator[Release]:
    yield from install(cluster, namespace, tmp_path, {})


@pytest.fixture
def namespaced_release(
    cluster: Cluster, crds: list[str], api_client: Any, namespace: str, tmp_path: Path
) -> Iterator[Release]:
    watched = f"it-watched-{uuid.uuid4().hex[:8]}"
    make_namespace(api_client, watched)
    try:
        yield from install(cluster, namespace, tmp_path, {"watchNamespaces": [watched]})
    finally:
        client.CoreV1Api(api_client).delete_namespace(watched)


def run_operator(
    release: Release,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra_args: tuple[str, ...] = (),
) -> OperatorProcess:
    """`pdfleet operator run` with the chart's flags and the ServiceAccount's token. KUBECONFIG
    is set for the process too, so that every client library in it (kopf's login included)
    finds the ServiceAccount's credentials and no other. `extra_args` come last, so they win
    over the defaults here."""
    monkeypatch.setenv("KUBECONFIG", str(release.kubeconfig))
    scope = tuple(f"--namespace={ns}" for ns in release.watched)
    return OperatorProcess(
        kubeconfig=release.kubeconfig,
        log_path=tmp_path / "operator.log",
        identity="chart-op-0",
        lease_namespace=release.namespace,
        resync_seconds=5.0,
        lease_name=RELEASE,  # the chart's Role grants get/update on this Lease only
        extra_args=(*scope, *extra_args),
    ).start()


def assert_sample_becomes_ready(api_client: Any, namespace: str, op: OperatorProcess) -> None:
    try:
        op.wait_healthy(timeout=120)
        create_isvc(api_client, namespace, sample("minimal"))
        wait_ready(api_client, namespace, "llama-8b", timeout=180)
    except (AssertionError, TimeoutError, RuntimeError):
        print(op.log_path.read_text()[-6000:])
        raise
    assert len(list_children(api_client, namespace, "llama-8b")) == EXPECTED_CHILDREN
    assert op.metrics().get("pdfleet_leader") == 1


def test_chart_objects_are_accepted_and_the_deployment_rolls_out(
    cluster: Cluster, cluster_release: Release
) -> None:
    out = cluster.kubectl(
        "get", "deployment", RELEASE, "-n", cluster_release.namespace, "-o", "json"
    )
    deployment = json.loads(out)
    assert deployment["status"].get("readyReplicas") == 2
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == RELEASE


def test_cluster_mode_rbac_is_enough_for_a_ready_fleet(
    cluster: Cluster,
    api_client: Any,
    cluster_release: Release,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workload_ns = cluster_release.namespace
    op = run_operator(cluster_release, tmp_path, monkeypatch)
    try:
        assert_sample_becomes_ready(api_client, workload_ns, op)
    finally:
        op.stop()
    assert "failed; retrying later" not in op.log_path.read_text(), "a reconcile was refused"


def test_namespaced_mode_rbac_is_enough_and_confined(
    cluster: Cluster,
    api_client: Any,
    namespaced_release: Release,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = namespaced_release
    (watched,) = r.watched
    assert can_i(cluster, r, "list", "inferenceservices.pdfleet.dev", "-n", watched)
    assert can_i(cluster, r, "create", "statefulsets.apps", "-n", watched)
    for denied in (
        ("list", "inferenceservices.pdfleet.dev", "--all-namespaces"),
        ("list", "pods", "--all-namespaces"),
        ("list", "pods", "-n", r.namespace),
        ("create", "statefulsets.apps", "-n", "default"),
        ("get", "secrets", "-n", watched),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ):
        assert not can_i(cluster, r, *denied), denied
    op = run_operator(r, tmp_path, monkeypatch)
    try:
        assert_sample_becomes_ready(api_client, watched, op)
    finally:
        op.stop()
    assert "failed; retrying later" not in op.log_path.read_text(), "a reconcile was refused"
