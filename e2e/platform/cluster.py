"""A local Kubernetes control plane with fake GPU nodes, for tests and the demo.

The cluster is started by ``kwokctl`` with its *binary* runtime from the binaries that
``e2e/platform/toolchain.sh`` builds: a real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, plus the kwok controller, which plays kubelet for fake nodes. Every
component listens on 127.0.0.1 only. The cluster is meant to run inside the private
network namespace of ``e2e/platform/netns.sh``, where the pod CIDR (10.244.0.0/16) is routed to
``lo``: pod IPs handed out by kwok are then real local addresses that a test (or the
process bridge) can bind and connect to, and nothing can leave the machine.

Nodes (see :func:`default_nodes`): GPU nodes with ``nvidia.com/gpu`` and ``rdma/ib``
capacity, GPU feature-discovery labels and the ``nvidia.com/gpu:NoSchedule`` taint,
half of them H100 and half H200, plus one untainted CPU node.

Pod lifecycle: kwok makes ordinary pods Running and Ready at once. Pods carrying the
bridge label (``pdfleet.dev/managed-by-bridge``, configurable, see
:class:`ClusterConfig`) only get an IP from kwok; a process bridge owns the rest (see
``e2e/platform/kwok/bridge-stages.yaml`` and docs/testinfra.md).

Command line (run it inside ``e2e/platform/netns.sh``; the cluster lives as long as the
command that opened the namespace, e.g. ``e2e/platform/netns.sh bash``)::

    python -m e2e.platform.cluster up          # start (or reuse) the cluster; prints its kubeconfig
    python -m e2e.platform.cluster kubeconfig  # print the kubeconfig path
    python -m e2e.platform.cluster down        # stop it and delete its state
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ipaddress
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN_SCRIPT = REPO_ROOT / "e2e" / "platform" / "toolchain.sh"
KWOK_DIR = Path(__file__).resolve().parent / "kwok"

#: Binaries the cluster needs (helm and prometheus are built too but not needed here).
CLUSTER_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
)

POD_CIDR = "10.244.0.0/16"
E2E_MANAGER = "pdfleet-e2e"  # the field manager `Cluster.apply` writes as by default
BRIDGE_LABEL = "pdfleet.dev/managed-by-bridge"
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/ib"
GPU_TAINT: dict[str, str] = {"key": GPU_RESOURCE, "effect": "NoSchedule"}
H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
# What GPU feature discovery reports for nvidia.com/gpu.memory (MiB).
GPU_MEMORY_MIB = {H100: 81559, H200: 143771}

Manifest = dict[str, Any]
T = TypeVar("T")


class ToolchainMissingError(RuntimeError):
    """The locally built Kubernetes binaries are not there."""


class CommandError(subprocess.CalledProcessError):
    """A kubectl/kwokctl call failed; the message carries its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


class NotInPrivateNetnsError(RuntimeError):
    """The cluster was asked to start outside the private network namespace."""


# ---------------------------------------------------------------------------------------
# Configuration (plain data)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """One fake node. ``gpu_product=None`` makes an untainted CPU-only node."""

    name: str
    pod_cidr: str
    internal_ip: str
    gpu_product: str | None = None
    gpus: int = 8
    rdma: int = 8
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110


@dataclass(frozen=True)
class ClusterConfig:
    """Everything that defines one local cluster.

    ``bridge_label``: pods with this label (any non-empty value) are left to a process
    bridge; ``None`` lets kwok run every pod. An e2e run that wants the bridge to own
    all operator-made pods can pass e.g. ``pdfleet.dev/role``.
    """

    name: str = "pdfleet"
    workdir: Path = field(
        default_factory=lambda: (
            Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pdfleet" / "kwok"
        )
    )
    pod_cidr: str = POD_CIDR
    nodes: tuple[NodeSpec, ...] = field(default_factory=lambda: default_nodes(POD_CIDR))
    bridge_label: str | None = BRIDGE_LABEL
    bin_dir: Path | None = None  # default: what e2e/platform/toolchain.sh --print-bin-dir says
    start_timeout_s: float = 120.0
    require_private_netns: bool = True
    # Extra component flags, (component, flag, value), e.g. an audit policy for the API
    # server or client QPS limits for a benchmark-sized cluster.
    extra_args: tuple[tuple[str, str, str], ...] = ()

    @property
    def kubeconfig(self) -> Path:
        """Path of the kubeconfig kwokctl writes (never the user's ~/.kube/config)."""
        return self.workdir / f"{self.name}.kubeconfig"

    @property
    def config_file(self) -> Path:
        """Path of the generated kwokctl configuration."""
        return self.workdir / f"{self.name}.kwokctl.yaml"


