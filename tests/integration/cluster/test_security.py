"""Security on the real API server: the RBAC matrix, and secrets only by reference.

* `kubectl auth can-i --as=system:serviceaccount:...` for the operator (the chart's RBAC, in
  cluster and namespaced mode), the router and the workers (the RBAC the operator renders for
  them) over one table of rights. The operator needs no Secret at all: the hub token reaches
  the workers by `secretKeyRef` in their pod template, so it is denied Secrets everywhere.
* A service with a hub token Secret holding a recognisable value, reconciled to Ready by the
  operator at DEBUG log level: the value (and its base64 form) appears nowhere in the
  operator's log, the Events, the status or the children; the pods reference it by name.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import Cluster
from e2e.platform.operator_process import OperatorProcess
from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render.router import router_rbac
from pdfleet.render.worker import worker_service_account
from tests.integration.cluster.kube_helpers import (
    create_isvc,
    get_isvc,
    list_children,
    pods,
    wait_ready,
)
from tests.integration.cluster.test_chart import RELEASE, install, make_namespace
from tests.spec_cases import merge_patch, sample

# Where a right is asked for: the workload namespace, another namespace, all namespaces, the
# release namespace, or cluster-scoped.
WORKLOAD, OTHER, ALL, RELEASE_NS, CLUSTER = "workload", "other", "all", "release", "cluster"


@dataclass(frozen=True)
class Right:
    subject: str  # operator, router or worker
    verb: str
    resource: str
    scope: str
    cluster_mode: bool
    namespaced_mode: bool
    subresource: str = ""

    def args(self, namespaces: dict[str, str]) -> list[str]:
        args = [self.verb, self.resource]
        if self.subresource:
            args.append(f"--subresource={self.subresource}")
        if self.scope == ALL:
            return [*args, "--all-namespaces"]
        if self.scope == CLUSTER:
            return args
        return [*args, "-n", namespaces[self.scope]]


def _rights(subject: str, rows: list[tuple[Any, ...]]) -> list[Right]:
    return [Right(subject, *row) for row in rows]


ISVC = f"{labels.PLURAL}.{labels.GROUP}"
RIGHTS = [
    *_rights("operator", [
        # What it needs.
        ("list", ISVC, ALL, True, False),
        ("watch", ISVC, WORKLOAD, True, True),
        ("patch", ISVC, WORKLOAD, True, True, "status"),
        ("patch", "statefulsets.apps", WORKLOAD, True, True),
        ("create", "networkpolicies.networking.k8s.io", WORKLOAD, True, True),
        ("create", "roles.rbac.authorization.k8s.io", WORKLOAD, True, True),
        ("patch", "pods", WORKLOAD, True, True),
        ("create", "events", WORKLOAD, True, True),
        ("create", "statefulsets.apps", OTHER, True, False),
        ("update", f"leases.coordination.k8s.io/{RELEASE}", RELEASE_NS, True, True),
        # What it must not have.
        ("get", "secrets", WORKLOAD, False, False),
        ("list", "secrets", ALL, False, False),
        ("watch", "secrets", RELEASE_NS, False, False),
        ("get", "configmaps", WORKLOAD, False, False),
        ("patch", ISVC, WORKLOAD, False, False),
        ("delete", ISVC, WORKLOAD, False, False),
        ("create", "pods", WORKLOAD, False, False),
        ("delete", "pods", WORKLOAD, False, False),
        ("create", "pods", WORKLOAD, False, False, "exec"),
        ("create", "serviceaccounts", WORKLOAD, False, False, "token"),
        ("escalate", "roles.rbac.authorization.k8s.io", WORKLOAD, False, False),
        ("bind", "roles.rbac.authorization.k8s.io", WORKLOAD, False, False),
        ("impersonate", "serviceaccounts", WORKLOAD, False, False),
        ("create", "clusterroles.rbac.authorization.k8s.io", CLUSTER, False, False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", CLUSTER, False, False),
        ("list", "nodes", CLUSTER, False, False),
        ("list", "namespaces", CLUSTER, False, False),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", CLUSTER, False, False),
        ("update", "leases.coordination.k8s.io/other", RELEASE_NS, False, False),
        ("update", "leases.coordination.k8s.io", OTHER, False, False),
        ("list", "pods", RELEASE_NS, True, False),
        ("*", "*", WORKLOAD, False, False),
    ]),
    *_rights("router", [
        ("watch", "pods", WORKLOAD, True, True),
        ("list", "pods", OTHER, False, False),
        ("list", "pods", ALL, False, False),
        ("patch", "pods", WORKLOAD, False, False),
        ("get", "secrets", WORKLOAD, False, False),
        ("list", "endpoints", WORKLOAD, False, False),
    ]),
    *_rights("worker", [
        ("list", "pods", WORKLOAD, False, False),
        ("get", "secrets", WORKLOAD, False, False),
        ("get", ISVC, WORKLOAD, False, False),
    ]),
]  # fmt: skip


def can_i(cluster: Cluster, account: str, args: list[str]) -> bool:
    """`kubectl auth can-i ... --as=<ServiceAccount>` as the cluster admin."""
    binary = cluster.bin_dir / "kubectl"
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(cluster.kubeconfig), "auth", "can-i", *args,
         f"--as={account}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def workload_accounts(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Apply the router's and workers' RBAC as the operator renders it; their usernames."""
    isvc = InferenceService.model_validate(
        merge_patch(sample("minimal"), {"metadata": {"namespace": namespace}})
    )
    cluster.apply([worker_service_account(isvc), *router_rbac(isvc)])
    prefix = f"system:serviceaccount:{namespace}"
    return {"router": f"{prefix}:llama-8b-router", "worker": f"{prefix}:llama-8b-worker"}


