"""The process bridge: a kubelet stand-in that runs pdfleet pods as local processes.

Where it fits: the local cluster (``e2e/platform/cluster.py``) has a real control plane and kwok's
fake GPU nodes. kwok alone only pretends: pods turn Running with nothing behind them. For the e2e
scenarios and the demo, pods that carry the bridge label (by default ``pdfleet.dev/role``, present
on every prefill, decode and router pod the operator renders) are left by kwok to this bridge, which
plays kubelet for them:

* kwok's bridge stage gives a scheduled pod its IP from the node's podCIDR (phase Pending,
  containers ``ContainerCreating``); without that stage the bridge allocates one itself, from
  the top of the node's podCIDR down, away from kwok's pool, which grows from the bottom;
* the bridge resolves the container's environment, maps the container to a local command
  (``pdfleet-agent launch`` with ``PDFLEET_ENGINE=sim`` for workers, or with the real vLLM
  engine for workers of the CPU engine image, the real ``vllm-router`` for the router)
  bound to the pod IP, which is a local address inside ``e2e/platform/netns.sh``;
* it reports ``pods/status`` like kubelet (Running, container states, restarts) and drives
  Ready from the container's own startup/readiness probes (httpGet, exec, tcpSocket), writing
  only on change; liveness failures restart the container;
* on deletion it runs the preStop exec hook, SIGTERMs, SIGKILLs at the end of the grace period
  and then deletes the pod with ``gracePeriodSeconds=0`` (uid precondition);
* a process that exits by itself is restarted (restartPolicy Always, the only policy of
  StatefulSet and Deployment pods) with a capped back-off and a growing ``restartCount``;
  under Never/OnFailure the pod ends Succeeded or Failed as kubelet would.

The pure part (pod -> command and environment, IP allocation, probe bookkeeping, status
patches) is plain functions over Kubernetes JSON dicts, unit-tested in ``tests/unit/e2e``.
The I/O part is one watch thread plus one thread per pod. Use it as a class from pytest
(:class:`Bridge`) or from the command line, inside the cluster's network namespace::

    python -m e2e.platform.bridge --kubeconfig FILE [--time-scale 0.1] [--log-dir DIR]

See docs/e2e.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

import httpx

from pdfleet import labels

log = logging.getLogger("pdfleet.bridge")

Manifest = dict[str, Any]

#: Pods carrying this label (any value) belong to the bridge; use the same key as
#: ``ClusterConfig.bridge_label`` so that kwok leaves them alone.
OWNED_LABEL = labels.ROLE
#: kwokctl's kwok controller manages nodes with this annotation (e2e/platform/cluster.py sets it).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
VENV_BIN = Path(sys.executable).parent
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})
#: Flags whose wildcard value is rewritten to the pod IP (the router binds one address).
BIND_FLAGS = ("--host", "--prometheus-host")
WORKER_ROLES = frozenset(labels.WORKER_ROLES)

Lookup = Callable[[str, str], Mapping[str, str] | None]
"""(kind ``secret``|``configmap``, name) -> its data (decoded), or None when absent."""


# ---------------------------------------------------------------------------------------
# Settings and the image -> command table
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerRule:
    """Containers this rule sends to ``runner``: by pod role label and/or image pattern."""

    runner: str
    roles: frozenset[str] = frozenset()  # values of pdfleet.dev/role; empty: any
    image: str = "*"  # fnmatch pattern on the container image

    def matches(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> bool:
        role = pod_labels(pod).get(labels.ROLE, "")
        if self.roles and role not in self.roles:
            return False
        return fnmatch.fnmatchcase(str(container.get("image", "")), self.image)


#: Worker pods of this image run the real vLLM engine (its CPU build, installed by
#: e2e/platform/engine.sh) instead of the simulator: a fleet chooses its engine by the image it
#: names.
REAL_ENGINE_IMAGE = "*/pdfleet-worker-cpu:*"

DEFAULT_RULES: tuple[RunnerRule, ...] = (
    RunnerRule("engine", roles=WORKER_ROLES, image=REAL_ENGINE_IMAGE),
    RunnerRule("worker", roles=WORKER_ROLES),
    RunnerRule("router", roles=frozenset({labels.ROLE_ROUTER})),
)


@dataclass(frozen=True)
class BridgeSettings:
    """What the bridge runs and how. Only ``kubeconfig`` and ``log_dir`` are required."""

    kubeconfig: Path
    log_dir: Path
    owned_label: str = OWNED_LABEL
    namespace: str | None = None  # watch one namespace; None: all
    time_scale: float = 1.0  # PDFLEET_SIM_TIME_SCALE: wall seconds per simulated second
    sim_preset: str | None = None  # PDFLEET_SIM_PRESET; None: the simulator's default
    engine_root: Path | None = None  # e2e/platform/engine.sh's install, for REAL_ENGINE_IMAGE pods
    bin_dir: Path = VENV_BIN  # searched first for commands (pdfleet-agent, vllm-router)
    rules: tuple[RunnerRule, ...] = DEFAULT_RULES
    ip_wait_s: float = 3.0  # wait this long for kwok's pod IP before allocating one
    probe_period_max_s: float | None = None  # cap on probe periods (faster tests); None: spec
    # Floor on probe timeouts: here every pod shares the machine's few cores, so an exec probe
    # (a process start) can take longer than on a node of its own; None: spec.
    probe_timeout_min_s: float | None = None
    restart_backoff_s: float = 1.0  # first restart delay; doubles up to restart_backoff_max_s
    restart_backoff_max_s: float = 30.0
    tick_s: float = 0.1  # how often a pod's thread looks at its process and probes


# ---------------------------------------------------------------------------------------
# Pure helpers: pods and nodes
# ---------------------------------------------------------------------------------------


def pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_kwok_node(node: Mapping[str, Any]) -> bool:
    annotations = node.get("metadata", {}).get("annotations") or {}
    return KWOK_NODE_ANNOTATION in annotations


def node_pod_cidr(node: Mapping[str, Any]) -> str | None:
    spec = node.get("spec", {})
    cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    return str(cidrs[0]) if cidrs else None


def node_internal_ip(node: Mapping[str, Any]) -> str:
    for address in node.get("status", {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address["address"])
    return ""


def allocate_pod_ip(pod_cidr: str, used: set[str]) -> str:
    """The highest free host address of ``pod_cidr``.

    kwok's pool hands out addresses from the bottom of a node's podCIDR upwards (and reuses
    freed ones), so allocating from the top keeps the two apart until the range is full;
    ``used`` (every pod IP on the node) makes the choice collision-free and deterministic.
    """
    net = ipaddress.ip_network(pod_cidr)
    for host in reversed(list(net.hosts())):
        if str(host) not in used:
            return str(host)
    raise ValueError(f"no free address left in {pod_cidr}")


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (as the API server writes it) -> epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def grace_deadline(pod: Mapping[str, Any], now: float) -> float:
    """When kubelet would SIGKILL: ``deletionTimestamp`` is deletion start + grace period."""
    deleted = parse_time(pod.get("metadata", {}).get("deletionTimestamp"))
    return deleted if deleted is not None else now


def exit_action(restart_policy: str, exit_code: int) -> Literal["restart", "Succeeded", "Failed"]:
    """What kubelet does when a container exits on its own."""
    if restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0):
        return "restart"
    return "Succeeded" if exit_code == 0 else "Failed"


def exit_code(returncode: int) -> int:
    """A container's exit code as kubelet reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def restart_delay(restarts: int, base_s: float, max_s: float) -> float:
    """kubelet-style exponential back-off before restart number ``restarts + 1``."""
    return float(min(max_s, base_s * (2 ** min(restarts, 20))))


