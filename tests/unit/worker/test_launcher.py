"""Table tests of the PDFLEET_* env contract -> vLLM 0.33 command line."""

from __future__ import annotations

import itertools
import json

import pytest

from pdfleet_worker.launcher import (
    AGENT_HISTOGRAM_BUCKETS,
    LaunchConfigError,
    build_vllm_command,
    build_vllm_env,
    side_channel_ports,
)

BASE = {"PDFLEET_ROLE": "prefill", "PDFLEET_MODEL": "/models/llama", "PDFLEET_POD_IP": "10.0.0.7"}


def _ktc(argv: list[str]) -> dict[str, object]:
    value: dict[str, object] = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    return value


def test_prefill_defaults() -> None:
    argv = build_vllm_command(BASE)
    assert argv == [
        "vllm",
        "serve",
        "/models/llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "1",
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer",'
        '"kv_load_failure_policy":"fail","kv_connector_extra_config":{"backends":["UCX"]}}',
        "--shutdown-timeout",
        "60",
        "--custom-histogram-buckets",
        json.dumps(
            {family: list(bounds) for family, bounds in AGENT_HISTOGRAM_BUCKETS.items()},
            separators=(",", ":"),
        ),
    ]
    assert build_vllm_env(BASE) == {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
    }


@pytest.mark.parametrize(
    ("extra", "flag", "value"),
    [
        ({"PDFLEET_TP": "4"}, "--tensor-parallel-size", "4"),
        ({"PDFLEET_DP": "2"}, "--data-parallel-size", "2"),
        ({"PDFLEET_PORT": "8200"}, "--port", "8200"),
        ({"PDFLEET_SHUTDOWN_TIMEOUT": "240"}, "--shutdown-timeout", "240"),
        ({"PDFLEET_SERVED_MODEL_NAME": "llama-8b"}, "--served-model-name", "llama-8b"),
        ({"PDFLEET_BLOCK_SIZE": "128"}, "--block-size", "128"),
        ({"PDFLEET_MAX_MODEL_LEN": "32768"}, "--max-model-len", "32768"),
        ({"PDFLEET_GPU_MEMORY_UTILIZATION": "0.85"}, "--gpu-memory-utilization", "0.85"),
        ({"PDFLEET_HOST": "10.0.0.7"}, "--host", "10.0.0.7"),
    ],
)
def test_flags(extra: dict[str, str], flag: str, value: str) -> None:
    argv = build_vllm_command({**BASE, **extra})
    assert argv[argv.index(flag) + 1] == value


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"PDFLEET_ROLE": "decode"}, {"kv_role": "kv_consumer"}),
        ({"PDFLEET_KV_ROLE": "kv_both"}, {"kv_role": "kv_both"}),
        (
            {"PDFLEET_KV_BACKENDS": "UCX, LIBFABRIC"},
            {"kv_connector_extra_config": {"backends": ["UCX", "LIBFABRIC"]}},
        ),
        (
            {"PDFLEET_KV_LEASE_SECONDS": "120"},
            {"kv_connector_extra_config": {"backends": ["UCX"], "kv_lease_duration": 120}},
        ),
        ({"PDFLEET_KV_BUFFER_DEVICE": "cpu"}, {"kv_buffer_device": "cpu"}),
        ({"PDFLEET_KV_LOAD_FAILURE_POLICY": "recompute"}, {"kv_load_failure_policy": "recompute"}),
        ({"PDFLEET_KV_CONNECTOR": "NixlPushConnector"}, {"kv_connector": "NixlPushConnector"}),
    ],
)
def test_kv_transfer_config(extra: dict[str, str], expected: dict[str, object]) -> None:
    ktc = _ktc(build_vllm_command({**BASE, **extra}))
    for key, value in expected.items():
        assert ktc[key] == value


def test_no_connector_means_no_kv_flags_and_no_pod_ip_needed() -> None:
    env = {"PDFLEET_ROLE": "decode", "PDFLEET_MODEL": "m", "PDFLEET_KV_CONNECTOR": "none"}
    assert "--kv-transfer-config" not in build_vllm_command(env)
    assert build_vllm_env(env) == {}


def test_extra_args_appended_last() -> None:
    env = {**BASE, "PDFLEET_EXTRA_ARGS": json.dumps(["--enable-prefix-caching", "--seed", "1"])}
    assert build_vllm_command(env)[-3:] == ["--enable-prefix-caching", "--seed", "1"]


def _buckets(argv: list[str]) -> dict[str, list[float]]:
    """The last --custom-histogram-buckets, the one vLLM's parser keeps."""
    at = len(argv) - 1 - argv[::-1].index("--custom-histogram-buckets")
    value: dict[str, list[float]] = json.loads(argv[at + 1])
    return value