def check_matrix(cluster: Cluster, mode: str, namespaces: dict[str, str]) -> None:
    accounts = {
        "operator": f"system:serviceaccount:{namespaces[RELEASE_NS]}:{RELEASE}",
        **workload_accounts(cluster, namespaces[WORKLOAD]),
    }
    # Each answer is one kubectl process: ask a few at a time.
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(
            pool.map(lambda r: can_i(cluster, accounts[r.subject], r.args(namespaces)), RIGHTS)
        )
    rows, wrong = [], []
    for right, got in zip(RIGHTS, answers, strict=True):
        expected = right.cluster_mode if mode == "cluster" else right.namespaced_mode
        resource = f"{right.resource}/{right.subresource}" if right.subresource else right.resource
        rows.append(f"| {right.subject} | {right.verb} | {resource} | {right.scope} | "
                    f"{'yes' if got else 'no'} |")  # fmt: skip
        if got != expected:
            wrong.append(f"{right} answered {got}")
    print(f"\n{mode} mode:\n| subject | verb | resource | scope | allowed |", *rows, sep="\n")
    assert not wrong, "\n".join(wrong)


@pytest.fixture
def workload(api_client: Any) -> Iterator[str]:
    name = f"it-workload-{uuid.uuid4().hex[:8]}"
    make_namespace(api_client, name)
    try:
        yield name
    finally:
        client.CoreV1Api(api_client).delete_namespace(name)


def test_rbac_matrix_cluster_mode(
    cluster: Cluster, crds: list[str], namespace: str, workload: str, tmp_path: Path
) -> None:
    with contextmanager(install)(cluster, namespace, tmp_path, {}):
        check_matrix(
            cluster, "cluster", {WORKLOAD: workload, OTHER: "default", RELEASE_NS: namespace}
        )


def test_rbac_matrix_namespaced_mode(
    cluster: Cluster, crds: list[str], namespace: str, workload: str, tmp_path: Path
) -> None:
    with contextmanager(install)(cluster, namespace, tmp_path, {"watchNamespaces": [workload]}):
        check_matrix(
            cluster, "namespaced", {WORKLOAD: workload, OTHER: "default", RELEASE_NS: namespace}
        )


def test_the_hub_token_never_leaves_its_secret(
    cluster: Cluster,
    crds: list[str],
    api_client: Any,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = f"hf_pdfleet_canary_{uuid.uuid4().hex}"
    encoded = base64.b64encode(token.encode()).decode()
    core = client.CoreV1Api(api_client)
    secret = {"metadata": {"name": "hub-token"}, "type": "Opaque", "stringData": {"token": token}}
    core.create_namespaced_secret(namespace, client.V1Secret.model_validate(secret))
    assert (core.read_namespaced_secret("hub-token", namespace).data or {}).get("token") == encoded
    ref = {"name": "hub-token", "key": "token"}
    obj = merge_patch(
        sample("minimal"),
        {"spec": {"model": {"source": {"hub": {"revision": "main", "tokenSecretRef": ref}}},
                  "engine": {"env": [{"name": "EXTRA_TOKEN",
                                      "valueFrom": {"secretKeyRef": ref}}]}}},
    )  # fmt: skip
    monkeypatch.setenv("PDFLEET_LOG_LEVEL", "DEBUG")  # kopf logs whole bodies at DEBUG
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        log_path=tmp_path / "operator.log",
        extra_args=(f"--namespace={namespace}",),
    ).start()
    try:
        op.wait_healthy(timeout=120)
        create_isvc(api_client, namespace, obj)
        wait_ready(api_client, namespace, "llama-8b", timeout=180)
    finally:
        op.stop()

    log = op.log_path.read_text(errors="replace")
    assert "DEBUG" in log and "llama-8b" in log  # the log is there, and verbose
    events = core.list_namespaced_event(namespace).items
    assert events
    places = {
        "operator log": log,
        "events": json.dumps([api_client.sanitize_for_serialization(e) for e in events]),
        "status": json.dumps(get_isvc(api_client, namespace, "llama-8b").get("status")),
        "children": json.dumps(list_children(api_client, namespace, "llama-8b")),
    }
    for place, text in places.items():
        assert token not in text and encoded not in text, f"the hub token is in the {place}"

    workers = [p for p in pods(api_client, namespace, "llama-8b")
               if p.metadata.labels[labels.ROLE] in labels.WORKER_ROLES]  # fmt: skip
    assert len(workers) == 2
    for pod in workers:
        (container,) = pod.spec.containers
        from_secrets = [e for e in container.env if e.value_from and e.value_from.secret_key_ref]
        secret_env = {e.name: e.value_from.secret_key_ref for e in from_secrets}
        assert {n: (r.name, r.key) for n, r in secret_env.items()} == {
            "HF_TOKEN": ("hub-token", "token"),
            "EXTRA_TOKEN": ("hub-token", "token"),
        }
        assert token not in yaml.safe_dump(api_client.sanitize_for_serialization(pod))
        assert not any(v.secret for v in pod.spec.volumes or ())
