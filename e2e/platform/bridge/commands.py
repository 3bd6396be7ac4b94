"""A container -> the local command that stands in for it (simulator, real engine, router,
activator).

Where it fits: the pod worker picks a container's runner with ``select_runner`` (the
settings' rules) and calls ``RUNNERS[runner]`` with the resolved env and the pod's
``LaunchContext``; ``containers`` starts the ``LocalCommand`` it gets. No I/O: what a runner
needs from the cluster (the activator's upstream Service) comes through a callable of the
``LaunchContext`` that the bridge implements.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from e2e.platform.bridge.environment import expand
from e2e.platform.bridge.settings import RunnerRule

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})
#: Flags whose wildcard value is rewritten to the pod IP (the router binds one address).
BIND_FLAGS = ("--host", "--prometheus-host")
#: The activator's HOST:PORT flag, whose wildcard HOST is rewritten to the pod IP.
LISTEN_FLAGS = ("--listen",)
#: The activator's URL flag, whose cluster Service host is rewritten to one of its endpoints.
UPSTREAM_FLAGS = ("--upstream",)


class StartError(RuntimeError):
    """The container cannot start yet, for a reason that may pass (the activator's upstream
    Service has no endpoint address yet). The pod worker reports it as kubelet reports a
    container it cannot create (waiting, ``CreateContainerConfigError``, this message) and
    tries again with back-off, instead of giving up on the pod."""


def container_argv(
    container: Mapping[str, Any], env: Mapping[str, str], entrypoint: Sequence[str] = ()
) -> list[str]:
    """``command`` (or the image's ``entrypoint``) + ``args``, with ``$(VAR)`` expanded."""
    command = list(container.get("command") or entrypoint)
    args = list(container.get("args") or [])
    return [expand(str(a), env) for a in command + args]


def map_flag_values(
    args: Sequence[str], flags: Collection[str], change: Callable[[str], str]
) -> list[str]:
    """``args`` with ``change`` applied to the value of each of ``flags``, in both spellings
    (``--flag VALUE`` and ``--flag=VALUE``); a flag with no value after it is left as it is."""
    out: list[str] = []
    change_next = False
    for arg in args:
        if change_next:
            out.append(change(arg))
            change_next = False
            continue
        flag, eq, value = arg.partition("=")
        if flag in flags and eq:
            out.append(f"{flag}={change(value)}")
        else:
            out.append(arg)
            change_next = arg in flags
    return out


def rewrite_bind_args(args: Sequence[str], pod_ip: str) -> list[str]:
    """Replace a wildcard value of ``--host``/``--prometheus-host`` (both spellings) by the
    pod IP: in the namespace every pod shares one network stack, so binding 0.0.0.0 would
    take the port on every pod IP at once."""
    return map_flag_values(args, BIND_FLAGS, lambda v: pod_ip if v in WILDCARD_HOSTS else v)


def url_host(address: str) -> str:
    """An IP address as the host part of a URL or HOST:PORT (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def bind_address(value: str, pod_ip: str) -> str:
    """``HOST:PORT`` with a wildcard or empty HOST (``0.0.0.0:8000``, ``[::]:8000``,
    ``:8000``) -> ``POD_IP:PORT``; any other value unchanged."""
    host, colon, port = value.rpartition(":")
    if not colon or host not in WILDCARD_HOSTS | {""}:
        return value
    return f"{url_host(pod_ip)}:{port}"


def rewrite_listen_args(args: Sequence[str], pod_ip: str) -> list[str]:
    """Replace a wildcard host of ``--listen HOST:PORT`` (both spellings) by the pod IP, for
    the same reason as :func:`rewrite_bind_args`."""
    return map_flag_values(args, LISTEN_FLAGS, lambda v: bind_address(v, pod_ip))


ServiceResolver = Callable[[str, str, int], tuple[str, int] | None]


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
    namespace: str = "default"  # the pod's: where a bare Service name is looked up
    # (namespace, Service, port) -> an endpoint's (address, port) for that Service port;
    # None when it has none. The bridge's waits a bounded time for one, then raises
    # StartError with the reason. None here: Service hosts cannot be resolved.
    resolve_service: ServiceResolver | None = None


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


#: A DNS label, as Service and namespace names are (RFC 1035/1123).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: What cluster DNS appends to ``<service>.<namespace>`` (the pod's search path).
SERVICE_DOMAINS = (".svc.cluster.local", ".svc")
DEFAULT_PORTS = {"http": 80, "https": 443}


def service_of_host(host: str, namespace: str) -> tuple[str, str] | None:
    """The ``(namespace, name)`` of the Service that ``host`` names, as cluster DNS resolves
    it for a pod of ``namespace``: ``<svc>.<ns>.svc.cluster.local``, ``<svc>.<ns>.svc``,
    ``<svc>.<ns>`` or ``<svc>``. None for an IP address, ``localhost`` or any other name."""
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if host == "localhost":
        return None
    for suffix in SERVICE_DOMAINS:
        # ``foo.svc`` is Service foo of namespace svc: strip only down to <svc>.<ns>.
        if host.endswith(suffix) and host[: -len(suffix)].count(".") == 1:
            host = host[: -len(suffix)]
            break
    labels = host.split(".")
    if len(labels) == 1:
        labels.append(namespace)
    if len(labels) != 2 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        return None
    return labels[1], labels[0]


def service_endpoint(
    namespace: str,
    name: str,
    service: Mapping[str, Any] | None,
    slices: Sequence[Mapping[str, Any]],
    port: int,
) -> tuple[str, int]:
    """An endpoint ``(address, port)`` of Service ``namespace/name`` for its port ``port``,
    from the Service and its EndpointSlices (discovery.k8s.io/v1), as kube-proxy would send
    a connection there: the port is the Service port's targetPort as the EndpointSlice port
    of the same name resolves it (a named targetPort, the pod's containerPort).

    Ready endpoints first, but a not-ready one will do: the EndpointSlice controller lists a
    pod with an IP whether or not it is Ready, and the router of a sleeping service is not
    (it has no worker pair), which is the normal state the activator starts into and handles.
    Terminating endpoints come last; ties go to the lowest address (deterministic). Raises
    StartError with the reason when there is none (yet)."""
    ref = f"{namespace}/{name}"
    if service is None:
        raise StartError(f"Service {ref} not found")
    ports = service.get("spec", {}).get("ports") or []
    match = next((p for p in ports if p.get("port") == port), None)
    if match is None:
        served = ", ".join(str(p.get("port")) for p in ports) or "none"
        raise StartError(f"Service {ref} has no port {port} (its ports: {served})")
    port_name = str(match.get("name") or "")
    target = match.get("targetPort", port)
    candidates: list[tuple[int, str, int]] = []
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
            continue  # FQDN slices: not a pod address
        named = [
            p.get("port")
            for p in endpoint_slice.get("ports") or []
            if str(p.get("name") or "") == port_name
        ]
        if named and isinstance(named[0], int):
            endpoint_port = named[0]
        elif isinstance(target, int):
            endpoint_port = target  # a numeric targetPort needs no pod to resolve it
        else:
            continue  # these pods have no port of that name
        for endpoint in endpoint_slice.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if not addresses:
                continue
            conditions = endpoint.get("conditions") or {}
            # ready: unset means ready (the API's convention); terminating: unset means not.
            rank = 2 * bool(conditions.get("terminating")) + (conditions.get("ready") is False)
            candidates.append((rank, str(addresses[0]), endpoint_port))
    if not candidates:
        raise StartError(f"Service {ref} has no endpoint with an address yet (no pod IP)")
    _, address, endpoint_port = min(candidates)
    return address, endpoint_port


def resolve_upstream(url: str, ctx: LaunchContext) -> str:
    """``url`` with its host, when it names a cluster Service, replaced by the address and
    port of one of the Service's endpoints (``ctx.resolve_service``): here there is no
    cluster DNS to resolve the name and no kube-proxy behind a ClusterIP. Any other URL (an
    IP address, localhost, an outside name) is returned unchanged."""
    parts = urlsplit(url)
    ref = service_of_host(parts.hostname, ctx.namespace) if parts.hostname else None
    if ref is None:
        return url
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme, 80)
    except ValueError:
        return url  # not a port: the program rejects it itself, with its own message
    namespace, name = ref
    if ctx.resolve_service is None:
        raise StartError(f"--upstream {url}: no way to resolve Service {namespace}/{name} here")
    try:
        found = ctx.resolve_service(namespace, name, port)
    except StartError as err:
        raise StartError(f"--upstream {url}: {err}") from None
    if found is None:
        raise StartError(f"--upstream {url}: Service {namespace}/{name} has no endpoint")
    address, endpoint_port = found
    userinfo, at, _ = parts.netloc.rpartition("@")
    netloc = f"{userinfo}{at}{url_host(address)}:{endpoint_port}"
    return urlunsplit(parts._replace(netloc=netloc))


def activator_command(
    container: Mapping[str, Any], env: Mapping[str, str], ctx: LaunchContext
) -> LocalCommand:
    """The activator (``pdfleet activator``, the operator image's own program): its
    ``--listen`` bound to the pod IP and its ``--upstream``, the router's Service URL,
    pointed at an endpoint of that Service (:func:`resolve_upstream`).

    The upstream is resolved when the container starts, and again at each restart, never
    while it runs. A router pod that is replaced (a rollout, a drain, a deleted pod) is a
    new Deployment pod: a new name, maybe another node, and in general a new IP. Nothing
    keeps a pod's IP across re-creation: kwok hands out the lowest free address of the
    node's podCIDR (the bridge, when kwok gives none, the highest), so the new pod gets the
    old address only if that was freed first, and a rollout (maxSurge 1, maxUnavailable 0)
    starts the new pod while the old one still holds its address. The activator then keeps
    sending to the old address (refused: it holds requests, then answers 503) until its
    container or pod restarts; a test that replaces the router must restart the activator.

    A missing ``--listen`` makes the program bind its default, 0.0.0.0:8080, on every pod
    IP at once: the operator always renders one."""
    full = {**base_env(ctx), **env}
    argv = container_argv(container, full, entrypoint=("pdfleet",))
    args = rewrite_listen_args(argv[1:], ctx.pod_ip)
    args = map_flag_values(args, UPSTREAM_FLAGS, lambda url: resolve_upstream(url, ctx))
    return LocalCommand((argv[0], *args), full)


Runner = Callable[[Mapping[str, Any], Mapping[str, str], LaunchContext], LocalCommand]
RUNNERS: dict[str, Runner] = {
    "worker": worker_command,
    "engine": engine_command,
    "router": router_command,
    "activator": activator_command,
}


def select_runner(
    pod: Mapping[str, Any], container: Mapping[str, Any], rules: Sequence[RunnerRule]
) -> str | None:
    """The first rule that matches the container decides; None: the bridge cannot run it."""
    for rule in rules:
        if rule.matches(pod, container):
            return rule.runner
    return None
