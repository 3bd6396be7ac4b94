"""The flags and env names the operator owns: one list, held in step with the launcher that
sets the flags and the renderer that sets the env, and how a user's env meets the operator's."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.api.owned import (
    OVERRIDABLE_ENV,
    OVERRIDABLE_FLAGS,
    OWNED_ENV,
    OWNED_FLAGS,
    flag_problem,
)
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render.common import RenderConfig
from pdfleet.render.worker import merge_env, worker_env
from pdfleet_worker.launcher import build_vllm_command
from tests.spec_cases import merge_patch, sample

# Every branch of worker_env taken: a hub source with a token and a revision, a fabric with
# UCX settings, the cache-aware router, a context length, a KV lease, the preflight.
RICH = {
    "spec": {
        "model": {
            "maxModelLen": 8192,
            "source": {
                "hub": {"id": "org/m", "revision": "main", "tokenSecretRef": {"name": "hub"}}
            },
        },
        "kvTransfer": {
            "leaseSeconds": 60,
            "fabric": {
                "rdmaResource": "rdma/ib",
                "ucx": {"tls": "rc_x,cuda_copy", "netDevices": "mlx5_0:1", "gidIndex": 3},
            },
        },
        "router": {"policy": "cache_aware"},
        "engine": {"env": [{"name": "HF_HOME", "value": "/data/hf"}, {"name": "A", "value": "1"}]},
        "prefill": {"env": [{"name": "A", "value": "2"}, {"name": "HF_TOKEN", "value": "t"}]},
    }
}


NO_USER_ENV = {"spec": {"engine": {"env": None}, "prefill": {"env": None}}}


def _env(role: str = "prefill", patch: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    obj = merge_patch(merge_patch(sample("minimal"), RICH), patch or {})
    return worker_env(InferenceService.model_validate(obj), role, RenderConfig())


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_every_flag_the_launcher_sets_from_the_spec_is_owned(role: str) -> None:
    env = {item["name"]: item["value"] for item in _env(role) if "value" in item}
    env["PDFLEET_POD_IP"] = "10.244.1.7"
    flags = [arg for arg in build_vllm_command(env)[3:] if arg.startswith("-")]
    owned = {flag.flag for flag in OWNED_FLAGS}
    assert flags and set(flags) <= owned | OVERRIDABLE_FLAGS.keys(), set(flags) - owned
    assert not owned & OVERRIDABLE_FLAGS.keys()


@pytest.mark.parametrize("flag", list(OVERRIDABLE_FLAGS))
def test_a_flag_the_agent_sets_by_default_is_the_users_to_replace(flag: str) -> None:
    assert flag_problem(flag) is None
    assert flag_problem(f"{flag}={{}}") is None


def test_every_env_name_the_renderer_sets_is_owned_or_overridable() -> None:
    rendered = {item["name"] for role in ("prefill", "decode") for item in _env(role, NO_USER_ENV)}
    assert rendered <= OWNED_ENV.keys() | OVERRIDABLE_ENV.keys()
    assert not OWNED_ENV.keys() & OVERRIDABLE_ENV.keys()


def test_user_env_replaces_the_operators_in_place_and_a_role_the_engine() -> None:
    env = _env("prefill")
    names = [item["name"] for item in env]
    assert len(names) == len(set(names))
    by_name = {item["name"]: item for item in env}
    assert by_name["HF_HOME"] == {"name": "HF_HOME", "value": "/data/hf"}
    assert by_name["HF_TOKEN"] == {"name": "HF_TOKEN", "value": "t"}
    assert by_name["A"]["value"] == "2"  # the role's env over the engine's
    # the user's value takes the operator's place: later user entries may refer to it
    assert names.index("HF_HOME") < names.index("A")


def test_an_owned_name_keeps_the_operators_value() -> None:
    operator = [{"name": "PDFLEET_PORT", "value": "8000"}, {"name": "HF_HOME", "value": "/c"}]
    user = [{"name": "PDFLEET_PORT", "value": "9"}, {"name": "HF_HOME", "value": "/u"}]
    assert merge_env(operator, user) == [
        {"name": "PDFLEET_PORT", "value": "8000"},
        {"name": "HF_HOME", "value": "/u"},
    ]


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--port", "--port"),
        ("--port=9000", "--port"),
        ("--po", "--port"),  # argparse expands an unambiguous abbreviation
        ("--served_model_name=x", "--served-model-name"),
        ("--kv-transfer-config.kv_role=kv_both", "--kv-transfer-config"),
        ("-tp", "--tensor-parallel-size"),
        ("-dp=2", "--data-parallel-size"),
        ("--max-model-len=4k", "--max-model-len"),
        ("--enforce-eager", None),
        ("--portal", None),
        ("--data-parallel-size-local=1", None),
        ("--model-impl=vllm", None),
        ("--", None),
        ("-t", None),
        ("9000", None),
        ("--port 9000", None),  # one argument with a space: argparse reads a positional
    ],
)
def test_flag_spellings(arg: str, flag: str | None) -> None:
    problem = flag_problem(arg)
    assert (problem is None) if flag is None else (problem or "").startswith(f"{flag} is set")
