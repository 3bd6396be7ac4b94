"""Hypothesis strategies for InferenceService specs: valid values mixed with targeted violations.

A generated object is the minimal sample with a few fields replaced. Each field draws from a
short list of values that sit on and just past the edges the API promises (replica bounds,
port ranges, durations, quantities, enum members, names, cross-field rules), so a run of a
hundred or two examples crosses every rule many times. Whether an object *should* be valid is
not decided here: the oracle is the pydantic model plus its rules (`oracle()`), the single
source of the CRD, and the tests check the API server agrees with it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pydantic
from hypothesis import strategies as st

from pdfleet.api.rules import error_paths
from pdfleet.api.v1alpha1 import InferenceService
from tests.spec_cases import normalize_path, sample

Path = tuple[str, ...]

_DURATIONS = ["30s", "500ms", "1h30m", "0s", "1.5m", "5", "-1s", "1d", "10 s", ""]
_QUANTITIES = ["1Gi", "500m", 16, "1e3", "0", "lots", "-1", "1Gi ", "1.5Gi", 2.5]
_PORTS = [80, 1023, 1024, 8000, 5600, 65535, 65536]
_REPLICAS = [-1, 0, 1, 2, 3, 1000, 1001]
_PARALLEL = [0, 1, 2, 8, 64, 65]
_NAMES = ["llama", "a" * 44, "a" * 45, "1abc", "a.b", "Upper", "x-", "b-2"]
_TOKEN_REF = {"name": "hub-token", "key": "token"}


def _role_fields(role: str) -> list[tuple[Path, Sequence[Any]]]:
    """The fields each pool has, under spec.<role>."""
    return [
        (("spec", role, "replicas", "min"), _REPLICAS),
        (("spec", role, "replicas", "max"), _REPLICAS),
        (("spec", role, "replicas", "initial"), [None, *_REPLICAS]),
        (("spec", role, "parallelism", "tensor"), _PARALLEL),
        (("spec", role, "parallelism", "data"), _PARALLEL),
        (("spec", role, "resources", "requests", "cpu"), _QUANTITIES),
        (("spec", role, "resources", "limits", "cpu"), _QUANTITIES),
        (("spec", role, "resources", "limits", "nvidia.com/gpu"), [None, 1]),
        (("spec", role, "sharedMemory"), _QUANTITIES),
        (("spec", role, "gpuResource"), ["nvidia.com/gpu", "amd.com/gpu", "bad resource!"]),
        (
            ("spec", role, "nodeSelector"),
            [{}, {"nvidia.com/gpu.product": "NVIDIA-H200"}, {"bad key!": "v"}],
        ),
        (("spec", role, "affinity"), [None, {"nodeAffinity": "everywhere"}]),
        (
            ("spec", role, "tolerations"),
            [
                [],
                [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                [{"key": "gpu", "operator": "Exists", "value": "yes"}],
                [{"key": "gpu", "operator": "Equal", "value": "a", "effect": "Sometimes"}],
            ],
        ),
    ]


# (path under the object, candidate values); None deletes the field.
FIELDS: list[tuple[Path, Sequence[Any]]] = [
    (("metadata", "name"), _NAMES),
    (("spec", "model", "name"), ["org/model", "", "m" * 257]),
    (("spec", "model", "maxModelLen"), [15, 16, 4096, 10_000_001]),
    (
        ("spec", "model", "source"),
        [
            None,
            {"pvc": {"claimName": "models", "path": "/llama"}},
            {"pvc": {"claimName": "models", "path": "llama"}},
            {"hub": {"id": "org/model", "tokenSecretRef": _TOKEN_REF}},
            {"hub": {"tokenSecretRef": {"name": "Not_A_Name"}}},
            {"pvc": {"claimName": "models"}, "hub": {}},
            {},
        ],
    ),
    (("spec", "engine", "image"), ["ghcr.io/pdfleet/worker:1", "", None]),
    (("spec", "engine", "imagePullPolicy"), ["Always", "Never", "Sometimes"]),
    (("spec", "engine", "vllmVersion"), ["0.33", "0.33.1", "latest"]),
    (("spec", "engine", "port"), _PORTS),
    (("spec", "engine", "extraArgs"), [[], ["--enforce-eager"], ["x"] * 65]),
    (
        ("spec", "engine", "env"),
        [
            [{"name": "OK_NAME", "value": "1"}],
            [{"name": "1BAD", "value": "x"}],
            [{"name": "FROM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            [{"name": "FROM", "valueFrom": {"bogus": 1}}],
        ],
    ),
    (("spec", "kvTransfer", "connector"), ["NixlConnector", "P2pNcclConnector"]),
    (("spec", "kvTransfer", "backends"), [["UCX"], ["UCX", "LIBFABRIC"], [], ["TCP"]]),
    (("spec", "kvTransfer", "bufferDevice"), ["cpu", "tpu"]),
    (("spec", "kvTransfer", "sideChannelPort"), _PORTS),
    (
        ("spec", "kvTransfer", "fabric"),
        [
            None,
            {"rdmaResource": "rdma/ib", "networks": ["rdma-net"], "ucx": {"gidIndex": 3}},
            {"networks": ["rdma-net"]},
            {"ucx": {"gidIndex": 3}},
            {"rdmaResource": "rdma ib!"},
            {"rdmaResource": "rdma/ib", "rdmaPerReplica": 0},
            {"rdmaResource": "rdma/ib", "ucx": {"gidIndex": 256, "tls": "rc_x,rc"}},
        ],
    ),
    *[item for role in ("prefill", "decode") for item in _role_fields(role)],
    (("spec", "router", "type"), ["vllm-router", "external", "nginx"]),
    (("spec", "router", "replicas"), [0, 1, 2, 33]),
    (("spec", "router", "policy"), ["round_robin", "cache_aware", "fastest"]),
    (("spec", "router", "healthCheckInterval"), _DURATIONS),
    (("spec", "router", "port"), _PORTS),
    (("spec", "drain", "timeout"), _DURATIONS),
    (
        ("spec", "slo"),
        [
            None,
            {"ttft": {"target": "500ms"}, "itl": {"target": "20ms", "percentile": 99}},
            {"ttft": {"target": "500ms", "percentile": 100}, "itl": {"target": "20ms"}},
            {"ttft": {"target": "fast"}, "itl": {"target": "20ms"}},
        ],
    ),
    (("spec", "autoscaling", "enabled"), [False, True, "yes", 1]),
    (("spec", "autoscaling", "gpuBudget"), [None, 0, 1, 4, 64]),
    (
        ("spec", "autoscaling", "prometheus"),
        [None, {"url": "http://127.0.0.1:9"}, {"url": "prometheus:9090"}],
    ),
    (("spec", "autoscaling", "interval"), _DURATIONS),
    (("spec", "autoscaling", "maxScaleDownStep"), [0, 1, 1001]),
    (
        ("spec", "networkPolicy"),
        [
            None,
            {"enabled": True},
            {"enabled": True, "routerClients": [{"namespaceSelector": {}}], "monitoring": []},
            {"enabled": True, "monitoring": [{"ipBlock": {"cidr": "not-a-cidr"}}]},
            {"enabled": False, "routerClients": [{}] * 17},
        ],
    ),
    # Values of the wrong JSON type, which a lax validator would coerce.
    (("spec", "decode", "replicas", "max"), ["3", 2.5, True]),
    (("spec", "router", "replicas"), ["2"]),
    (("spec", "engine", "extraArgs"), ["--enforce-eager", [1]]),
    (("spec", "prefill", "nodeSelector"), [{"zone": 1}, ["a"]]),
    (("spec", "slo", "ttft"), [{"target": 0.5}, {"target": "1s", "percentile": "90"}]),
    (("spec", "prefill", "replica"), [None, 3]),  # a misspelt field: unknown fields are refused
]


def set_path(obj: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A copy of `obj` with `path` set to `value` (None deletes it), parents created."""
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)
    return out


@st.composite
def specs(draw: st.DrawFn, max_changes: int = 4) -> dict[str, Any]:
    """The minimal sample with 1..max_changes fields replaced by edge or violating values."""
    obj = sample("minimal")
    indexes = draw(
        st.lists(st.integers(0, len(FIELDS) - 1), min_size=1, max_size=max_changes, unique=True)
    )
    for index in indexes:
        path, values = FIELDS[index]
        obj = set_path(obj, path, draw(st.sampled_from(values)))
    return obj


def oracle(obj: dict[str, Any]) -> list[str]:
    """The field paths the models refuse (normalized); empty when the object is valid."""
    try:
        InferenceService.model_validate(obj)
    except pydantic.ValidationError as error:
        return [normalize_path(line.split(": ", 1)[0]) for line in error_paths(error)]
    return []
