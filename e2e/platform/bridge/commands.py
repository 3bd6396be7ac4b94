"""A container -> the local command that stands in for it (simulator, real engine, router).

Where it fits: the pod worker picks a container's runner with ``select_runner`` (the
settings' rules) and calls ``RUNNERS[runner]`` with the resolved env and the pod's
``LaunchContext``; ``containers`` starts the ``LocalCommand`` it gets. No I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.platform.bridge.environment import expand
from e2e.platform.bridge.settings import RunnerRule

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})
#: Flags whose wildcard value is rewritten to the pod IP (the router binds one address).
BIND_FLAGS = ("--host", "--prometheus-host")


def container_argv(
    container: Mapping[str, Any], env: Mapping[str, str], entrypoint: Sequence[str] = ()
) -> list[str]:
    """``command`` (or the image's ``entrypoint``) + ``args``, with ``$(VAR)`` expanded."""
    command = list(container.get("command") or entrypoint)
    args = list(container.get("args") or [])
    return [expand(str(a), env) for a in command + args]


def rewrite_bind_args(args: Sequence[str], pod_ip: str) -> list[str]:
    """Replace a wildcard value of ``--host``/``--prometheus-host`` (both spellings) by the
    pod IP: in the namespace every pod shares one network stack, so binding 0.0.0.0 would
    take the port on every pod IP at once."""
    out: list[str] = []
    rewrite_next = False
    for arg in args:
        if rewrite_next:
            out.append(pod_ip if arg in WILDCARD_HOSTS else arg)
            rewrite_next = False
            continue
        flag, eq, value = arg.partition("=")
        if flag in BIND_FLAGS and eq:
            out.append(f"{flag}={pod_ip}" if value in WILDCARD_HOSTS else arg)
        else:
            out.append(arg)
            rewrite_next = arg in BIND_FLAGS
    return out


@dataclass(frozen=True)
class LaunchContext:
    """Per-pod facts a runner needs besides the container itself."""

    pod_ip: str
    pod_dir: Path
    bin_dir: Path
    kubeconfig: Path
    search_path: str  # PATH of the bridge, searched after bin_dir
    time_scale: float = 1.0
    sim_preset: str | None = None
    engine_root: Path | None = None


@dataclass(frozen=True)
class LocalCommand:
    """A process to start: argv (argv[0] is looked up on env's PATH) and its full env."""

    argv: tuple[str, ...]
    env: Mapping[str, str]


def base_env(ctx: LaunchContext) -> dict[str, str]:
    """What every local container starts from (kubelet gives a clean environment too)."""
    return {
        "PATH": os.pathsep.join([str(ctx.bin_dir), ctx.search_path]),
        "HOME": str(ctx.pod_dir),
        "TMPDIR": str(ctx.pod_dir),
        "LANG": "C.UTF-8",
    }


def worker_command(
    container: Mapping[str, Any], env: Mapping[str, str], ctx: LaunchContext
) -> LocalCommand:
    """A prefill/decode worker: the container's own command (``pdfleet-agent launch``, the
    image's entrypoint when unset) with the simulator as engine, bound to the pod IP."""
    full = {**base_env(ctx), **env}
    full |= {
        "PDFLEET_ENGINE": "sim",
        "PDFLEET_HOST": ctx.pod_ip,
        "PDFLEET_SIM_TIME_SCALE": repr(ctx.time_scale),
        # /tmp is per container in a real pod; here it must be per pod directory.
        "PDFLEET_DRAIN_FILE": str(ctx.pod_dir / "pdfleet-draining"),
    }
    if ctx.sim_preset:
        full["PDFLEET_SIM_PRESET"] = ctx.sim_preset
    argv = container_argv(container, full, entrypoint=("pdfleet-agent", "launch"))
    return LocalCommand(tuple(argv), full)


#: What the CPU worker image sets as ENV (docs/real-engine.md): the platform cannot be
#: inferred without a GPU, 1 GiB of KV cache per engine, no core pinning on a shared
#: machine, no model hub; and NIXL's progress thread sleeps 1 ms between polls instead of
#: spinning a core per engine (an option of e2e/platform/engine.sh's install). One OpenMP
#: thread per engine: the tiny model's operators take microseconds, and between them an
#: engine's idle OpenMP workers spin on the cores the other engines need.
REAL_ENGINE_ENV = {
    "OMP_NUM_THREADS": "1",
    "PDFLEET_NIXL_PTHR_DELAY_US": "1000",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
#: On a node each pod has cores of its own; here the engines share the machine's few cores
#: with the control plane, which must keep its share to reconcile on time, even while an
#: engine starts and keeps a core busy.
ENGINE_NICE = ("nice", "-n", "10")
#: The image's ``pdfleet-agent``: the agent from this checkout run by the engine's Python,
#: as the worker image installs it into vLLM's environment.
ENGINE_SHIM_DIR = Path(__file__).resolve().parents[1] / "engine-bin"
#: The sources the worker image installs into vLLM's environment: the agent and the message
#: types it shares with the operator (pdfleet_wire, under operator/src).
WORKER_SOURCES = tuple(
    str(Path(__file__).resolve().parents[3] / folder / "src")
    for folder in ("worker-image", "operator")
)


def engine_command(
    container: Mapping[str, Any], env: Mapping[str, str], ctx: LaunchContext
) -> LocalCommand:
    """A prefill/decode worker running the real vLLM engine: the container's own command
    (``pdfleet-agent launch``) with the operator's env unchanged, in the engine's Python
    environment, bound to the pod IP."""
    if ctx.engine_root is None:
        raise RuntimeError(
            f"{container.get('image')} runs the real engine: install it (e2e/platform/engine.sh) "
            "and set BridgeSettings.engine_root"
        )
    full = {**base_env(ctx), **REAL_ENGINE_ENV, **env}
    full |= {
        "PATH": os.pathsep.join(
            [str(ENGINE_SHIM_DIR), str(ctx.engine_root / "venv" / "bin"), ctx.search_path]
        ),
        "PYTHONPATH": os.pathsep.join(WORKER_SOURCES),
        # vLLM binds ZMQ IPC sockets under TMPDIR, and a socket path has at most 107 bytes:
        # the pod's log directory is too deep. Socket names are UUIDs, so pods can share /tmp.
        "TMPDIR": "/tmp",
        "PDFLEET_ENGINE": "vllm",
        "PDFLEET_HOST": ctx.pod_ip,
        "PDFLEET_DRAIN_FILE": str(ctx.pod_dir / "pdfleet-draining"),
    }
    argv = container_argv(container, full, entrypoint=("pdfleet-agent", "launch"))
    return LocalCommand((*ENGINE_NICE, *argv), full)


def router_command(
    container: Mapping[str, Any], env: Mapping[str, str], ctx: LaunchContext
) -> LocalCommand:
    """The router: vllm-router with the pod's args, bound to the pod IP, and the cluster's
    kubeconfig so that its Kubernetes service discovery watches the local API server."""
    full = {**base_env(ctx), **env, "KUBECONFIG": str(ctx.kubeconfig)}
    argv = container_argv(container, full, entrypoint=("vllm-router",))
    return LocalCommand((argv[0], *rewrite_bind_args(argv[1:], ctx.pod_ip)), full)


Runner = Callable[[Mapping[str, Any], Mapping[str, str], LaunchContext], LocalCommand]
RUNNERS: dict[str, Runner] = {
    "worker": worker_command,
    "engine": engine_command,
    "router": router_command,
}


def select_runner(
    pod: Mapping[str, Any], container: Mapping[str, Any], rules: Sequence[RunnerRule]
) -> str | None:
    """The first rule that matches the container decides; None: the bridge cannot run it."""
    for rule in rules:
        if rule.matches(pod, container):
            return rule.runner
    return None