def default_nodes(
    pod_cidr: str = POD_CIDR, h100: int = 2, h200: int = 2, cpu: int = 1
) -> tuple[NodeSpec, ...]:
    """``h100`` H100 nodes, ``h200`` H200 nodes and ``cpu`` CPU nodes.

    Node *i* gets the /24 number *i + 1* of ``pod_cidr`` as its podCIDR; the first /24
    is kept for node addresses (``10.244.0.10 + i``) and kwok's fallback pool.
    """
    subnets = list(ipaddress.IPv4Network(pod_cidr).subnets(new_prefix=24))
    base = subnets[0].network_address
    gpus = [("gpu-h100", H100)] * h100 + [("gpu-h200", H200)] * h200
    counters: dict[str, int] = {}
    nodes: list[NodeSpec] = []
    for i, (prefix, product) in enumerate([*gpus, *[("cpu", None)] * cpu]):
        n = counters[prefix] = counters.get(prefix, -1) + 1
        nodes.append(
            NodeSpec(
                name=f"{prefix}-{n}",
                pod_cidr=str(subnets[i + 1]),
                internal_ip=str(base + 10 + i),
                gpu_product=product,
                gpus=8 if product else 0,
                rdma=8 if product else 0,
                # An 8-GPU server next to a plain CPU box.
                cpu="192" if product else "32",
                memory="2Ti" if product else "256Gi",
            )
        )
    return tuple(nodes)


# ---------------------------------------------------------------------------------------
# Pure builders: configuration -> manifests
# ---------------------------------------------------------------------------------------


