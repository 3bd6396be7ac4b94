"""What makes a new KV revision (a paired rollout) and what rolls in place."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.rollout.revision import REVISION_CHARS, kv_revision
from tests.spec_cases import merge_patch, sample


def _service(patch: dict[str, Any] | None = None) -> InferenceService:
    return InferenceService.model_validate(merge_patch(sample("minimal"), patch or {}))


@pytest.mark.parametrize(
    "spec",
    [
        {"model": {"name": "another/model"}},
        {"model": {"source": {"hub": {"id": "org/weights", "revision": "v2"}}}},
        {"model": {"maxModelLen": 4096}},
        {"engine": {"image": "example.com/worker:2"}},
        {"engine": {"vllmVersion": "0.34.0"}},
        {"engine": {"extraArgs": ["--kv-cache-dtype=fp8"]}},
        {"engine": {"env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]}},
        {"decode": {"extraArgs": ["--block-size=32"]}},
        {"prefill": {"parallelism": {"tensor": 2}}},
        {"kvTransfer": {"bufferDevice": "cpu"}},
        {"kvTransfer": {"fabric": {"ucx": {"tls": "rc"}}}},
    ],
)
def test_what_decides_whether_kv_moves_is_a_new_revision(spec: dict[str, Any]) -> None:
    assert kv_revision(_service({"spec": spec})) != kv_revision(_service())


@pytest.mark.parametrize(
    "spec",
    [
        {"decode": {"replicas": {"min": 1, "max": 8, "initial": 4}}},
        {"prefill": {"resources": {"requests": {"memory": "99Gi"}}}},
        {"decode": {"nodeSelector": {"pool": "h200"}}},
        {"router": {"replicas": 2, "policy": "round_robin"}},
        {"drain": {"timeout": "30s"}},
        {"progressDeadline": "30m"},
        {"kvTransfer": {"preflight": {"iterations": 9}}},
    ],
)
def test_everything_else_rolls_in_place(spec: dict[str, Any]) -> None:
    assert kv_revision(_service({"spec": spec})) == kv_revision(_service())


def test_a_revision_is_a_label_value() -> None:
    assert re.fullmatch(f"[0-9a-f]{{{REVISION_CHARS}}}", kv_revision(_service()))
