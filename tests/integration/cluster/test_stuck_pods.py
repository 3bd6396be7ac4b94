"""Stuck pods against the real API server: the real scheduler's verdict on a missing claim, a
crash loop as a kubelet reports it, and a Multus network that does not exist each become
PodsStuck with the pod and the cause, one Event, and Stalled after spec.progressDeadline.

kwok plays the kubelet and makes every scheduled pod Running and Ready, so the crash loop is
written to the pod's status here, as kubelet would write it; kwok leaves a Running pod alone.
The NetworkAttachmentDefinition CRD (Multus's) is installed for this module only, before the
operator starts, and removed afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from e2e.platform.cluster import Cluster, wait_until
from e2e.platform.operator_process import OperatorProcess
from pdfleet.kube.api import KINDS
from tests.integration.cluster.kube_helpers import condition, create_isvc, get_isvc, pods, wait_for
from tests.spec_cases import merge_patch, sample

NAD = KINDS["NetworkAttachmentDefinition"]
NAD_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{NAD.plural}.{NAD.group}"},
    "spec": {
        "group": NAD.group,
        "scope": "Namespaced",
        "names": {
            "plural": NAD.plural,
            "singular": "network-attachment-definition",
            "kind": "NetworkAttachmentDefinition",
            "shortNames": ["net-attach-def"],
        },
        "versions": [
            {
                "name": NAD.version, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"config": {"type": "string"}}},
                }}},
            }
        ],
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def nad_crd(cluster: Cluster, api_client: Any) -> Iterator[None]:
    """Multus's CRD, Established before the operator starts (it looks for it at start, then
    every 5 minutes), deleted after the module."""
    cluster.apply([NAD_CRD])
    ext = client.ApiextensionsV1Api(api_client)
    name = NAD_CRD["metadata"]["name"]

    def established() -> bool:
        status = ext.read_custom_resource_definition(name).status
        conditions = (status.conditions if status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until(established, 30, f"CRD {name} Established")
    yield
    ext.delete_custom_resource_definition(name)


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, crds: list[str], nad_crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with OperatorProcess(cluster.kubeconfig, log, resync_seconds=2.0).serving() as proc:
        yield proc


def _condition(api: Any, namespace: str, name: str, kind: str) -> dict[str, Any]:
    return condition(get_isvc(api, namespace, name), kind)


def _wait_condition(
    api: Any, namespace: str, name: str, kind: str, status: str, reason: str, timeout: float
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        c = _condition(api, namespace, name, kind)
        return c if c.get("status") == status and c.get("reason") == reason else None

    return wait_for(reached, timeout, f"{kind}={status} reason {reason}")


def _warnings(api: Any, namespace: str, name: str) -> list[tuple[str | None, str | None]]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [(e.reason, e.message) for e in events.items if e.type == "Warning"]


def test_a_missing_claim_is_a_stuck_pod_and_stalls_after_the_deadline(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    spec = {
        "progressDeadline": "20s",
        "model": {"source": {"pvc": {"claimName": "missing-weights"}}},
    }
    create_isvc(api_client, namespace, merge_patch(sample("minimal"), {"spec": spec}))
    stuck = _wait_condition(
        api_client, namespace, "llama-8b", "PodsStuck", "True", "VolumeUnavailable", 60
    )
    # The real scheduler's words, with the pod's name.
    assert stuck["message"].startswith("pod llama-8b-")
    assert 'persistentvolumeclaim "missing-weights" not found' in stuck["message"]
    obj = get_isvc(api_client, namespace, "llama-8b")
    assert condition(obj, "InsufficientCapacity")["status"] == "False"
    assert condition(obj, "Ready")["reason"] == "PodsStuck"

    stalled = _wait_condition(
        api_client, namespace, "llama-8b", "Stalled", "True", "VolumeUnavailable", 60
    )
    assert "spec.progressDeadline 20s" in stalled["message"]

    def both_warnings() -> list[tuple[str | None, str | None]] | None:
        w = _warnings(api_client, namespace, "llama-8b")
        return w if {"VolumeUnavailable", "ProgressDeadlineExceeded"} <= {r for r, _ in w} else None

    warnings = wait_for(
        both_warnings, 30, "the VolumeUnavailable and ProgressDeadlineExceeded Events"
    )
    assert [r for r, _ in warnings].count("VolumeUnavailable") == 1  # once, not every pass


def _readiness(status: str, since: str) -> list[dict[str, str]]:
    """Ready and ContainersReady as kubelet writes them."""
    return [
        {"type": kind, "status": status, "lastTransitionTime": since}
        for kind in ("Ready", "ContainersReady")
    ]


def _crash_loop(since: str) -> dict[str, Any]:
    """The status kubelet reports for a worker whose engine keeps getting OOM-killed."""
    return {
        "status": {
            "phase": "Running",
            "conditions": _readiness("False", since),
            "containerStatuses": [
                {
                    "name": "vllm", "image": "worker", "imageID": "", "ready": False,
                    "started": False, "restartCount": 4,
                    "state": {"waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 1m20s restarting failed container=vllm",
                    }},
                    "lastState": {"terminated": {
                        "exitCode": 137, "reason": "OOMKilled", "startedAt": since,
                        "finishedAt": since,
                    }},
                }
            ],
        }
    }  # fmt: skip


def test_a_crash_loop_a_kubelet_reports_is_named_once_and_clears(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    create_isvc(api_client, namespace, sample("minimal"))
    core = client.CoreV1Api(api_client)
    pod = "llama-8b-decode-0"
    wait_for(
        lambda: any(
            p.metadata.name == pod and p.status.phase == "Running"
            for p in pods(api_client, namespace, "llama-8b")
        ),
        60,
        f"{pod} Running",
    )
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(pod, namespace, _crash_loop(since))
    stuck = _wait_condition(
        api_client, namespace, "llama-8b", "PodsStuck", "True", "CrashLoopBackOff", 30
    )
    assert stuck["message"] == (f"pod {pod}: container vllm exited with OOMKilled (exit code 137)")
    assert _condition(api_client, namespace, "llama-8b", "Stalled")["status"] == "False"
    wait_for(
        lambda: (
            ("CrashLoopBackOff", stuck["message"]) in _warnings(api_client, namespace, "llama-8b")
        ),
        30,
        "the CrashLoopBackOff Event",
    )

    # The engine comes up: kubelet reports it running and ready.
    core.patch_namespaced_pod_status(
        pod,
        namespace,
        {
            "status": {
                "conditions": _readiness("True", since),
                "containerStatuses": [
                    {
                        "name": "vllm", "image": "worker", "imageID": "", "ready": True,
                        "started": True, "restartCount": 5,
                        "state": {"running": {"startedAt": since}},
                    }
                ],
            }
        },
    )  # fmt: skip
    _wait_condition(api_client, namespace, "llama-8b", "PodsStuck", "False", "NoPodStuck", 30)
    crash_events = [r for r, _ in _warnings(api_client, namespace, "llama-8b")]
    assert crash_events.count("CrashLoopBackOff") == 1


def test_a_missing_network_attachment_is_named_until_it_is_created(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    # Decode asks for more GPUs than any node has, so its worker stays not Ready.
    spec = {
        "kvTransfer": {"fabric": {"rdmaResource": "rdma/ib", "networks": ["ib-rdma-net"]}},
        "decode": {"parallelism": {"tensor": 8, "data": 2}},
    }
    create_isvc(api_client, namespace, merge_patch(sample("minimal"), {"spec": spec}))
    stuck = _wait_condition(
        api_client, namespace, "llama-8b", "PodsStuck", "True", "NetworkAttachmentMissing", 60
    )
    assert stuck["message"] == (
        f"NetworkAttachmentDefinition {namespace}/ib-rdma-net not found "
        "(spec.kvTransfer.fabric.networks): workers cannot attach it"
    )
    _wait_condition(
        api_client, namespace, "llama-8b", "InsufficientCapacity", "True", "Unschedulable", 60
    )
    time.sleep(3 * operator.resync_seconds)  # passes go on: no Event repeats

    def both_reasons() -> list[str | None] | None:
        e = [r for r, _ in _warnings(api_client, namespace, "llama-8b")]
        return e if {"NetworkAttachmentMissing", "InsufficientCapacity"} <= set(e) else None

    events = wait_for(
        both_reasons, 30, "the NetworkAttachmentMissing and InsufficientCapacity Events"
    )
    # When it turned True, not on every pass; nor capacity's, while its write waited.
    assert events.count("NetworkAttachmentMissing") == 1, events
    assert events.count("InsufficientCapacity") == 1, events

    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        NAD.group, NAD.version, namespace, NAD.plural,
        {
            "apiVersion": NAD.group_version, "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "ib-rdma-net"},
            "spec": {"config": '{"cniVersion": "0.3.1", "type": "ib-sriov"}'},
        },
    )  # fmt: skip
    # The watch on the networks queues the service: no resync needed, but allow for one.
    _wait_condition(api_client, namespace, "llama-8b", "PodsStuck", "False", "NoPodStuck", 30)