def node_manifest(node: NodeSpec) -> Manifest:
    """The Node object for ``node``; kwok keeps the status resources given at create."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    resources: dict[str, str] = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": str(node.pods),
        "ephemeral-storage": "1Ti",
    }
    taints: list[dict[str, str]] = []
    if node.gpu_product is not None:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": node.gpu_product,
            "nvidia.com/gpu.count": str(node.gpus),
            "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB.get(node.gpu_product, 0)),
        }
        resources |= {GPU_RESOURCE: str(node.gpus), RDMA_RESOURCE: str(node.rdma)}
        taints.append(dict(GPU_TAINT))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            # kwokctl's kwok controller only manages nodes with this annotation.
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr], "taints": taints},
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "addresses": [
                {"type": "InternalIP", "address": node.internal_ip},
                {"type": "Hostname", "address": node.name},
            ],
        },
    }


def load_stages(path: Path) -> list[Manifest]:
    """All Stage documents of a kwok stage file."""
    docs = yaml.safe_load_all(path.read_text())
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "Stage"]


def _label_requirement(label: str, operator: str) -> dict[str, str]:
    return {"key": f'.metadata.labels["{label}"]', "operator": operator}


def _with_requirement(stage: Manifest, requirement: Mapping[str, str]) -> Manifest:
    out = copy.deepcopy(stage)
    selector = out["spec"].setdefault("selector", {})
    selector.setdefault("matchExpressions", []).append(dict(requirement))
    return out


def _is_pod_stage(stage: Manifest) -> bool:
    return bool(stage["spec"]["resourceRef"]["kind"] == "Pod")


def kwok_stages(
    bridge_label: str | None,
    defaults: Sequence[Manifest],
    bridge: Sequence[Manifest],
) -> list[Manifest]:
    """kwok's default stages, split by ``bridge_label`` when a bridge is configured.

    Without a label the defaults are returned unchanged. With one, kwok's pod stages
    skip labelled pods and the bridge stages apply only to them.
    """
    if bridge_label is None:
        return [copy.deepcopy(s) for s in defaults]
    skip = _label_requirement(bridge_label, "DoesNotExist")
    only = _label_requirement(bridge_label, "Exists")
    kept = [_with_requirement(s, skip) if _is_pod_stage(s) else copy.deepcopy(s) for s in defaults]
    return kept + [_with_requirement(s, only) for s in bridge]


def kwokctl_configuration(
    bin_dir: Path, extra_args: Sequence[tuple[str, str, str]] = ()
) -> Manifest:
    """kwokctl options: local binaries only, loopback only, no default route needed.

    ``extra_args`` adds ``(component, flag, value)`` flags to the named components."""
    patches: dict[str, list[dict[str, str]]] = {
        # The namespace has no default route to derive an address from, and the endpoint
        # reconciler would publish 127.0.0.1, which is invalid.
        "kube-apiserver": [
            {"key": "advertise-address", "value": "127.0.0.1"},
            {"key": "endpoint-reconciler-type", "value": "none"},
        ]
    }
    for component, key, value in extra_args:
        patches.setdefault(component, []).append({"key": key, "value": value})
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",
            "kubeApiserverCertSANs": ["127.0.0.1", "localhost"],
            "etcdBinary": str(bin_dir / "etcd"),
            "etcdctlBinary": str(bin_dir / "etcdctl"),
            "kubeApiserverBinary": str(bin_dir / "kube-apiserver"),
            "kubeControllerManagerBinary": str(bin_dir / "kube-controller-manager"),
            "kubeSchedulerBinary": str(bin_dir / "kube-scheduler"),
            "kubectlBinary": str(bin_dir / "kubectl"),
            "kwokControllerBinary": str(bin_dir / "kwok"),
        },
        "componentsPatches": [{"name": name, "extraArgs": args} for name, args in patches.items()],
    }


def kwok_configuration(pod_cidr: str) -> Manifest:
    """kwok options: fallback pod pool and node IP inside the (local) pod CIDR."""
    first = next(ipaddress.IPv4Network(pod_cidr).subnets(new_prefix=24))
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "cidr": str(first),
            "nodeIP": str(first.network_address + 1),
            # kwok does not default these when a KwokConfiguration is given (v0.8.0):
            # a zero lease parallelism makes the controller exit at start.
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
        },
    }


def cluster_documents(config: ClusterConfig, bin_dir: Path) -> list[Manifest]:
    """The full ``kwokctl -c`` file content for ``config``."""
    stages = kwok_stages(
        config.bridge_label,
        load_stages(KWOK_DIR / "default-stages.yaml"),
        load_stages(KWOK_DIR / "bridge-stages.yaml"),
    )
    return [
        kwokctl_configuration(bin_dir, config.extra_args),
        kwok_configuration(config.pod_cidr),
        *stages,
    ]


# ---------------------------------------------------------------------------------------
# Toolchain and environment checks
# ---------------------------------------------------------------------------------------


def toolchain_bin_dir() -> Path:
    """The bin dir of the pinned toolchain (``PDFLEET_TOOLCHAIN_BIN`` overrides it)."""
    override = os.environ.get("PDFLEET_TOOLCHAIN_BIN")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(TOOLCHAIN_SCRIPT), "--print-bin-dir"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def missing_binaries(bin_dir: Path, names: Iterable[str] = CLUSTER_BINARIES) -> list[str]:
    """Names from ``names`` that are not executable files in ``bin_dir``."""
    return [n for n in names if not os.access(bin_dir / n, os.X_OK)]


def require_toolchain(bin_dir: Path) -> None:
    """Raise :class:`ToolchainMissingError` naming ``make toolchain`` if a binary is absent."""
    missing = missing_binaries(bin_dir)
    if missing:
        raise ToolchainMissingError(
            f"missing {', '.join(missing)} in {bin_dir}; "
            "run `make toolchain` (e2e/platform/toolchain.sh) first"
        )


def in_private_netns() -> bool:
    """True when this process's network namespace has no interface but ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` (IPv4 or IPv6) right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def require_private_netns() -> None:
    """Refuse to run the cluster where pod or node IPs could be routed off the machine."""
    if not in_private_netns():
        raise NotInPrivateNetnsError(
            "the local cluster must run inside the private network namespace: "
            "prefix the command with e2e/platform/netns.sh (e.g. `e2e/platform/netns.sh bash`)"
        )


