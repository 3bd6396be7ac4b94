"""Turn the operator's PDFLEET_* environment into the `vllm serve` command line and env.

Where it fits: the worker container's entrypoint (`pdfleet-agent launch`) calls these pure
functions and execs the result; the operator's renderer only sets env vars (contract in
docs/worker.md), so the vLLM flag details for a version live here, next to the image.
Targets vLLM 0.33: NixlConnector, per-engine side-channel port, --shutdown-timeout drain.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

ROLES = ("prefill", "decode")
ENGINES = ("vllm", "sim")
# 0.33 logs a deprecation for kv_both with Nixl: say which side each pool is.
DEFAULT_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
_LOOPBACK = {"localhost", "127.0.0.1", "0.0.0.0", "::", "::1"}


def _every(step_us: int, after_us: int, to_us: int) -> tuple[float, ...]:
    """Bounds in seconds, `step_us` apart, from one step past `after_us` to `to_us`."""
    return tuple(us / 1e6 for us in range(after_us + step_us, to_us + 1, step_us))


# vLLM's inter-token latency buckets (10, 25, 50, 75 ms, ...) put common ITL targets such
# as 15, 20 or 30 ms inside a bucket, where a quantile or the share of requests within the
# target is only an interpolation, and a quantile of a decode running at 6 ms reads 9.5 ms.
# The autoscaler sizes decode on a quantile of the per-request time per output token, so the
# bounds keep its error near a tenth: every millisecond to 20 ms, every 2.5 ms to 50 (25, 30,
# 40 ms are bounds), every 5 ms to 100, then vLLM's own bounds. The family also sets the
# per-request time per output token. Fixed rather than derived from a service's SLO: editing
# a target must not restart the pools.
AGENT_ITL_BUCKETS = (
    *_every(1000, 0, 20_000),
    *_every(2500, 20_000, 50_000),
    *_every(5000, 50_000, 100_000),
    *(0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)

# vLLM's request-latency buckets start at 0.3 s, so every queue wait of a sub-second TTFT
# target falls in the first bucket, whose quantile reads 0.285 s at p95 whatever the waits.
# The autoscaler compares prefill's queue-time quantile with how far TTFT is over target,
# so the bounds resolve the waits: every 10 ms to 100 ms, every 25 ms to 300 ms, then
# vLLM's own bounds. The family also sets e2e, inference, prefill and decode time.
AGENT_REQUEST_LATENCY_BUCKETS = (
    0.005,
    *_every(10_000, 0, 100_000),
    *_every(25_000, 100_000, 300_000),
    *(0.4, 0.5, 0.65, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
#: What the agent sets with `--custom-histogram-buckets`, family by family.
AGENT_HISTOGRAM_BUCKETS = {
    "inter_token_latency": AGENT_ITL_BUCKETS,
    "request_latency": AGENT_REQUEST_LATENCY_BUCKETS,
}


class LaunchConfigError(ValueError):
    """The environment does not describe a worker that can start (message names the var)."""


@dataclass(frozen=True)
class LaunchConfig:
    role: str
    model: str
    served_model_name: str | None
    host: str
    port: int
    tp: int
    dp: int
    pod_ip: str | None
    side_channel_port: int
    kv_connector: str | None
    kv_role: str
    kv_backends: tuple[str, ...]
    kv_buffer_device: str | None
    kv_load_failure_policy: str
    shutdown_timeout: int
    block_size: int | None
    max_model_len: int | None
    gpu_memory_utilization: float | None
    extra_args: tuple[str, ...]
    engine: str
    sim_preset: str | None
    sim_time_scale: float | None
    enable_scale_out: bool = False
    kv_lease_seconds: int | None = None


def _int(env: Mapping[str, str], key: str, default: int, minimum: int = 0) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise LaunchConfigError(f"{key}={raw!r} is not an integer") from None
    if value < minimum:
        raise LaunchConfigError(f"{key}={value} must be >= {minimum}")
    return value


def _opt(env: Mapping[str, str], key: str) -> str | None:
    value = env.get(key, "").strip()
    return value or None


def parse_env(env: Mapping[str, str]) -> LaunchConfig:
    role = env.get("PDFLEET_ROLE", "").strip()
    if role not in ROLES:
        raise LaunchConfigError(f"PDFLEET_ROLE={role!r} must be one of {', '.join(ROLES)}")
    model = _opt(env, "PDFLEET_MODEL")
    if model is None:
        raise LaunchConfigError("PDFLEET_MODEL is required")
    connector = env.get("PDFLEET_KV_CONNECTOR", "NixlConnector").strip()
    kv_connector = None if connector.lower() in ("", "none") else connector
    pod_ip = _opt(env, "PDFLEET_POD_IP")
    if kv_connector and (pod_ip is None or pod_ip in _LOOPBACK):
        # The side-channel host is echoed to the peer as remote_host and bound by ZMQ.
        raise LaunchConfigError(
            "PDFLEET_POD_IP must be the pod IP (fieldRef status.podIP) when a KV connector is "
            f"set, got {pod_ip!r}"
        )
    kv_role = env.get("PDFLEET_KV_ROLE", "").strip() or DEFAULT_KV_ROLE[role]
    if kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise LaunchConfigError(f"PDFLEET_KV_ROLE={kv_role!r} is not a vLLM kv_role")
    policy = env.get("PDFLEET_KV_LOAD_FAILURE_POLICY", "").strip() or "fail"
    if policy not in ("fail", "recompute"):
        raise LaunchConfigError(f"PDFLEET_KV_LOAD_FAILURE_POLICY={policy!r}: fail|recompute")
    raw_extra = env.get("PDFLEET_EXTRA_ARGS", "").strip() or "[]"
    try:
        extra = json.loads(raw_extra)
    except json.JSONDecodeError as err:
        raise LaunchConfigError(f"PDFLEET_EXTRA_ARGS is not JSON: {err}") from None
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise LaunchConfigError("PDFLEET_EXTRA_ARGS must be a JSON list of strings")
    engine = env.get("PDFLEET_ENGINE", "").strip() or "vllm"
    if engine not in ENGINES:
        raise LaunchConfigError(f"PDFLEET_ENGINE={engine!r} must be one of {', '.join(ENGINES)}")
    gmu = _opt(env, "PDFLEET_GPU_MEMORY_UTILIZATION")
    scale = _opt(env, "PDFLEET_SIM_TIME_SCALE")
    try:
        gpu_util = float(gmu) if gmu else None
        time_scale = float(scale) if scale else None
    except ValueError as err:
        raise LaunchConfigError(f"not a number: {err}") from None
    backends = tuple(
        b.strip() for b in env.get("PDFLEET_KV_BACKENDS", "UCX").split(",") if b.strip()
    )
    return LaunchConfig(
        role=role,
        model=model,
        served_model_name=_opt(env, "PDFLEET_SERVED_MODEL_NAME"),
        host=env.get("PDFLEET_HOST", "").strip() or "0.0.0.0",
        port=_int(env, "PDFLEET_PORT", 8000, 1),
        tp=_int(env, "PDFLEET_TP", 1, 1),
        dp=_int(env, "PDFLEET_DP", 1, 1),
        pod_ip=pod_ip,
        side_channel_port=_int(env, "PDFLEET_SIDE_CHANNEL_PORT", 5600, 1),
        kv_connector=kv_connector,
        kv_role=kv_role,
        kv_backends=backends or ("UCX",),
        kv_buffer_device=_opt(env, "PDFLEET_KV_BUFFER_DEVICE"),
        kv_load_failure_policy=policy,
        kv_lease_seconds=_int(env, "PDFLEET_KV_LEASE_SECONDS", 0, 1) or None,
        shutdown_timeout=_int(env, "PDFLEET_SHUTDOWN_TIMEOUT", 60),
        block_size=_int(env, "PDFLEET_BLOCK_SIZE", 0) or None,
        max_model_len=_int(env, "PDFLEET_MAX_MODEL_LEN", 0) or None,
        gpu_memory_utilization=gpu_util,
        extra_args=tuple(extra),
        engine=engine,
        sim_preset=_opt(env, "PDFLEET_SIM_PRESET"),
        sim_time_scale=time_scale,
        enable_scale_out=env.get("PDFLEET_ENABLE_SCALE_OUT", "").strip().lower() == "true",
    )


def kv_transfer_config(cfg: LaunchConfig) -> dict[str, object] | None:
    if cfg.kv_connector is None:
        return None
    extra: dict[str, object] = {"backends": list(cfg.kv_backends)}
    if cfg.kv_lease_seconds is not None:
        extra["kv_lease_duration"] = cfg.kv_lease_seconds
    out: dict[str, object] = {
        "kv_connector": cfg.kv_connector,
        "kv_role": cfg.kv_role,
        "kv_load_failure_policy": cfg.kv_load_failure_policy,
        "kv_connector_extra_config": extra,
    }
    if cfg.kv_buffer_device:
        out["kv_buffer_device"] = cfg.kv_buffer_device
    return out


def build_vllm_command(env: Mapping[str, str]) -> list[str]:
    """argv of the engine: `vllm serve ...`, or `pdfleet-sim ...` when PDFLEET_ENGINE=sim."""
    cfg = parse_env(env)
    argv = ["pdfleet-sim", cfg.model] if cfg.engine == "sim" else ["vllm", "serve", cfg.model]
    argv += ["--host", cfg.host, "--port", str(cfg.port)]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    argv += ["--tensor-parallel-size", str(cfg.tp), "--data-parallel-size", str(cfg.dp)]
    ktc = kv_transfer_config(cfg)
    if ktc is not None:
        argv += ["--kv-transfer-config", json.dumps(ktc, separators=(",", ":"))]
    if cfg.block_size:
        argv += ["--block-size", str(cfg.block_size)]
    if cfg.max_model_len:
        argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    argv += ["--shutdown-timeout", str(cfg.shutdown_timeout)]
    # Before the extra args: a --custom-histogram-buckets of the user's own comes later and
    # replaces this one, as vLLM's parser keeps a flag's last value.
    buckets = {family: list(bounds) for family, bounds in AGENT_HISTOGRAM_BUCKETS.items()}
    argv += ["--custom-histogram-buckets", json.dumps(buckets, separators=(",", ":"))]
    if cfg.enable_scale_out:
        argv.append("--enable-scale-out")
    if cfg.engine == "sim":
        if cfg.sim_preset:
            argv += ["--preset", cfg.sim_preset]
        if cfg.sim_time_scale is not None:
            argv += ["--time-scale", str(cfg.sim_time_scale)]
    return argv + list(cfg.extra_args)


def build_vllm_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables to add to the engine's environment (side channel, per vLLM 0.33 envs.py)."""
    cfg = parse_env(env)
    out: dict[str, str] = {}
    if cfg.kv_connector is not None and cfg.pod_ip is not None:
        out["VLLM_NIXL_SIDE_CHANNEL_HOST"] = cfg.pod_ip
        # 0.20+: one ZMQ listener per engine at PORT + dp rank; the pod exposes
        # PORT .. PORT + dp - 1.
        out["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(cfg.side_channel_port)
    return out


def side_channel_ports(env: Mapping[str, str]) -> list[int]:
    """Ports the engine's side channels listen on (one per DP rank hosted in the pod)."""
    cfg = parse_env(env)
    return [cfg.side_channel_port + r for r in range(cfg.dp)]