# ---------------------------------------------------------------------------------------
# Pure helpers: environment and commands
# ---------------------------------------------------------------------------------------

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` escapes ``$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(sub, value)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Mapping[str, Any], path: str, pod_ip: str, host_ip: str) -> str | None:
    """The value of a downward-API ``fieldRef`` (the fields kubelet supports for env)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        value = simple[path]
        return None if value is None else str(value)
    match = _SUBSCRIPT.match(path)
    if match:
        found = (meta.get(match.group(1)) or {}).get(match.group(2))
        return None if found is None else str(found)
    return None


def resolve_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    lookup: Lookup | None = None,
) -> dict[str, str]:
    """A container's environment as kubelet would build it: ``envFrom`` first, then ``env``
    in order (later entries win), with ``value``, ``fieldRef``, ``secretKeyRef`` and
    ``configMapKeyRef`` (through ``lookup``; missing ones are left out) and ``$(VAR)``
    expansion. ``resourceFieldRef`` has no local meaning and is left out."""
    out: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for kind, ref_key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(ref_key)
            if ref and lookup is not None:
                data = lookup(kind, str(ref.get("name", ""))) or {}
                prefix = str(source.get("prefix", ""))
                out.update({prefix + k: str(v) for k, v in data.items()})
    for item in container.get("env") or []:
        name = str(item["name"])
        value: str | None
        if "value" in item or "valueFrom" not in item:
            value = expand(str(item.get("value", "")), out)
        else:
            value = _value_from(item["valueFrom"], pod, pod_ip, host_ip, lookup)
        if value is not None:
            out[name] = value
    return out


def _value_from(
    source: Mapping[str, Any],
    pod: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    lookup: Lookup | None,
) -> str | None:
    if "fieldRef" in source:
        return field_ref(pod, str(source["fieldRef"].get("fieldPath", "")), pod_ip, host_ip)
    for kind, ref_key in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
        ref = source.get(ref_key)
        if ref is not None:
            if lookup is None:
                return None
            data = lookup(kind, str(ref.get("name", ""))) or {}
            found = data.get(str(ref.get("key", "")))
            return None if found is None else str(found)
    return None


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
#: spinning a core per engine (an option of e2e/platform/engine.sh's install).
REAL_ENGINE_ENV = {
    "PDFLEET_NIXL_PTHR_DELAY_US": "1000",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
#: On a node each pod has cores of its own; here three engines share two with the control
#: plane, which must keep its share to reconcile on time (an engine's start alone keeps a
#: core busy for a minute).
ENGINE_NICE = ("nice", "-n", "10")
#: The image's ``pdfleet-agent``: the agent from this checkout run by the engine's Python,
#: as the worker image installs it into vLLM's environment.
ENGINE_SHIM_DIR = Path(__file__).resolve().parent / "engine-bin"
WORKER_SRC = Path(__file__).resolve().parents[2] / "worker-image" / "src"


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
        "PYTHONPATH": str(WORKER_SRC),
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


# ---------------------------------------------------------------------------------------
# Pure helpers: probes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A container probe as declared in the pod spec (named ports resolved)."""

    kind: Literal["http", "exec", "tcp"]
    command: tuple[str, ...] = ()
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ValueError(f"container {container.get('name')!r} has no port named {port!r}")


def parse_probe(
    spec: Mapping[str, Any] | None,
    container: Mapping[str, Any],
    period_max_s: float | None = None,
    timeout_min_s: float | None = None,
) -> Probe | None:
    """The probe in ``spec`` with Kubernetes defaults; periods capped at ``period_max_s``,
    timeouts raised to ``timeout_min_s``."""
    if not spec:
        return None
    period = float(spec.get("periodSeconds", 10))
    timeout = float(spec.get("timeoutSeconds", 1))
    common: dict[str, Any] = {
        "initial_delay_s": float(spec.get("initialDelaySeconds", 0)),
        "period_s": min(period, period_max_s) if period_max_s else period,
        "timeout_s": max(timeout, timeout_min_s) if timeout_min_s else timeout,
        "success_threshold": int(spec.get("successThreshold", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
    }
    if "httpGet" in spec:
        http = spec["httpGet"]
        return Probe(
            "http",
            port=resolve_port(http["port"], container),
            path=str(http.get("path", "/")),
            scheme=str(http.get("scheme", "HTTP")),
            **common,
        )
    if "exec" in spec:
        return Probe("exec", command=tuple(spec["exec"].get("command") or ()), **common)
    if "tcpSocket" in spec:
        return Probe("tcp", port=resolve_port(spec["tcpSocket"]["port"], container), **common)
    raise ValueError(f"unsupported probe: {sorted(spec)}")


@dataclass
class ProbeTracker:
    """kubelet's per-probe result: flips after success/failure thresholds in a row."""

    probe: Probe
    ok: bool = False
    successes: int = 0  # in a row
    failures: int = 0  # in a row
    next_due: float = 0.0

    def start(self, now: float, ok: bool = False) -> None:
        """(Re)arm for a new container; liveness starts ``ok``, the others do not."""
        self.ok, self.successes, self.failures = ok, 0, 0
        self.next_due = now + self.probe.initial_delay_s

    def due(self, now: float) -> bool:
        return now >= self.next_due

    def observe(self, success: bool, now: float) -> bool:
        """Record one result; True when ``ok`` changed."""
        self.next_due = now + self.probe.period_s
        if success:
            self.successes, self.failures = self.successes + 1, 0
            flip = not self.ok and self.successes >= self.probe.success_threshold
        else:
            self.successes, self.failures = 0, self.failures + 1
            flip = self.ok and self.failures >= self.probe.failure_threshold
        if flip:
            self.ok = success
        return flip


# ---------------------------------------------------------------------------------------
# Pure helpers: status
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerView:
    """What kubelet reports for one container; equal views mean no status write."""

    name: str
    image: str
    state: Literal["waiting", "running", "terminated"] = "waiting"
    reason: str = "ContainerCreating"
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    last_exit: tuple[int, float, float] | None = None  # exit code, started, finished
    container_id: str = ""


def _state(
    kind: str, reason: str, code: int | None, started: float | None, fin: float | None
) -> Manifest:
    if kind == "running":
        return {"running": {"startedAt": rfc3339(started or 0.0)}}
    if kind == "terminated":
        return {
            "terminated": {
                "exitCode": code or 0,
                "reason": reason,
                "startedAt": rfc3339(started or 0.0),
                "finishedAt": rfc3339(fin or 0.0),
            }
        }
    return {"waiting": {"reason": reason}}


def container_status(view: ContainerView) -> Manifest:
    """One ``status.containerStatuses`` entry."""
    status: Manifest = {
        "name": view.name,
        "image": view.image,
        "imageID": "",
        "containerID": view.container_id,
        "ready": view.ready,
        "started": view.started,
        "restartCount": view.restart_count,
        "state": _state(view.state, view.reason, view.exit_code, view.started_at, view.finished_at),
    }
    if view.last_exit is not None:
        code, started, finished = view.last_exit
        reason = "Completed" if code == 0 else "Error"
        status["lastState"] = _state("terminated", reason, code, started, finished)
    return status


def pod_conditions(
    previous: Sequence[Mapping[str, Any]], ready: bool, now: float
) -> list[Manifest]:
    """The pod conditions kubelet owns; a transition time moves only when a status changes."""
    before = {str(c.get("type")): c for c in previous}
    wanted = {
        "PodScheduled": True,
        "PodReadyToStartContainers": True,
        "Initialized": True,
        "ContainersReady": ready,
        "Ready": ready,
    }
    out: list[Manifest] = []
    for ctype, value in wanted.items():
        status = "True" if value else "False"
        old = before.get(ctype)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        cond: Manifest = {
            "type": ctype,
            "status": status,
            "lastTransitionTime": since or rfc3339(now),
        }
        if not value:
            cond["reason"] = "ContainersNotReady"
        out.append(cond)
    return out


def pod_phase(views: Sequence[ContainerView], terminal: str | None) -> str:
    if terminal is not None:
        return terminal
    if any(v.state == "running" or v.restart_count > 0 for v in views):
        return "Running"
    return "Pending"


def status_patch(
    pod: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    views: Sequence[ContainerView],
    now: float,
    terminal: str | None = None,
) -> Manifest:
    """The strategic-merge patch of ``pods/status`` for the current container views.

    ``metadata.uid`` makes the write fail instead of landing on a newer pod of the same name
    (StatefulSet pods reuse names).
    """
    status = pod.get("status", {})
    ready = bool(views) and all(v.ready for v in views) and terminal is None
    body: Manifest = {
        "phase": pod_phase(views, terminal),
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": status.get("startTime") or rfc3339(now),
        "conditions": pod_conditions(status.get("conditions") or [], ready, now),
        "containerStatuses": [container_status(v) for v in views],
    }
    if host_ip:
        body |= {"hostIP": host_ip, "hostIPs": [{"ip": host_ip}]}
    return {"metadata": {"uid": pod["metadata"]["uid"]}, "status": body}


def ip_patch(pod: Mapping[str, Any], pod_ip: str, host_ip: str) -> Manifest:
    """Claim ``pod_ip`` for a pod kwok gave none; ``resourceVersion`` makes it conditional."""
    meta = pod["metadata"]
    return {
        "metadata": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
        "status": {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]}
        | ({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}]} if host_ip else {}),
    }


# ---------------------------------------------------------------------------------------
# I/O: one container's process and probes
# ---------------------------------------------------------------------------------------


def which(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """argv with its command resolved on env's PATH, as a container runtime would."""
    found = shutil.which(argv[0], path=env.get("PATH"))
    if found is None:
        raise FileNotFoundError(f"{argv[0]} not found on {env.get('PATH')}")
    return [found, *argv[1:]]


def run_exec(
    command: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: Path
) -> tuple[int, str]:
    """An exec probe or hook: exit code (-1 on timeout or spawn failure) and output."""
    try:
        proc = subprocess.run(
            which(command, env),
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=max(timeout_s, 0.1),
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        out = err.stdout if isinstance(err.stdout, str) else ""
        return -1, f"{out}timed out after {timeout_s:.1f}s"
    except OSError as err:
        return -1, str(err)
    return proc.returncode, proc.stdout + proc.stderr


def probe_once(probe: Probe, pod_ip: str, env: Mapping[str, str], cwd: Path) -> tuple[bool, str]:
    """Run one probe against the container the way kubelet would."""
    if probe.kind == "http":
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        url = f"{probe.scheme.lower()}://{host}:{probe.port}{probe.path}"
        try:
            resp = httpx.get(url, timeout=probe.timeout_s, verify=False)
        except httpx.HTTPError as err:
            return False, f"GET {url}: {err!r}"
        return 200 <= resp.status_code < 400, f"GET {url}: {resp.status_code}"
    if probe.kind == "tcp":
        try:
            with socket.create_connection((pod_ip, probe.port), timeout=probe.timeout_s):
                return True, "connected"
        except OSError as err:
            return False, f"connect {pod_ip}:{probe.port}: {err}"
    code, out = run_exec(probe.command, env, probe.timeout_s, cwd)
    return code == 0, out.strip()


@dataclass
class ContainerRun:
    """The local process behind one container, its probes and its reported view."""

    spec: Manifest
    command: LocalCommand
    log_path: Path
    events_path: Path
    startup: ProbeTracker | None
    readiness: ProbeTracker | None
    liveness: ProbeTracker | None
    view: ContainerView
    popen: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def event(self, message: str) -> None:
        with self.events_path.open("a") as f:
            f.write(f"{rfc3339(time.time())} {message}\n")

    def start(self, cwd: Path) -> None:
        argv = which(self.command.argv, self.command.env)
        self._log = self.log_path.open("ab")
        self._log.write(f"==== {rfc3339(time.time())} start: {' '.join(argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            argv,
            env=dict(self.command.env),
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: signals reach its children
        )
        now = time.time()
        for tracker in (self.startup, self.readiness):
            if tracker is not None:
                tracker.start(now)
        if self.liveness is not None:
            self.liveness.start(now, ok=True)
        self.view = replace(
            self.view,
            state="running",
            reason="",
            started_at=now,
            finished_at=None,
            exit_code=None,
            ready=False,
            started=self.startup is None,
            container_id=f"bridge://{self.popen.pid}",
        )
        self.restart_at = None

    def signal(self, sig: int) -> None:
        """Like a container runtime: SIGTERM (any catchable signal) goes to the main process
        alone, which shuts its children down itself (vLLM's API server drains its engine
        core); SIGKILL takes the whole container, i.e. the process group."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(self.popen.pid, sig)
                else:
                    os.kill(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> bool:
        """True when the process has exited within ``timeout_s``."""
        if self.popen is None:
            return True
        try:
            self.popen.wait(max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code."""
        self.signal(signal.SIGTERM)
        if not self.wait(grace_s):
            self.signal(signal.SIGKILL)
            self.wait(10)
        return self.exited()

    def exited(self) -> int | None:
        """The exit code once the process is gone (its log closed), else None."""
        if self.popen is None or self.popen.poll() is None:
            return None
        if self._log is not None:  # first look since it exited
            # A container ends with its main process: whatever it left behind goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self._log.close()
            self._log = None
        return exit_code(self.popen.returncode)


# ---------------------------------------------------------------------------------------
# I/O: one pod
# ---------------------------------------------------------------------------------------


class PodWorker(threading.Thread):
    """Plays kubelet for one pod (one uid) from first sight to deletion."""

    def __init__(self, bridge: Bridge, pod: Manifest) -> None:
        super().__init__(name=f"pod-{pod_key(pod)}", daemon=True)
        self.bridge = bridge
        self.settings = bridge.settings
        self.key = pod_key(pod)
        self.uid = str(pod["metadata"]["uid"])
        self._pod = pod
        self._lock = threading.Lock()
        self.changed = threading.Event()
        self.gone = threading.Event()  # the pod is no longer in the API
        self.stopping = threading.Event()  # bridge shutdown: kill, do not touch the API
        self.pod_ip = ""
        self.host_ip = ""
        # Like kubelet's /var/log/pods/<namespace>_<name>_<uid>: a recreated pod of the same
        # name (StatefulSet) gets its own directory.
        self.pod_dir = self.settings.log_dir / f"{self.key.replace('/', '_')}_{self.uid[:8]}"
        self.containers: list[ContainerRun] = []
        self.terminal: str | None = None
        self.timeline: dict[str, float] = {"seen": time.time()}
        self._written: tuple[object, ...] | None = None
        self.prestop_output: dict[str, str] = {}

    # -- fed by the watch thread ---------------------------------------------------------

    def update(self, pod: Manifest) -> None:
        with self._lock:
            self._pod = pod
        self.changed.set()

    @property
    def pod(self) -> Manifest:
        with self._lock:
            return self._pod

    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    # -- the thread ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("%s: bridge worker failed", self.key)
            self.bridge.failed(self)
        finally:
            for c in self.containers:
                if c.running():
                    c.stop(grace_s=2.0)
            self.bridge.forget(self)

    def _run(self) -> None:
        terminal = self.pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if not terminal and self._claim_ip():
            self._start_containers()
            self._supervise()
        if self.deleting() and not (self.stopping.is_set() or self.gone.is_set()):
            self._terminate()

    def _claim_ip(self) -> bool:
        """Take kwok's pod IP, waiting ``ip_wait_s`` for it, else allocate one."""
        node = self.bridge.node(str(self.pod["spec"]["nodeName"]))
        self.host_ip = node_internal_ip(node)
        deadline = time.monotonic() + self.settings.ip_wait_s
        while True:
            if self.stopping.is_set() or self.gone.is_set() or self.deleting():
                return False
            pod = self.pod
            ip = pod.get("status", {}).get("podIP")
            if ip:
                self.pod_ip = str(ip)
                self.host_ip = str(pod["status"].get("hostIP") or self.host_ip)
                self.timeline["ip"] = time.time()
                return True
            if time.monotonic() >= deadline:
                cidr = node_pod_cidr(node)
                if cidr is None:
                    raise RuntimeError(f"node {pod['spec']['nodeName']} has no podCIDR")
                used = self.bridge.pod_ips_on(str(pod["spec"]["nodeName"]))
                ip = allocate_pod_ip(cidr, used)
                if self.bridge.patch_status(pod, ip_patch(pod, ip, self.host_ip)):
                    log.info("%s: allocated pod IP %s (kwok gave none)", self.key, ip)
                    self.pod_ip = ip
                    self.timeline["ip"] = time.time()
                    return True
                deadline = time.monotonic() + 0.5  # lost a race: look again
            self.changed.wait(0.2)
            self.changed.clear()

    def _start_containers(self) -> None:
        pod = self.pod
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        ctx = LaunchContext(
            pod_ip=self.pod_ip,
            pod_dir=self.pod_dir,
            bin_dir=self.settings.bin_dir,
            kubeconfig=self.settings.kubeconfig,
            search_path=os.environ.get("PATH", os.defpath),
            time_scale=self.settings.time_scale,
            sim_preset=self.settings.sim_preset,
            engine_root=self.settings.engine_root,
        )
        for spec in pod["spec"]["containers"]:
            runner = select_runner(pod, spec, self.settings.rules)
            if runner is None:
                raise RuntimeError(f"no runner for container {spec['name']} ({spec.get('image')})")
            env = resolve_env(spec, pod, self.pod_ip, self.host_ip, self.bridge.lookup(pod))
            cap, floor = self.settings.probe_period_max_s, self.settings.probe_timeout_min_s
            run = ContainerRun(
                spec=spec,
                command=RUNNERS[runner](spec, env, ctx),
                log_path=self.pod_dir / f"{spec['name']}.log",
                events_path=self.pod_dir / f"{spec['name']}.events.log",
                startup=_tracker(parse_probe(spec.get("startupProbe"), spec, cap, floor)),
                readiness=_tracker(parse_probe(spec.get("readinessProbe"), spec, cap, floor)),
                liveness=_tracker(parse_probe(spec.get("livenessProbe"), spec, cap, floor)),
                view=ContainerView(name=str(spec["name"]), image=str(spec.get("image", ""))),
            )
            self.containers.append(run)
            run.start(self.pod_dir)
            log.info("%s/%s: %s on %s", self.key, run.name, runner, self.pod_ip)
        self.timeline["started"] = time.time()
        self._write_status()

    def _supervise(self) -> None:
        """Probes, exits and restarts until the pod is deleted (or the bridge stops)."""
        restart_policy = str(self.pod["spec"].get("restartPolicy", "Always"))
        while not (self.stopping.is_set() or self.gone.is_set() or self.deleting()):
            now = time.time()
            for c in self.containers:
                self._check_container(c, restart_policy, now)
            if self.containers and all(c.view.state == "terminated" for c in self.containers):
                codes = [c.view.exit_code or 0 for c in self.containers]
                self.terminal = "Succeeded" if not any(codes) else "Failed"
            self._write_status()
            if self.terminal is not None:
                return
            self.changed.wait(self.settings.tick_s)
            self.changed.clear()

    def _check_container(self, c: ContainerRun, restart_policy: str, now: float) -> None:
        if c.view.state == "terminated":
            return
        if c.restart_at is not None:
            if now >= c.restart_at:
                c.start(self.pod_dir)
                c.event(f"restarted (restartCount {c.view.restart_count})")
            return
        code = c.exited()
        if code is not None:
            self._on_exit(c, code, restart_policy, now)
            return
        self._probe(c, now)

    def _on_exit(self, c: ContainerRun, code: int, restart_policy: str, now: float) -> None:
        started = c.view.started_at or now
        action = exit_action(restart_policy, code)
        c.event(f"exited with {code}: {action}")
        log.warning("%s/%s exited with %s (%s)", self.key, c.name, code, action)
        if action == "restart":
            delay = restart_delay(
                c.view.restart_count,
                self.settings.restart_backoff_s,
                self.settings.restart_backoff_max_s,
            )
            c.restart_at = now + delay
            c.view = replace(
                c.view,
                state="waiting",
                reason="CrashLoopBackOff",
                ready=False,
                started=False,
                restart_count=c.view.restart_count + 1,
                last_exit=(code, started, now),
            )
        else:
            reason = "Completed" if code == 0 else "Error"
            c.view = replace(
                c.view,
                state="terminated",
                reason=reason,
                exit_code=code,
                finished_at=now,
                ready=False,
                started=False,
            )

    def _probe(self, c: ContainerRun, now: float) -> None:
        env, cwd = c.command.env, self.pod_dir
        if c.startup is not None and not c.startup.ok:
            if c.startup.due(now):
                ok, why = probe_once(c.startup.probe, self.pod_ip, env, cwd)
                if c.startup.observe(ok, time.time()):
                    c.view = replace(c.view, started=True)
                elif c.startup.failures >= c.startup.probe.failure_threshold:
                    c.event(f"startup probe failed: {why}")
                    self._kill_for_restart(c)
            return
        if c.liveness is not None and c.liveness.due(now):
            ok, why = probe_once(c.liveness.probe, self.pod_ip, env, cwd)
            if c.liveness.observe(ok, time.time()) and not c.liveness.ok:
                c.event(f"liveness probe failed: {why}")
                self._kill_for_restart(c)
                return
        if c.readiness is None:
            c.view = replace(c.view, ready=True)
        elif c.readiness.due(now):
            ok, why = probe_once(c.readiness.probe, self.pod_ip, env, cwd)
            if c.readiness.observe(ok, time.time()):
                c.event(f"readiness {'succeeded' if ok else 'failed'}: {why}")
                c.view = replace(c.view, ready=c.readiness.ok)

    def _kill_for_restart(self, c: ContainerRun) -> None:
        grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        c.stop(grace_s=min(grace, 5.0))

    def _write_status(self) -> None:
        views = tuple(c.view for c in self.containers)
        state = (views, self.terminal)
        if state == self._written:
            return
        patch = status_patch(self.pod, self.pod_ip, self.host_ip, views, time.time(), self.terminal)
        if self.bridge.patch_status(self.pod, patch):
            self._written = state
            if views and all(v.ready for v in views) and "ready" not in self.timeline:
                self.timeline["ready"] = time.time()
                created = parse_time(self.pod["metadata"].get("creationTimestamp"))
                log.info(
                    "%s: Ready, %.2fs after the bridge saw it (%.1fs after creation)",
                    self.key,
                    self.timeline["ready"] - self.timeline["seen"],
                    self.timeline["ready"] - (created or self.timeline["seen"]),
                )

    def _terminate(self) -> None:
        """preStop, SIGTERM, SIGKILL at the grace deadline, then remove the pod object."""
        self.timeline["deleting"] = time.time()
        deadline = grace_deadline(self.pod, time.time())
        for c in self.containers:
            hook = ((c.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec")
            if hook and c.running():
                t0 = time.time()
                code, out = run_exec(
                    hook.get("command") or [], c.command.env, deadline - t0, self.pod_dir
                )
                self.prestop_output[c.name] = out
                c.event(f"preStop exited {code} after {time.time() - t0:.2f}s: {out.strip()}")
        for c in self.containers:
            c.signal(signal.SIGTERM)
        for c in self.containers:
            # kubelet grants at least 2 s after preStop, even past the deadline.
            if not c.wait(max(deadline - time.time(), 2.0)):
                c.event("grace period over: SIGKILL")
                c.signal(signal.SIGKILL)
                c.wait(10)
            c.event(f"stopped, exit code {c.exited()}")
        self.timeline["stopped"] = time.time()
        self._finalize()

    def _finalize(self) -> None:
        self.bridge.delete_pod(self.pod)
        log.info("%s: deleted", self.key)

    def shutdown(self) -> None:
        self.stopping.set()
        self.changed.set()


def _tracker(probe: Probe | None) -> ProbeTracker | None:
    return ProbeTracker(probe) if probe is not None else None


# ---------------------------------------------------------------------------------------
# I/O: the bridge (watch + API calls)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodProcess:
    """What tests see of a running pod: its IP, main process and files."""

    pod_ip: str
    pid: int | None
    log_path: Path
    events_path: Path
    timeline: Mapping[str, float]


class Bridge:
    """Watches the pods it owns and plays kubelet for those on kwok nodes.

    ``with Bridge(settings) as bridge: ...`` starts the watch and stops every process on
    exit (the pods themselves are left as they are, as when a kubelet stops).
    """

    def __init__(self, settings: BridgeSettings, api_client: Any = None) -> None:
        from kubernetes import client, config

        self.settings = settings
        self.api = api_client or config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(settings.kubeconfig)
        )
        self.core = client.CoreV1Api(self.api)
        self._workers: dict[str, PodWorker] = {}
        self._finished: dict[str, PodWorker] = {}
        self._failed: set[str] = set()  # uids whose worker crashed: not retried
        self._ignored: set[str] = set()  # uids with a container no rule maps to a runner
        self._nodes: dict[str, Manifest] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, name="bridge-watch", daemon=True)
        self.synced = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Bridge:
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self._watcher.start()
        if not self.synced.wait(30):
            raise TimeoutError("bridge: first pod list did not complete in 30s")
        return self

    def stop(self) -> None:
        """Stop watching and kill every process (SIGTERM, then SIGKILL after 5 s)."""
        self._stop.set()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.join(15)
        self._watcher.join(2)

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries for tests and the CLI ----------------------------------------------------

    def process(self, namespace: str, name: str) -> PodProcess | None:
        """The live (or last finished) pod of that name, None if never seen."""
        key = f"{namespace}/{name}"
        with self._lock:
            worker = self._workers_by_key().get(key) or self._finished.get(key)
        if worker is None or not worker.containers:
            return None
        main = worker.containers[0]
        return PodProcess(
            pod_ip=worker.pod_ip,
            pid=main.popen.pid if main.popen is not None else None,
            log_path=main.log_path,
            events_path=main.events_path,
            timeline=dict(worker.timeline),
        )

    def _workers_by_key(self) -> dict[str, PodWorker]:
        return {w.key: w for w in self._workers.values()}

    # -- API helpers used by pod workers ---------------------------------------------------

    def node(self, name: str) -> Manifest:
        with self._lock:
            cached = self._nodes.get(name)
        if cached is not None:
            return cached
        resp: Any = self.core.read_node(name, _preload_content=False)
        node: Manifest = json.loads(resp.data)
        with self._lock:
            self._nodes[name] = node
        return node

    def pod_ips_on(self, node_name: str) -> set[str]:
        """Every pod IP on a node (all pods, not only the bridge's), for allocation."""
        resp: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}", _preload_content=False
        )
        ips: set[str] = set()
        for pod in json.loads(resp.data).get("items", []):
            status = pod.get("status", {})
            ips.update(str(p["ip"]) for p in status.get("podIPs") or [])
            if status.get("podIP"):
                ips.add(str(status["podIP"]))
        return ips

    def lookup(self, pod: Mapping[str, Any]) -> Lookup:
        namespace = str(pod["metadata"]["namespace"])

        def read(kind: str, name: str) -> Mapping[str, str] | None:
            from kubernetes.client.exceptions import ApiException

            try:
                if kind == "secret":
                    import base64

                    secret = self.core.read_namespaced_secret(name, namespace)
                    data = secret.data or {}
                    return {k: base64.b64decode(v).decode() for k, v in data.items()}
                return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
            except ApiException as err:
                if err.status == 404:
                    return None
                raise

        return read

    def patch_status(self, pod: Mapping[str, Any], body: Manifest) -> bool:
        """Patch ``pods/status``; False when the pod changed (conflict) or is gone."""
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"],
                meta["namespace"],
                body,
                _content_type="application/strategic-merge-patch+json",
            )
        except ApiException as err:
            if err.status in (404, 409, 422):
                log.debug("%s: status patch refused (%s)", pod_key(pod), err.status)
                return False
            raise
        return True

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        """Remove the pod object now (kubelet's final delete), only if it is still this uid."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], body=options, grace_period_seconds=0
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def failed(self, worker: PodWorker) -> None:
        with self._lock:
            self._failed.add(worker.uid)

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]
            self._finished[worker.key] = worker

    # -- the watch -------------------------------------------------------------------------

    def _list_pods(self, **kwargs: Any) -> Any:
        if self.settings.namespace:
            return self.core.list_namespaced_pod(self.settings.namespace, **kwargs)
        return self.core.list_pod_for_all_namespaces(**kwargs)

    def _watch_loop(self) -> None:
        from kubernetes import watch

        selector = self.settings.owned_label
        while not self._stop.is_set():
            try:
                resp = self._list_pods(label_selector=selector, _preload_content=False)
                listing = json.loads(resp.data)
                version = listing["metadata"]["resourceVersion"]
                live = {p["metadata"]["uid"] for p in listing.get("items", [])}
                for pod in listing.get("items", []):
                    self._observe("ADDED", pod)
                with self._lock:
                    vanished = [w for uid, w in self._workers.items() if uid not in live]
                for w in vanished:
                    w.gone.set()
                    w.changed.set()
                self.synced.set()
                while not self._stop.is_set():
                    stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                        self._list_pods,
                        label_selector=selector,
                        resource_version=version,
                        timeout_seconds=10,
                        allow_watch_bookmarks=True,
                    )
                    for event in stream:
                        obj = event["raw_object"]
                        if event["type"] == "ERROR":
                            raise RuntimeError(f"watch error: {obj}")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._observe(str(event["type"]), obj)
                        if self._stop.is_set():
                            break
            except Exception as err:  # relist: expired version, API restart, ...
                if self._stop.is_set():
                    break
                log.warning("pod watch restarting: %s", err)
                time.sleep(0.5)

    def _observe(self, kind: str, pod: Manifest) -> None:
        uid = str(pod["metadata"]["uid"])
        with self._lock:
            worker = self._workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.update(pod)
                worker.gone.set()
                worker.changed.set()
            return
        if worker is not None:
            worker.update(pod)
            return
        node_name = pod.get("spec", {}).get("nodeName")
        if not node_name or self._stop.is_set():
            return  # not scheduled yet
        terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if terminal and not pod["metadata"].get("deletionTimestamp"):
            return
        with self._lock:
            if uid in self._failed or uid in self._ignored:
                return
        try:
            if not is_kwok_node(self.node(str(node_name))):
                return
        except Exception as err:
            log.warning("%s: cannot read node %s: %s", pod_key(pod), node_name, err)
            return
        unknown = [
            str(c.get("name"))
            for c in pod["spec"].get("containers") or []
            if select_runner(pod, c, self.settings.rules) is None
        ]
        if unknown:
            # Like an image kubelet cannot pull: left as kwok reported it (ContainerCreating).
            log.warning("%s: no runner for container(s) %s; not run", pod_key(pod), unknown)
            with self._lock:
                self._ignored.add(uid)
            return
        worker = PodWorker(self, pod)
        with self._lock:
            if self._stop.is_set() or uid in self._workers:
                return
            self._workers[uid] = worker
        worker.start()


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m e2e.platform.bridge --kubeconfig FILE``: run until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.platform.bridge",
        description="Run pdfleet pods on kwok nodes as local processes (see docs/e2e.md).",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/pdfleet-bridge"))
    parser.add_argument("--label", default=OWNED_LABEL, help="label key of the pods to run")
    parser.add_argument("--namespace", default=None, help="only this namespace")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale")
    parser.add_argument("--preset", default=None, help="simulator latency preset")
    parser.add_argument(
        "--probe-period-max", type=float, default=None, help="cap on probe periods (seconds)"
    )
    parser.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="IMAGE_GLOB=RUNNER",
        help="extra image rule (runners: worker, engine, router), tried before the role rules",
    )
    parser.add_argument(
        "--engine-root",
        type=Path,
        default=None,
        help=(
            f"the real engine's install (e2e/platform/engine.sh --print-root), "
            f"for {REAL_ENGINE_IMAGE}"
        ),
    )
    args = parser.parse_args(argv)
    rules = tuple(_parse_rule(r) for r in args.rule) + DEFAULT_RULES
    settings = BridgeSettings(
        kubeconfig=args.kubeconfig.resolve(),
        log_dir=args.log_dir.resolve(),
        owned_label=args.label,
        namespace=args.namespace,
        time_scale=args.time_scale,
        sim_preset=args.preset,
        engine_root=args.engine_root,
        probe_period_max_s=args.probe_period_max,
        rules=rules,
    )
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=[
            logging.StreamHandler(),
            logging.FileHandler(settings.log_dir / "bridge.log"),
        ],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe otherwise
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with Bridge(settings):
        log.info("bridge running; logs in %s", settings.log_dir)
        done.wait()
    return 0


def _parse_rule(text: str) -> RunnerRule:
    image, eq, runner = text.rpartition("=")
    if not eq or runner not in RUNNERS:
        raise SystemExit(
            f"--rule {text!r}: expected IMAGE_GLOB=RUNNER, RUNNER in {sorted(RUNNERS)}"
        )
    return RunnerRule(runner, image=image)


@contextlib.contextmanager
def running(settings: BridgeSettings) -> Iterator[Bridge]:
    """A started bridge, stopped on exit (for pytest fixtures)."""
    bridge = Bridge(settings).start()
    try:
        yield bridge
    finally:
        bridge.stop()


if __name__ == "__main__":
    sys.exit(main())
