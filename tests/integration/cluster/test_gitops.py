"""GitOps behaviour on the real API server: the operator acts (scales a pool, writes status)
and the user's manifest still shows no drift in a server-side diff; the Argo CD health check
reads the live object as Argo CD would.

Applying the same manifest twice writing nothing is tested in test_reconciler.py
(test_second_apply_of_the_same_file_writes_nothing).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import Cluster
from e2e.platform.operator_process import OperatorProcess
from pdfleet.preflight.plan import KV_TRANSPORT_READY
from pdfleet.reconcile.memory import RECENT_WRITE_S
from tests.integration.cluster.kube_helpers import condition, get_isvc, wait_for, wait_ready
from tests.spec_cases import merge_patch, sample
from tests.unit.chart.test_argocd_health import run_health_check

GITOPS_MANAGER = "kustomize-controller"  # what Flux applies with; Argo CD's SSA is alike
NAME = "llama-8b"


@pytest.fixture
def operator(cluster: Cluster, crds: list[str], tmp_path: Path) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        log_path=tmp_path / "operator.log",
        resync_seconds=2.0,
        identity="gitops-op",
        lease_name=f"pdfleet-gitops-{uuid.uuid4().hex[:8]}",
    )
    with proc.serving():
        yield proc


def autoscaled_manifest(namespace: str) -> dict[str, Any]:
    """The user's manifest: the minimal sample with autoscaling between 1 and 3 decoders."""
    manifest: dict[str, Any] = merge_patch(
        sample("minimal"),
        {
            "metadata": {"namespace": namespace},
            "spec": {
                "decode": {"replicas": {"min": 1, "max": 3}},
                "slo": {"ttft": {"target": "800ms"}, "itl": {"target": "40ms"}},
                "autoscaling": {
                    "enabled": True,
                    "gpuBudget": 8,
                    # Nothing listens there: an autoscaler, if running, holds.
                    "prometheus": {"url": "http://127.0.0.1:9/"},
                },
            },
        },
    )
    return manifest


def apply(cluster: Cluster, path: Path) -> str:
    return cluster.kubectl(
        "apply", "--server-side", f"--field-manager={GITOPS_MANAGER}", "-f", str(path)
    )


def scale_decode_through_status(api_client: Any, namespace: str, desired: int) -> None:
    """What the autoscaler does: its decision goes to status, never to the spec."""
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        "pdfleet.dev", "v1alpha1", namespace, "inferenceservices", NAME,
        {"status": {"decode": {"desired": desired}}},
    )  # fmt: skip


def decode_replicas(api_client: Any, namespace: str) -> int:
    sts = client.AppsV1Api(api_client).read_namespaced_stateful_set(f"{NAME}-decode", namespace)
    return int(sts.spec.replicas or 0)


def test_operator_actions_leave_no_drift_in_a_server_side_diff(
    cluster: Cluster, api_client: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    wanted = autoscaled_manifest(namespace)
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(yaml.safe_dump(wanted))
    apply(cluster, manifest)
    wait_ready(api_client, namespace, NAME)
    assert decode_replicas(api_client, namespace) == 1

    # The status patch below stands in for the operator's own autoscaler, so it must not race
    # the operator's last writes: once Ready, the KV preflight (no listener on kwok's pods)
    # records its outcome, and for RECENT_WRITE_S after a status write the operator trusts its
    # own copy over the watch (which may lag behind it), so a patch landing then is overwritten.
    wait_for(
        lambda: condition(get_isvc(api_client, namespace, NAME), KV_TRANSPORT_READY),
        60,
        "the preflight's outcome",
    )
    time.sleep(RECENT_WRITE_S + 1)
    scale_decode_through_status(api_client, namespace, 2)
    wait_for(lambda: decode_replicas(api_client, namespace) == 2, 60, "decode scaled to 2")

    def two_decoders_ready() -> bool:
        obj = get_isvc(api_client, namespace, NAME)
        health = run_health_check(obj)["status"]
        return bool(obj["status"]["decode"]["ready"] == 2 and health == "Healthy")

    wait_for(two_decoders_ready, 90, "two ready decoders")

    diff = cluster.server_side_diff([wanted], GITOPS_MANAGER)
    assert diff.returncode == 0, f"drift after the operator acted:\n{diff.stdout}{diff.stderr}"
    # Only the GitOps manager owns the object; the operator appears only on the status.
    live = get_isvc(api_client, namespace, NAME)
    for entry in live["metadata"]["managedFields"]:
        if entry["manager"] != GITOPS_MANAGER:
            assert entry.get("subresource") == "status", entry["manager"]
    assert apply(cluster, manifest).strip().endswith("serverside-applied")
    assert decode_replicas(api_client, namespace) == 2, "re-applying the manifest scaled back"


def test_argocd_health_follows_the_live_object(
    cluster: Cluster, api_client: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(yaml.safe_dump(autoscaled_manifest(namespace)))
    apply(cluster, manifest)
    seen: list[str] = []

    def healthy() -> bool:
        seen.append(run_health_check(get_isvc(api_client, namespace, NAME))["status"])
        return seen[-1] == "Healthy"

    wait_for(healthy, 90, "Healthy")
    assert set(seen) <= {"Progressing", "Healthy"}, seen

    # A new spec the operator has not seen yet: Progressing, whatever the old status said.
    operator.stop()
    changed = merge_patch(
        autoscaled_manifest(namespace), {"spec": {"engine": {"image": "example.com/worker:2"}}}
    )
    manifest.write_text(yaml.safe_dump(changed))
    apply(cluster, manifest)
    stale = run_health_check(get_isvc(api_client, namespace, NAME))
    assert stale["status"] == "Progressing" and "observe generation" in stale["message"]

    operator.start().wait_healthy()
    seen.clear()
    wait_for(healthy, 90, "Healthy after the rollout")
    assert set(seen) <= {"Progressing", "Healthy"}, seen