# ---------------------------------------------------------------------------------------
# Lifecycle (I/O)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """How a component was started: enough to start it again the same way."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]

    @staticmethod
    def of(pid: int) -> Launch:
        """The command line, working directory and environment of running process `pid`."""
        proc = Path(f"/proc/{pid}")
        argv = tuple((proc / "cmdline").read_bytes().decode().split("\0")[:-1])
        pairs = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        env = dict(kv.split("=", 1) for kv in pairs if "=" in kv)
        return Launch(argv, os.readlink(proc / "cwd"), env)


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


class Supervisor:
    """Restarts a cluster's components when they exit, as systemd or kubelet (static pods) do
    on a real control-plane node, with the command line, directory and environment kwokctl
    started them with; output appended to the component's log.

    kube-controller-manager and kube-scheduler exit on purpose when they cannot renew their
    leader lease (an API server outage longer than their renew deadline); kwokctl does not
    restart them. Started by :meth:`Cluster.supervise`, ended by :func:`stop` before kwokctl
    deletes the cluster. A component is restarted at most once per `backoff_s`."""

    def __init__(self, state: Path, backoff_s: float = 1.0) -> None:
        self.state = state
        self.backoff_s = backoff_s
        self.launches: dict[str, Launch] = {}
        self.restarts: Counter[str] = Counter()
        self._children: list[subprocess.Popen[bytes]] = []
        self._held: set[str] = set()
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    def pids(self) -> dict[str, int]:
        """PIDs in kwokctl's pid files (as seen inside the namespace), by component name."""
        pids: dict[str, int] = {}
        for f in sorted((self.state / "pids").glob("*.pid")):
            text = f.read_text().strip()
            if text.isdigit():
                pids[f.stem] = int(text)
        return pids

    def start(self) -> Supervisor:
        for name, pid in self.pids().items():
            self.launches[name] = Launch.of(pid)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop supervising: call it before the components are stopped on purpose."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def reap(self, timeout_s: float = 10.0) -> None:
        """Wait for the components this supervisor started, once they were told to stop."""
        for proc in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s)

    def launch(self, name: str) -> None:
        """Start component `name` again; its new pid goes into kwokctl's pid file, so that
        `kwokctl delete cluster` still ends it."""
        spec = self.launches[name]
        log_dir = self.state / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with (log_dir / f"{name}.log").open("ab") as log:  # the child keeps its own fd
            proc = subprocess.Popen(
                spec.argv, cwd=spec.cwd, env=spec.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        (self.state / "pids" / f"{name}.pid").write_text(str(proc.pid))
        with self._lock:
            self._children.append(proc)
            self._last[name] = time.monotonic()

    def crash(self, components: Sequence[str], down_s: float) -> None:
        """SIGKILL `components`, keep them down for `down_s`, then start them again."""
        pids = self.pids()
        with self._lock:
            self._held.update(components)
        try:
            for name in components:
                os.kill(pids[name], signal.SIGKILL)
            time.sleep(down_s)
            for name in components:
                self.launch(name)
        finally:
            with self._lock:
                self._held.difference_update(components)

    def _loop(self) -> None:
        while not self._stopping.wait(0.5):
            for name, pid in self.pids().items():
                with self._lock:
                    if name in self._held or name not in self.launches:
                        continue
                    waited = time.monotonic() - self._last.get(name, -math.inf)
                    self._children[:] = [p for p in self._children if p.poll() is None]
                if process_alive(pid) or waited < self.backoff_s or self._stopping.is_set():
                    continue
                print(f"supervisor: {name} (pid {pid}) exited; starting it again", flush=True)
                self.restarts[name] += 1
                self.launch(name)


#: One supervisor per cluster state directory, from the first Cluster.supervise to stop().
_SUPERVISORS: dict[Path, Supervisor] = {}
_SUPERVISORS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Cluster:
    """A running local cluster."""

    config: ClusterConfig
    bin_dir: Path

    @property
    def kubeconfig(self) -> Path:
        """Kubeconfig with admin client certificates at absolute paths."""
        return self.config.kubeconfig

    def env(self) -> dict[str, str]:
        """Environment for kwokctl/kubectl: our binaries first on PATH, our workdir."""
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["KWOK_WORKDIR"] = str(self.config.workdir)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def _kubectl_argv(self, *args: str) -> list[str]:
        return [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60.0) -> str:
        """Run the toolchain's kubectl against this cluster and return its stdout."""
        return _run(self._kubectl_argv(*args), env=self.env(), stdin=stdin, timeout=timeout)

    def kwokctl(self, *args: str, timeout: float = 180.0) -> str:
        """Run the toolchain's kwokctl for this cluster and return its stdout."""
        return _run(
            [str(self.bin_dir / "kwokctl"), "--name", self.config.name, *args],
            env=self.env(),
            timeout=timeout,
        )

    def apply(self, manifests: Sequence[Manifest], field_manager: str = E2E_MANAGER) -> None:
        """Server-side apply ``manifests`` as ``field_manager``."""
        self.kubectl("apply", *_server_side(field_manager), stdin=_stream(manifests))

    def server_side_diff(
        self, manifests: Sequence[Manifest], field_manager: str = E2E_MANAGER
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl diff --server-side` of ``manifests`` as ``field_manager`` would apply them
        again, the drift check of a GitOps tool: exit 0 no drift, 1 drift, >1 error."""
        argv = self._kubectl_argv("diff", *_server_side(field_manager))
        return _complete(argv, env=self.env(), stdin=_stream(manifests))

    def create_namespace(self, name: str, timeout_s: float = 120.0) -> str:
        """Create namespace ``name`` and wait for its default ServiceAccount (pods are refused
        until kube-controller-manager has made it); returns ``name``."""
        self.kubectl("create", "namespace", name)
        wait_until(
            lambda: bool(self.kubectl("get", "serviceaccounts", "-n", name, "-o", "name").split()),
            timeout_s,
            f"the default ServiceAccount in {name}",
            interval_s=0.5,
        )
        return name

    def is_running(self) -> bool:
        """True when the API server answers ``/readyz``."""
        if not self.kubeconfig.exists():
            return False
        try:
            self.kubectl("get", "--raw", "/readyz", timeout=10)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return False
        return True

    @property
    def state_dir(self) -> Path:
        """kwokctl's state for this cluster: pid files, logs, certificates."""
        return self.config.workdir / "clusters" / self.config.name

    def supervise(self) -> Supervisor:
        """From now on restart every component that exits (:class:`Supervisor`); idempotent."""
        with _SUPERVISORS_LOCK:
            found = _SUPERVISORS.get(self.state_dir)
            if found is None:
                found = _SUPERVISORS[self.state_dir] = Supervisor(self.state_dir).start()
            return found

    def crash_and_restart(self, components: Sequence[str], down_s: float) -> None:
        """SIGKILL ``components`` (e.g. etcd and kube-apiserver), keep them down for
        ``down_s``, then start them again with their own command lines, as a supervisor
        (systemd, kubelet for static pods) would; etcd's data directory survives. The other
        components stay up and must reconnect; those that exit meanwhile (the
        controller-manager and the scheduler do when they cannot renew their leader lease)
        are started again too, for as long as the cluster runs (:meth:`supervise`)."""
        self.supervise().crash(components, down_s)

    def component_restarts(self) -> dict[str, int]:
        """Components the supervisor started again after they exited by themselves."""
        supervisor = _SUPERVISORS.get(self.state_dir)
        return dict(supervisor.restarts) if supervisor else {}

    def component_pids(self) -> dict[str, int]:
        """PIDs of the running components, as seen inside the namespace (kwokctl pid files)."""
        return Supervisor(self.state_dir).pids()


def _server_side(field_manager: str) -> tuple[str, ...]:
    """kubectl flags for server-side apply (or its dry run) of documents on stdin."""
    return ("--server-side", f"--field-manager={field_manager}", "-f", "-")


def _stream(manifests: Sequence[Manifest]) -> str:
    return yaml.safe_dump_all(list(manifests), sort_keys=False)


def _complete(
    argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        env=dict(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _run(
    argv: Sequence[str], env: Mapping[str, str], stdin: str | None = None, timeout: float = 60.0
) -> str:
    proc = _complete(argv, env, stdin, timeout)
    if proc.returncode != 0:
        raise CommandError(proc.returncode, list(argv), output=proc.stdout, stderr=proc.stderr)
    return proc.stdout


def cluster_for(config: ClusterConfig) -> Cluster:
    """A handle for ``config`` (started or not), after checking the toolchain."""
    bin_dir = config.bin_dir or toolchain_bin_dir()
    require_toolchain(bin_dir)
    return Cluster(config=config, bin_dir=bin_dir)


def start(config: ClusterConfig | None = None) -> Cluster:
    """Start the cluster described by ``config`` and wait until its nodes are Ready.

    Idempotent: an already running cluster of the same name is reused (its nodes are
    re-applied). Raises :class:`ToolchainMissingError` or
    :class:`NotInPrivateNetnsError` before starting anything.
    """
    config = config or ClusterConfig()
    cluster = cluster_for(config)
    if config.require_private_netns:
        require_private_netns()
    config.workdir.mkdir(parents=True, exist_ok=True)
    if not cluster.is_running():
        _create(cluster)
    cluster.apply([node_manifest(n) for n in config.nodes])
    wait_nodes_ready(cluster, [n.name for n in config.nodes], config.start_timeout_s)
    return cluster


def _create(cluster: Cluster) -> None:
    config = cluster.config
    # Leftover state of a cluster whose namespace is gone would block create.
    stop(cluster)
    config.workdir.mkdir(parents=True, exist_ok=True)
    docs = cluster_documents(config, cluster.bin_dir)
    config.config_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    timeout = config.start_timeout_s
    cluster.kwokctl(
        "create",
        "cluster",
        "--runtime=binary",
        f"--config={config.config_file}",
        f"--kubeconfig={config.kubeconfig}",
        f"--wait={int(timeout)}s",
        timeout=timeout + 30,
    )


def wait_until(
    probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.25
) -> T:
    """Poll ``probe`` until it returns something other than None/False; return that.

    Raises TimeoutError naming ``what`` after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def wait_nodes_ready(cluster: Cluster, names: Sequence[str], timeout_s: float) -> None:
    """Block until every node in ``names`` reports Ready=True."""

    def all_ready() -> bool:
        out = cluster.kubectl("get", "nodes", "-o", "json")
        return set(names) <= ready_node_names(json.loads(out))

    wait_until(all_ready, timeout_s, f"nodes {sorted(names)} to be Ready")


def ready_node_names(node_list: Mapping[str, Any]) -> set[str]:
    """Names of the nodes in a NodeList whose Ready condition is True."""
    ready: set[str] = set()
    for node in node_list.get("items", []):
        for cond in node.get("status", {}).get("conditions", []) or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready.add(node["metadata"]["name"])
    return ready


def stop(cluster: Cluster | ClusterConfig | None = None) -> None:
    """Stop the cluster's processes and delete its state (no-op if absent)."""
    if cluster is None or isinstance(cluster, ClusterConfig):
        cluster = cluster_for(cluster or ClusterConfig())
    state = cluster.config.workdir / "clusters" / cluster.config.name
    with _SUPERVISORS_LOCK:
        supervisor = _SUPERVISORS.pop(state, None)
    if supervisor is not None:  # nothing may start a component kwokctl is stopping
        supervisor.stop()
    # kwokctl stops components by the pids in its pid files. Those are only this
    # namespace's processes when the API server answers here; after the namespace
    # that ran the cluster is gone they may name unrelated processes, so then the
    # state is only removed.
    if state.exists() and cluster.is_running():
        cluster.kwokctl("delete", "cluster", f"--kubeconfig={cluster.kubeconfig}")
    if supervisor is not None:
        supervisor.reap()
    shutil.rmtree(state, ignore_errors=True)
    cluster.kubeconfig.unlink(missing_ok=True)
    cluster.config.config_file.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m e2e.platform.cluster up|down|kubeconfig``."""
    parser = argparse.ArgumentParser(prog="python -m e2e.platform.cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "kubeconfig"])
    parser.add_argument("--name", default=ClusterConfig.name)
    parser.add_argument("--workdir", type=Path, default=None, help="kwokctl state directory")
    parser.add_argument(
        "--bridge-label",
        default=BRIDGE_LABEL,
        help="label of pods a process bridge runs; empty: kwok runs every pod",
    )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"name": args.name, "bridge_label": args.bridge_label or None}
    if args.workdir is not None:
        overrides["workdir"] = args.workdir.resolve()
    config = ClusterConfig(**overrides)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            cluster = start(config)
            print(f"cluster {config.name} up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
            print(cluster.kubeconfig)
        elif args.command == "down":
            stop(config)
        else:
            print(config.kubeconfig)
    except (ToolchainMissingError, NotInPrivateNetnsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(exc.cmd)} failed:\n{exc.stderr}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
