"""Golden and table-driven tests of the rendered children for each sample."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest
import yaml

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.plan import desired_replicas
from pdfleet.render import RenderConfig, render_children
from pdfleet.render.router import router_deployment
from pdfleet.rollout.plan import UNPINNED
from pdfleet_worker.launcher import build_vllm_command, build_vllm_env
from tests.spec_cases import merge_patch, sample, sample_names

GOLDEN = pathlib.Path(__file__).parent / "golden"
UPDATE = os.environ.get("PDFLEET_UPDATE_GOLDEN") == "1"


def _service(name: str, patch: dict[str, Any] | None = None) -> InferenceService:
    obj = merge_patch(sample(name), patch or {})
    obj["metadata"].setdefault("namespace", "default")
    obj["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return InferenceService.model_validate(obj)


def _children(isvc: InferenceService) -> list[dict[str, Any]]:
    return render_children(isvc, desired_replicas(isvc, None), RenderConfig())


def _find(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(c for c in children if c["kind"] == kind and c["metadata"]["name"] == name)


def _worker(isvc: InferenceService, role: str) -> dict[str, Any]:
    sts = _find(_children(isvc), "StatefulSet", f"{isvc.metadata.name}-{role}")
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return {"sts": sts, "pod": sts["spec"]["template"], "container": container}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("name", sample_names())
def test_golden(name: str) -> None:
    rendered = yaml.safe_dump_all(_children(_service(name)), sort_keys=True)
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        path.write_text(rendered)
    assert rendered == path.read_text(), "rendering changed: PDFLEET_UPDATE_GOLDEN=1 to accept"


# (sample, role, expected GPUs, expected RDMA, node selector product, grace seconds)
POD_TABLE = [
    ("minimal", "prefill", "1", None, None, 340),
    ("minimal", "decode", "1", None, None, 340),
    ("production", "prefill", "2", "1", "NVIDIA-H100-80GB-HBM3", 340),
    ("production", "decode", "4", "1", "NVIDIA-H200", 340),
]


@pytest.mark.parametrize(("name", "role", "gpus", "rdma", "product", "grace"), POD_TABLE)
def test_worker_pod(
    name: str, role: str, gpus: str, rdma: str | None, product: str | None, grace: int
) -> None:
    worker = _worker(_service(name), role)
    pod, container = worker["pod"]["spec"], worker["container"]
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == gpus
    assert limits.get("rdma/ib") == rdma
    assert pod.get("nodeSelector", {}).get("nvidia.com/gpu.product") == product
    assert pod["terminationGracePeriodSeconds"] == grace
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"]["medium"] == "Memory"
    env = _env(container)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["PDFLEET_ROLE"] == role
    assert env["PDFLEET_KV_ROLE"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["pdfleet-agent", "prestop"]
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["exec"]["command"] == ["pdfleet-agent", "ready"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_production_fabric() -> None:
    worker = _worker(_service("production"), "decode")
    annotations = worker["pod"]["metadata"]["annotations"]
    assert annotations["k8s.v1.cni.cncf.io/networks"] == "ib-rdma-net"
    env = _env(worker["container"])
    assert env["UCX_TLS"] == "rc_x,rc,dc_x,cuda_copy,cuda_ipc"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    model = next(v for v in worker["pod"]["spec"]["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


@pytest.mark.parametrize(
    ("data", "ports"), [(1, [5600]), (2, [5600, 5601]), (4, [5600, 5601, 5602, 5603])]
)
def test_one_side_channel_port_per_data_parallel_rank(data: int, ports: list[int]) -> None:
    isvc = _service("minimal", {"spec": {"decode": {"parallelism": {"data": data}}}})
    container = _worker(isvc, "decode")["container"]
    nixl = [p["containerPort"] for p in container["ports"] if p["name"].startswith("nixl-")]
    assert nixl == ports
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(data)


@pytest.mark.parametrize("name", sample_names())
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_agent_turns_the_rendered_env_into_the_vllm_command(name: str, role: str) -> None:
    isvc = _service(name)
    container = _worker(isvc, role)["container"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["PDFLEET_POD_IP"] = "10.244.1.7"  # what the downward API fills in
    argv = build_vllm_command(env)
    assert argv[:2] == ["vllm", "serve"]
    assert "--kv-transfer-config" in argv
    tp = isvc.spec.role(role).parallelism.tensor
    assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
    assert build_vllm_env(env)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.244.1.7"


@pytest.mark.parametrize(
    ("router", "scale_out"),
    [
        ({"policy": "cache_aware"}, True),  # the router asks every worker for /render
        ({"policy": "power_of_two"}, False),
        ({"type": "external", "policy": "cache_aware"}, False),
    ],
)
def test_workers_serve_render_when_the_router_asks_for_it(
    router: dict[str, str], scale_out: bool
) -> None:
    isvc = _service("minimal", {"spec": {"router": router}})
    for role in ("prefill", "decode"):
        env = {
            e["name"]: e["value"] for e in _worker(isvc, role)["container"]["env"] if "value" in e
        }
        argv = build_vllm_command({**env, "PDFLEET_POD_IP": "10.244.1.7"})
        assert ("--enable-scale-out" in argv) is scale_out, role


@pytest.mark.parametrize(("lease", "expected"), [(None, None), (120, 120)])
def test_kv_lease_reaches_both_pools_connector_config(
    lease: int | None, expected: int | None
) -> None:
    kv = {} if lease is None else {"leaseSeconds": lease}
    isvc = _service("minimal", {"spec": {"kvTransfer": kv}})
    for role in ("prefill", "decode"):
        env = {
            e["name"]: e["value"] for e in _worker(isvc, role)["container"]["env"] if "value" in e
        }
        argv = build_vllm_command({**env, "PDFLEET_POD_IP": "10.244.1.7"})
        ktc = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert ktc["kv_connector_extra_config"].get("kv_lease_duration") == expected, role


def test_router_discovers_both_pools_in_its_namespace() -> None:
    children = _children(_service("production"))
    args = _find(children, "Deployment", "llama-70b-router")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--vllm-pd-disaggregation" in args
    assert args[args.index("--service-discovery-namespace") + 1] == "serving"
    prefill = args.index("--prefill-selector")
    assert args[prefill + 1 : prefill + 3] == [
        "pdfleet.dev/service=llama-70b",
        "pdfleet.dev/role=prefill",
    ]
    role = _find(children, "Role", "llama-70b-router")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert _find(children, "PodDisruptionBudget", "llama-70b-router")["spec"]["maxUnavailable"] == 1


def test_router_liveness_waits_for_a_slow_start() -> None:
    """A restarted router that is slow to listen must not be killed by liveness in a loop."""
    children = _children(_service("minimal"))
    (container,) = _find(children, "Deployment", "llama-8b-router")["spec"]["template"]["spec"][
        "containers"
    ]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/liveness"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60


def test_external_router_renders_no_router() -> None:
    children = _children(_service("minimal", {"spec": {"router": {"type": "external"}}}))
    assert not [c for c in children if c["metadata"]["labels"]["pdfleet.dev/role"] == "router"]


def test_every_child_is_owned_and_labelled() -> None:
    for child in _children(_service("production")):
        meta = child["metadata"]
        assert meta["ownerReferences"][0]["kind"] == "InferenceService"
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["pdfleet.dev/service"] == "llama-70b"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "pdfleet-operator"


def test_hub_token_is_a_secret_reference() -> None:
    patch = {"spec": {"model": {"source": {"hub": {"tokenSecretRef": {"name": "hf"}}}}}}
    env = _env(_worker(_service("minimal", patch), "prefill")["container"])
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_an_unpinned_router_selects_workers_by_role_alone() -> None:
    """While pods made before revision labels are left (pdfleet.rollout.plan.UNPINNED)."""
    isvc = _service("minimal")
    pinned = router_deployment(isvc, RenderConfig())["spec"]["template"]
    unpinned = router_deployment(isvc, RenderConfig(), UNPINNED)["spec"]["template"]
    assert labels.KV_REVISION in pinned["metadata"]["labels"]
    assert labels.KV_REVISION not in unpinned["metadata"]["labels"]
    args = unpinned["spec"]["containers"][0]["args"]
    assert not any(a.startswith(labels.KV_REVISION) for a in args), args
    assert any(a.startswith(labels.KV_REVISION) for a in pinned["spec"]["containers"][0]["args"])
