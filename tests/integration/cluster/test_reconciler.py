"""The reconciler against the real API server: samples become fleets, status tells the truth.

The operator runs as a real process (`pdfleet operator run`); kwok plays the kubelet of the
fake GPU nodes, so pods get scheduled by the real scheduler and become Running/Ready.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import Cluster, wait_until
from e2e.platform.operator_process import OperatorProcess
from pdfleet.controller import STATUS_COALESCE_S
from tests.integration.cluster.kube_helpers import (
    condition,
    create_isvc,
    get_isvc,
    list_children,
    patch_isvc,
    pods,
    wait_for,
    wait_ready,
)
from tests.spec_cases import SAMPLES_DIR, merge_patch, sample

EXPECTED_CHILDREN = 12  # see render_children(): 1 SA, 2 x (Service, PDB, StatefulSet), router 5


def _rendered(path: Path, namespace: str) -> set[tuple[str, str]]:
    """(kind, name) of every child `pdfleet render` prints for the manifest at `path`."""
    rendered = subprocess.run(
        [sys.executable, "-m", "pdfleet.cli", "render", "-f", str(path), "-n", namespace],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered)}


def _live(api_client: Any, namespace: str, service: str) -> set[tuple[str, str]]:
    return {
        (o["kind"], o["metadata"]["name"]) for o in list_children(api_client, namespace, service)
    }


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with OperatorProcess(cluster.kubeconfig, log, resync_seconds=2.0).serving() as proc:
        yield proc


def _writes(op: OperatorProcess) -> float:
    samples = op.metrics()
    return samples.get("pdfleet_child_writes_total", 0) + samples.get(
        "pdfleet_status_writes_total", 0
    )


def _settled_writes(op: OperatorProcess, api_client: Any, namespace: str) -> float:
    """The operator's write count once it has nothing else to do. The counter is
    process-wide: a service of an earlier test may still be rolling in a namespace being
    deleted, and a status change that is only progress goes out up to
    STATUS_COALESCE_S later. So: no other test namespace left, then no write for longer
    than that interval."""
    core = client.CoreV1Api(api_client)

    def others_gone() -> bool:
        listed = core.list_namespace(label_selector="pdfleet.dev/test=true").items
        return all(ns.metadata is not None and ns.metadata.name == namespace for ns in listed)

    wait_until(others_gone, 120, "earlier tests' namespaces to be deleted")
    quiet_s = STATUS_COALESCE_S + 2 * op.resync_seconds
    last, since = _writes(op), time.monotonic()

    def quiet() -> bool:
        nonlocal last, since
        now = _writes(op)
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= quiet_s

    wait_until(quiet, 120, f"{quiet_s:.0f} s without an operator write", interval_s=0.5)
    return last


def test_minimal_sample_becomes_a_ready_fleet(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    started = time.monotonic()
    create_isvc(api_client, namespace, sample("minimal"))
    wait_for(
        lambda: len(list_children(api_client, namespace, "llama-8b")) == EXPECTED_CHILDREN,
        5.0,
        "every child within 5 s",
    )
    children_after = time.monotonic() - started
    obj = wait_ready(api_client, namespace, "llama-8b", timeout=60)
    status = obj["status"]
    assert status["prefill"]["summary"] == "1/1" and status["decode"]["summary"] == "1/1"
    assert status["endpoint"] == f"http://llama-8b-router.{namespace}.svc:8000"
    assert condition(obj, "Reconciling")["status"] == "False"
    assert condition(obj, "Stalled")["status"] == "False"
    placed = {
        p.metadata.labels["pdfleet.dev/role"]: p.spec.node_name
        for p in pods(api_client, namespace, "llama-8b")
    }
    assert placed["prefill"].startswith("gpu-") and placed["decode"].startswith("gpu-")
    assert placed["router"] == "cpu-0"
    print(f"children of the minimal sample applied {children_after:.2f}s after create")


def _production(api_client: Any, namespace: str) -> dict[str, Any]:
    """The production sample in the test namespace, with the PVC and PriorityClass it names."""
    core = client.CoreV1Api(api_client)
    scheduling = client.SchedulingV1Api(api_client)
    try:
        scheduling.create_priority_class(
            client.V1PriorityClass.model_validate(
                {"metadata": {"name": "inference-critical"}, "value": 1000000}
            )
        )
    except client.exceptions.ApiException as error:
        assert error.status == 409
    core.create_persistent_volume(
        client.V1PersistentVolume.model_validate(
            {
                "metadata": {"name": f"models-{namespace}"},
                "spec": {
                    "capacity": {"storage": "1Ti"},
                    "accessModes": ["ReadOnlyMany"],
                    "hostPath": {"path": "/models"},
                    "storageClassName": "",
                    "claimRef": {"namespace": namespace, "name": "models"},
                },
            }
        )
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        client.V1PersistentVolumeClaim.model_validate(
            {
                "metadata": {"name": "models"},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "resources": {"requests": {"storage": "1Ti"}},
                    "volumeName": f"models-{namespace}",
                },
            }
        ),
    )
    obj = sample("production")
    obj["metadata"]["namespace"] = namespace
    return obj


def test_production_sample_places_pools_on_their_gpu_types(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    expected = _rendered(SAMPLES_DIR / "production.yaml", namespace)
    create_isvc(api_client, namespace, _production(api_client, namespace))
    wait_for(
        lambda: _live(api_client, namespace, "llama-70b") == expected,
        5.0,
        f"every child within 5 s: {sorted(expected)}",
    )
    obj = wait_ready(api_client, namespace, "llama-70b", timeout=90)
    assert obj["status"]["prefill"]["ready"] == 2 and obj["status"]["decode"]["ready"] == 2
    nodes = {
        n.metadata.name: n.metadata.labels or {}
        for n in client.CoreV1Api(api_client).list_node().items
        if n.metadata is not None
    }
    gpu_types = {"prefill": "NVIDIA-H100-80GB-HBM3", "decode": "NVIDIA-H200", "router": None}
    for pod in pods(api_client, namespace, "llama-70b"):
        role = pod.metadata.labels["pdfleet.dev/role"]
        product = nodes[pod.spec.node_name].get("nvidia.com/gpu.product")
        assert product == gpu_types[role], pod.metadata.name
        assert pod.status.phase == "Running"


def test_image_change_rolls_the_statefulsets_and_delete_removes_children(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    # kwok's pods run no engine: no preflight listener to prove the new revision's pair, and
    # drains that wait out their timeout.
    quiet = {"kvTransfer": {"preflight": {"enabled": False}}, "drain": {"timeout": "5s"}}
    create_isvc(api_client, namespace, merge_patch(sample("minimal"), {"spec": quiet}))
    first = wait_ready(api_client, namespace, "llama-8b")
    before = {p.metadata.name: p.metadata.uid for p in pods(api_client, namespace, "llama-8b")}
    patch_isvc(
        api_client, namespace, "llama-8b", {"spec": {"engine": {"image": "example.com/worker:2"}}}
    )

    def rolled() -> dict[str, Any] | None:
        obj = get_isvc(api_client, namespace, "llama-8b")
        status = obj.get("status") or {}
        revisions = [r["revision"] for r in status.get("revisions", [])]
        new = status.get("revision") not in (None, first["status"]["revision"])
        done = new and "rollout" not in status and revisions == [status["revision"]]
        return obj if done and condition(obj, "Ready").get("status") == "True" else None

    obj = wait_for(rolled, 120, "the paired rollout to the new image to complete")
    assert obj["status"]["observedGeneration"] == 2
    workers = [
        p
        for p in pods(api_client, namespace, "llama-8b")
        if p.metadata.labels["pdfleet.dev/role"] != "router"
    ]
    assert {p.spec.containers[0].image for p in workers} == {"example.com/worker:2"}
    assert all(before.get(p.metadata.name) != p.metadata.uid for p in workers), "pods were replaced"

    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        "pdfleet.dev", "v1alpha1", namespace, "inferenceservices", "llama-8b"
    )
    wait_for(lambda: not list_children(api_client, namespace, "llama-8b"), 60, "garbage collection")


def test_args_change_rolls_and_fields_of_other_managers_survive(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    """Server-side apply under one field manager: a label another tool put on a child (a
    cost-allocation label, a policy engine's annotation) stays through the operator's next
    write of that child."""
    create_isvc(api_client, namespace, sample("minimal"))
    wait_ready(api_client, namespace, "llama-8b")
    apps = client.AppsV1Api(api_client)
    apps.patch_namespaced_stateful_set(
        "llama-8b-decode",
        namespace,
        {"metadata": {"labels": {"example.com/cost-center": "ml-platform"}}},
        field_manager="cost-tagger",
    )
    patch_isvc(api_client, namespace, "llama-8b", {"spec": {"engine": {"extraArgs": ["--seed=7"]}}})
    wait_ready(api_client, namespace, "llama-8b")
    sts = apps.read_namespaced_stateful_set("llama-8b-decode", namespace)
    assert sts.metadata is not None and sts.spec is not None and sts.spec.template.spec is not None
    env = {e.name: e.value or "" for e in sts.spec.template.spec.containers[0].env or ()}
    assert json.loads(env["PDFLEET_EXTRA_ARGS"]) == ["--seed=7"]  # a new template: a rollout
    assert (sts.metadata.labels or {})["example.com/cost-center"] == "ml-platform"
    managers = {f.manager for f in sts.metadata.managed_fields or ()}
    assert {"cost-tagger", "pdfleet-operator"} <= managers, managers


def test_second_apply_of_the_same_file_writes_nothing(
    cluster: Cluster, api_client: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text((SAMPLES_DIR / "minimal.yaml").read_text())
    cluster.kubectl("apply", "-n", namespace, "-f", str(manifest))
    wait_ready(api_client, namespace, "llama-8b")
    writes_before = _settled_writes(operator, api_client, namespace)

    def versions() -> dict[str, str]:
        objs = [
            get_isvc(api_client, namespace, "llama-8b"),
            *list_children(api_client, namespace, "llama-8b"),
        ]
        return {
            f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in objs
        }

    before = versions()
    out = cluster.kubectl("apply", "-n", namespace, "-f", str(manifest))
    assert "unchanged" in out
    time.sleep(3 * operator.resync_seconds)  # three resync passes over every service
    assert versions() == before
    assert _writes(operator) == writes_before


def test_too_many_gpus_is_insufficient_capacity_and_others_keep_working(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    greedy = merge_patch(
        sample("minimal"),
        {
            "metadata": {"name": "greedy"},
            "spec": {"decode": {"parallelism": {"tensor": 8, "data": 2}}},
        },
    )
    create_isvc(api_client, namespace, greedy)

    def insufficient() -> dict[str, Any]:
        return condition(get_isvc(api_client, namespace, "greedy"), "InsufficientCapacity")

    found = wait_for(
        lambda: insufficient().get("status") == "True" and insufficient(),
        60,
        "InsufficientCapacity",
    )
    assert "nvidia.com/gpu" in found["message"]
    obj = get_isvc(api_client, namespace, "greedy")
    assert condition(obj, "Ready")["status"] == "False"
    assert obj["status"]["decode"]["pending"] == 1

    create_isvc(
        api_client, namespace, merge_patch(sample("minimal"), {"metadata": {"name": "modest"}})
    )
    wait_ready(api_client, namespace, "modest")
    events = client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector="involvedObject.name=greedy"
    )
    assert any(e.reason == "InsufficientCapacity" and e.type == "Warning" for e in events.items)


def test_render_matches_what_the_operator_applies(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    create_isvc(api_client, namespace, sample("minimal"))
    wait_ready(api_client, namespace, "llama-8b")
    assert _rendered(SAMPLES_DIR / "minimal.yaml", namespace) == _live(
        api_client, namespace, "llama-8b"
    )