def test_itl_buckets_fine_to_100_ms_then_vllms_own() -> None:
    bounds = _buckets(build_vllm_command(BASE))["inter_token_latency"]
    assert bounds[:20] == [round(0.001 * i, 3) for i in range(1, 21)]  # every ms to 20 ms
    assert {0.0225, 0.025, 0.03, 0.035, 0.04, 0.05, 0.055, 0.095} <= set(bounds)
    # from 10 to 100 ms no bucket is wider than an eighth of its upper bound
    steps = list(itertools.pairwise(bounds))
    assert all(hi - lo <= 0.125 * hi + 1e-12 for lo, hi in steps if 0.01 <= lo < 0.1)
    # every one of vLLM's default bounds stays, so their le= series keep existing
    vllm_default = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0]
    vllm_default += [2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
    assert set(vllm_default) <= set(bounds) and bounds == sorted(set(bounds))
    assert "0.015," in json.dumps(bounds)  # no float noise on the wire (0.015000000000000001)


def test_request_latency_buckets_resolve_sub_second_waits_then_vllms_own() -> None:
    bounds = _buckets(build_vllm_command(BASE))["request_latency"]
    assert bounds[:11] == [0.005, *(round(0.01 * i, 2) for i in range(1, 11))]
    # to a second no bucket is wider than 10 ms or a third of its upper bound
    steps = itertools.pairwise(bounds)
    assert all(hi - lo <= max(0.01, hi / 3) + 1e-12 for lo, hi in steps if hi <= 1)
    vllm_default = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0]
    vllm_default += [60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
    assert set(vllm_default) <= set(bounds) and bounds == sorted(set(bounds))
    assert "0.07," in json.dumps(bounds)


def test_the_users_histogram_buckets_come_last_and_win() -> None:
    mine = json.dumps({"time_to_first_token": [0.5, 1.0]})
    argv = build_vllm_command(
        {**BASE, "PDFLEET_EXTRA_ARGS": json.dumps(["--custom-histogram-buckets", mine])}
    )
    assert _buckets(argv) == {"time_to_first_token": [0.5, 1.0]}


@pytest.mark.parametrize(("value", "flagged"), [("true", True), ("", False), ("no", False)])
def test_scale_out_endpoints_only_when_asked(value: str, flagged: bool) -> None:
    argv = build_vllm_command({**BASE, "PDFLEET_ENABLE_SCALE_OUT": value})
    assert ("--enable-scale-out" in argv) is flagged


def test_sim_engine() -> None:
    env = {
        **BASE,
        "PDFLEET_ENGINE": "sim",
        "PDFLEET_SIM_PRESET": "llama-3.1-8b-h100",
        "PDFLEET_SIM_TIME_SCALE": "0.1",
    }
    argv = build_vllm_command(env)
    assert argv[:2] == ["pdfleet-sim", "/models/llama"]
    assert argv[argv.index("--preset") + 1] == "llama-3.1-8b-h100"
    assert argv[argv.index("--time-scale") + 1] == "0.1"


def test_side_channel_ports_per_dp_rank() -> None:
    env = {**BASE, "PDFLEET_DP": "3", "PDFLEET_SIDE_CHANNEL_PORT": "5700"}
    assert side_channel_ports(env) == [5700, 5701, 5702]


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"PDFLEET_MODEL": "m"}, "PDFLEET_ROLE"),
        ({**BASE, "PDFLEET_ROLE": "router"}, "PDFLEET_ROLE"),
        ({"PDFLEET_ROLE": "decode"}, "PDFLEET_MODEL"),
        ({**BASE, "PDFLEET_POD_IP": ""}, "PDFLEET_POD_IP"),
        ({**BASE, "PDFLEET_POD_IP": "localhost"}, "PDFLEET_POD_IP"),
        ({**BASE, "PDFLEET_POD_IP": "0.0.0.0"}, "PDFLEET_POD_IP"),
        ({**BASE, "PDFLEET_TP": "zero"}, "PDFLEET_TP"),
        ({**BASE, "PDFLEET_TP": "0"}, "PDFLEET_TP"),
        ({**BASE, "PDFLEET_SHUTDOWN_TIMEOUT": "-1"}, "PDFLEET_SHUTDOWN_TIMEOUT"),
        ({**BASE, "PDFLEET_EXTRA_ARGS": "--foo"}, "PDFLEET_EXTRA_ARGS"),
        ({**BASE, "PDFLEET_EXTRA_ARGS": '{"a": 1}'}, "PDFLEET_EXTRA_ARGS"),
        ({**BASE, "PDFLEET_EXTRA_ARGS": "[1]"}, "PDFLEET_EXTRA_ARGS"),
        ({**BASE, "PDFLEET_KV_ROLE": "both"}, "PDFLEET_KV_ROLE"),
        ({**BASE, "PDFLEET_KV_LOAD_FAILURE_POLICY": "retry"}, "PDFLEET_KV_LOAD_FAILURE_POLICY"),
        ({**BASE, "PDFLEET_ENGINE": "sglang"}, "PDFLEET_ENGINE"),
    ],
)
def test_bad_env_names_the_variable(env: dict[str, str], match: str) -> None:
    with pytest.raises(LaunchConfigError, match=match):
        build_vllm_command(env)
