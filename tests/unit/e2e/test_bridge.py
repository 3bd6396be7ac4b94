"""The process bridge's pure parts: pod -> command and env, IPs, probes, status patches.

Pods are built the way the operator renders them (``pdfleet.render`` on the minimal sample),
so a renderer change that the bridge cannot run shows up here first.
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from e2e.platform.bridge import commands, containers, environment, pods, probes, settings, worker
from e2e.platform.cluster import REPO_ROOT
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render import render_children
from pdfleet_worker import launcher

POD_IP = "10.244.1.7"
HOST_IP = "10.244.0.10"


def rendered(kind: str, role: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO_ROOT / "crds/samples/minimal.yaml").read_text())
    doc["metadata"]["namespace"] = "ns1"
    isvc = InferenceService.model_validate(doc)
    for m in render_children(isvc, {"prefill": 1, "decode": 1}):
        if m["kind"] == kind and m["metadata"]["labels"]["pdfleet.dev/role"] == role:
            return m
    raise AssertionError(f"no {kind} for {role}")


def pod_of(kind: str, role: str, name: str = "p-0") -> dict[str, Any]:
    template = rendered(kind, role)["spec"]["template"]
    return {
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "uid": "uid-1",
            "resourceVersion": "42",
            "labels": template["metadata"]["labels"],
            "annotations": {"a": "b"},
        },
        "spec": {**template["spec"], "nodeName": "gpu-h100-0", "restartPolicy": "Always"},
        "status": {"phase": "Pending"},
    }


def ctx(tmp: Path = Path("/tmp/pods/ns1_p-0")) -> commands.LaunchContext:
    return commands.LaunchContext(
        pod_ip=POD_IP,
        pod_dir=tmp,
        bin_dir=Path("/venv/bin"),
        kubeconfig=Path("/kwok/kubeconfig"),
        search_path="/usr/bin",
        time_scale=0.1,
        sim_preset="llama-3.1-8b-h100",
    )


# -- IPs and nodes -------------------------------------------------------------------------


def test_allocation_is_top_down_deterministic_and_skips_used() -> None:
    assert pods.allocate_pod_ip("10.244.1.0/24", set()) == "10.244.1.254"
    used = {"10.244.1.254", "10.244.1.253", "10.244.1.1"}
    assert pods.allocate_pod_ip("10.244.1.0/24", used) == "10.244.1.252"
    assert pods.allocate_pod_ip("10.244.1.0/24", used) == "10.244.1.252"
    with pytest.raises(ValueError, match="no free address"):
        pods.allocate_pod_ip("10.244.1.0/30", {"10.244.1.1", "10.244.1.2"})


def test_node_facts() -> None:
    node = {
        "metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "n"},
                {"type": "InternalIP", "address": HOST_IP},
            ]
        },
    }
    assert pods.is_kwok_node(node) and not pods.is_kwok_node({"metadata": {}})
    assert pods.node_pod_cidr(node) == "10.244.1.0/24"
    assert pods.node_pod_cidr({"spec": {"podCIDR": "10.244.2.0/24"}}) == "10.244.2.0/24"
    assert pods.node_pod_cidr({"spec": {}}) is None
    assert pods.node_internal_ip(node) == HOST_IP


# -- environment and commands ----------------------------------------------------------------


def test_worker_env_resolves_downward_api_fields() -> None:
    pod = pod_of("StatefulSet", "prefill")
    env = environment.resolve_env(pod["spec"]["containers"][0], pod, POD_IP, HOST_IP)
    assert env["PDFLEET_POD_IP"] == POD_IP
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == POD_IP
    assert env["POD_NAME"] == "p-0" and env["POD_NAMESPACE"] == "ns1"
    assert env["PDFLEET_ROLE"] == "prefill"


def test_env_sources_expansion_and_lookup() -> None:
    pod = pod_of("StatefulSet", "decode")
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-$(MISSING)-$$(A)"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
            {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "t"}}},
            {
                "name": "LBL",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['pdfleet.dev/role']"}},
            },
            {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a']"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "A", "value": "last wins"},
        ],
    }
    data = {("secret", "s"): {"t": "hf_x"}, ("configmap", "cm"): {"K": "v"}}

    def lookup(kind: str, name: str) -> dict[str, str] | None:
        return data.get((kind, name))

    env = environment.resolve_env(container, pod, POD_IP, HOST_IP, lookup)
    assert env == {
        "CM_K": "v",
        "A": "last wins",
        "B": "x-$(MISSING)-$(A)",
        "TOKEN": "hf_x",
        "LBL": "decode",
        "ANN": "b",
        "HOST": HOST_IP,
    }
    # Without API access, secret references are left out rather than guessed.
    assert "TOKEN" not in environment.resolve_env(container, pod, POD_IP, HOST_IP)


def test_worker_command_runs_the_agent_with_the_simulator_on_the_pod_ip() -> None:
    pod = pod_of("StatefulSet", "decode")
    container = pod["spec"]["containers"][0]
    env = environment.resolve_env(container, pod, POD_IP, HOST_IP)
    cmd = commands.worker_command(container, env, ctx())
    assert cmd.argv == ("pdfleet-agent", "launch")
    assert cmd.env["PDFLEET_ENGINE"] == "sim"
    assert cmd.env["PDFLEET_HOST"] == POD_IP
    assert cmd.env["PDFLEET_SIM_TIME_SCALE"] == "0.1"
    assert cmd.env["PDFLEET_SIM_PRESET"] == "llama-3.1-8b-h100"
    assert cmd.env["PDFLEET_DRAIN_FILE"] == "/tmp/pods/ns1_p-0/pdfleet-draining"
    assert cmd.env["PATH"].startswith("/venv/bin:")
    assert "KUBECONFIG" not in cmd.env
    # What the agent will exec with that env: the simulator bound to the pod IP.
    argv = launcher.build_vllm_command(cmd.env)
    assert argv[0] == "pdfleet-sim"
    assert argv[argv.index("--host") + 1] == POD_IP
    assert argv[argv.index("--time-scale") + 1] == "0.1"
    assert launcher.build_vllm_env(cmd.env)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == POD_IP


def test_worker_command_defaults_to_the_image_entrypoint() -> None:
    cmd = commands.worker_command({"name": "vllm", "args": ["$(X)"]}, {"X": "y"}, ctx())
    assert cmd.argv == ("pdfleet-agent", "launch", "y")


def test_the_real_engine_runs_the_pods_own_command_and_env_in_the_engines_python() -> None:
    pod = pod_of("StatefulSet", "decode")
    container = {**pod["spec"]["containers"][0], "image": "ghcr.io/pdfleet/pdfleet-worker-cpu:0.32"}
    assert commands.select_runner(pod, container, settings.DEFAULT_RULES) == "engine"
    env = environment.resolve_env(container, pod, POD_IP, HOST_IP)
    cmd = commands.engine_command(container, env, replace(ctx(), engine_root=Path("/cache/engine")))
    assert cmd.argv == (*commands.ENGINE_NICE, "pdfleet-agent", "launch")
    assert cmd.env["PDFLEET_ENGINE"] == "vllm"
    assert cmd.env["PDFLEET_HOST"] == POD_IP
    assert cmd.env["VLLM_TARGET_DEVICE"] == "cpu"
    # The image's agent first, then the engine's venv (vllm), then the machine's PATH.
    assert cmd.env["PATH"].split(":")[:3] == [
        str(commands.ENGINE_SHIM_DIR),
        "/cache/engine/venv/bin",
        "/usr/bin",
    ]
    # Everything the operator rendered reaches the engine unchanged.
    assert {
        k: v for k, v in env.items() if k.startswith("PDFLEET_") and k != "PDFLEET_HOST"
    }.items() <= cmd.env.items()


def test_the_real_engine_paths_point_into_this_checkout() -> None:
    assert (commands.ENGINE_SHIM_DIR / "pdfleet-agent").is_file()
    sources = [Path(folder) for folder in commands.WORKER_SOURCES]
    assert any((src / "pdfleet_worker" / "agent.py").is_file() for src in sources)


def test_every_project_package_the_worker_imports_is_on_the_engines_path() -> None:
    """The engine's Python has only vLLM's packages and these sources, as the worker image:
    a worker module importing a project package left off the path fails only in a pod."""
    sources = [Path(folder) for folder in commands.WORKER_SOURCES]
    worker = next(src for src in sources if (src / "pdfleet_worker").is_dir())
    imported: set[str] = set()
    for module in (worker / "pdfleet_worker").rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    ours = {name for name in imported if name.startswith("pdfleet")}
    assert "pdfleet_wire" in ours
    missing = [name for name in ours if not any((src / name).is_dir() for src in sources)]
    assert not missing, missing


def test_the_real_engine_without_its_install_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"e2e/platform/engine\.sh"):
        commands.engine_command({"name": "vllm", "image": "x/pdfleet-worker-cpu:1"}, {}, ctx())


def test_router_command_binds_the_pod_ip_and_uses_the_cluster_kubeconfig() -> None:
    pod = pod_of("Deployment", "router")
    container = pod["spec"]["containers"][0]
    cmd = commands.router_command(container, {}, ctx())
    assert cmd.argv[0] == "vllm-router"
    args = list(cmd.argv[1:])
    assert args[args.index("--host") + 1] == POD_IP
    assert args[args.index("--prometheus-host") + 1] == POD_IP
    assert "0.0.0.0" not in args
    assert args[args.index("--service-discovery-namespace") + 1] == "ns1"
    assert cmd.env["KUBECONFIG"] == "/kwok/kubeconfig"
    assert commands.router_command({"args": ["--port", "1"]}, {}, ctx()).argv == (
        "vllm-router",
        "--port",
        "1",
    )


@pytest.mark.parametrize(
    ("args", "out"),
    [
        (["--host", "0.0.0.0", "--port", "8000"], ["--host", POD_IP, "--port", "8000"]),
        (["--host=0.0.0.0"], [f"--host={POD_IP}"]),
        (["--prometheus-host", "::"], ["--prometheus-host", POD_IP]),
        (["--host", "127.0.0.1"], ["--host", "127.0.0.1"]),
        (["--port", "0.0.0.0"], ["--port", "0.0.0.0"]),
        (["--host"], ["--host"]),
    ],
)
def test_rewrite_bind_args(args: list[str], out: list[str]) -> None:
    assert commands.rewrite_bind_args(args, POD_IP) == out


def test_runner_selection_by_role_then_image() -> None:
    worker = pod_of("StatefulSet", "prefill")
    router = pod_of("Deployment", "router")
    other = {"metadata": {"labels": {"pdfleet.dev/role": "metrics"}}}
    c = worker["spec"]["containers"][0]
    assert commands.select_runner(worker, c, settings.DEFAULT_RULES) == "worker"
    assert (
        commands.select_runner(router, router["spec"]["containers"][0], settings.DEFAULT_RULES)
        == "router"
    )
    assert commands.select_runner(other, {"image": "x"}, settings.DEFAULT_RULES) is None
    rules = (settings.RunnerRule("router", image="*/vllm-router:*"), *settings.DEFAULT_RULES)
    assert commands.select_runner(other, {"image": "ghcr.io/x/vllm-router:0.1"}, rules) == "router"


# -- probes --------------------------------------------------------------------------------


def test_rendered_worker_probes() -> None:
    c = pod_of("StatefulSet", "prefill")["spec"]["containers"][0]
    startup = probes.parse_probe(c["startupProbe"], c)
    assert startup == probes.Probe(
        "http", port=8000, path="/health", period_s=10, failure_threshold=180
    )
    ready = probes.parse_probe(c["readinessProbe"], c, period_max_s=2.0)
    assert ready is not None and ready.kind == "exec"
    assert ready.command == ("pdfleet-agent", "ready")
    assert (ready.period_s, ready.timeout_s, ready.failure_threshold) == (2.0, 3.0, 2)
    assert probes.parse_probe(None, c) is None
    assert probes.parse_probe({"tcpSocket": {"port": "nixl-0"}}, c) == probes.Probe(
        "tcp", port=5600
    )
    with pytest.raises(ValueError, match="no port named"):
        probes.parse_probe({"httpGet": {"port": "nope"}}, c)


def test_probe_tracker_thresholds() -> None:
    t = probes.ProbeTracker(
        probes.Probe("http", period_s=5, success_threshold=1, failure_threshold=2)
    )
    t.start(100.0)
    assert t.due(100.0) and not t.ok
    assert t.observe(True, 100.0) and t.ok and not t.due(104.0) and t.due(105.0)
    assert not t.observe(False, 105.0) and t.ok  # one failure is not enough
    assert not t.observe(True, 110.0) and t.ok  # and a success resets the streak
    assert not t.observe(False, 115.0)
    assert t.observe(False, 120.0) and not t.ok
    assert t.failures == 2
    t.start(200.0, ok=True)  # liveness starts healthy
    assert t.ok and t.failures == 0
    # A startup probe counts failures while it has never passed (kubelet then restarts).
    s = probes.ProbeTracker(probes.Probe("http", failure_threshold=3))
    s.start(0.0)
    for i in range(3):
        assert not s.observe(False, float(i)) and not s.ok
    assert s.failures == 3


# -- status ----------------------------------------------------------------------------------


def test_status_patch_running_and_ready() -> None:
    pod = pod_of("StatefulSet", "prefill")
    view = pods.ContainerView(
        name="vllm",
        image="img",
        state="running",
        reason="",
        started_at=0.0,
        ready=True,
        started=True,
        container_id="bridge://7",
    )
    patch = pods.status_patch(pod, POD_IP, HOST_IP, [view], now=60.0)
    assert patch["metadata"] == {"uid": "uid-1"}
    st = patch["status"]
    assert st["phase"] == "Running"
    assert st["podIP"] == POD_IP and st["podIPs"] == [{"ip": POD_IP}]
    assert st["hostIP"] == HOST_IP
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds == {
        "PodScheduled": "True",
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    (cs,) = st["containerStatuses"]
    assert cs["state"] == {"running": {"startedAt": "1970-01-01T00:00:00Z"}}
    assert (cs["ready"], cs["started"], cs["restartCount"]) == (True, True, 0)


def test_condition_transition_time_moves_only_on_change() -> None:
    before = [{"type": "Ready", "status": "True", "lastTransitionTime": "T0"}]
    same = {c["type"]: c for c in pods.pod_conditions(before, True, 100.0)}
    assert same["Ready"]["lastTransitionTime"] == "T0"
    flipped = {c["type"]: c for c in pods.pod_conditions(before, False, 100.0)}
    assert flipped["Ready"]["lastTransitionTime"] == "1970-01-01T00:01:40Z"
    assert flipped["Ready"]["reason"] == "ContainersNotReady"


def test_status_after_a_crash_and_when_terminal() -> None:
    pod = pod_of("StatefulSet", "decode")
    crashed = pods.ContainerView(
        name="vllm", image="i", reason="CrashLoopBackOff", restart_count=1, last_exit=(1, 0, 5)
    )
    st = pods.status_patch(pod, POD_IP, "", [crashed], now=6.0)["status"]
    assert st["phase"] == "Running" and "hostIP" not in st
    (cs,) = st["containerStatuses"]
    assert cs["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    done = pods.ContainerView(
        name="vllm", image="i", state="terminated", reason="Completed", exit_code=0
    )
    st = pods.status_patch(pod, POD_IP, HOST_IP, [done], now=7.0, terminal="Succeeded")["status"]
    assert st["phase"] == "Succeeded"
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "False"


def test_ip_patch_is_conditional() -> None:
    patch = pods.ip_patch(pod_of("StatefulSet", "decode"), POD_IP, HOST_IP)
    assert patch["metadata"] == {"uid": "uid-1", "resourceVersion": "42"}
    assert patch["status"]["podIP"] == POD_IP and patch["status"]["hostIP"] == HOST_IP


@pytest.mark.parametrize(
    ("policy", "code", "action"),
    [
        ("Always", 0, "restart"),
        ("Always", 1, "restart"),
        ("OnFailure", 1, "restart"),
        ("OnFailure", 0, "Succeeded"),
        ("Never", 0, "Succeeded"),
        ("Never", 137, "Failed"),
    ],
)
def test_exit_action(policy: str, code: int, action: str) -> None:
    assert pods.exit_action(policy, code) == action


def test_exit_codes_as_kubelet_reports_them() -> None:
    assert [pods.exit_code(rc) for rc in (0, 1, -9, -15)] == [0, 1, 137, 143]


def test_restart_backoff_and_grace_deadline() -> None:
    assert [pods.restart_delay(n, 1.0, 30.0) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    pod = {"metadata": {"deletionTimestamp": "2026-01-01T00:05:40Z"}}
    assert pods.grace_deadline(pod, now=0.0) == pods.parse_time("2026-01-01T00:05:40Z")
    assert pods.grace_deadline({"metadata": {}}, now=12.0) == 12.0
    assert pods.rfc3339(pods.parse_time("2026-01-01T00:05:40Z") or 0) == "2026-01-01T00:05:40Z"


# -- supervising a container -----------------------------------------------------------------

#: A process that outlives SIGTERM, as an engine draining a long request does.
DRAINING = (sys.executable, "-c", "import signal, time; signal.signal(15, lambda *a: None); "
            "print('draining', flush=True); time.sleep(60)")  # fmt: skip


def supervised(tmp_path: Path, grace_s: int) -> tuple[worker.PodWorker, containers.ContainerRun]:
    """A pod worker with one started container whose liveness probe always fails (nothing
    listens on its port), probed at every look."""
    config = settings.BridgeSettings(kubeconfig=tmp_path / "kubeconfig", log_dir=tmp_path)
    pod = {"metadata": {"name": "p-0", "namespace": "ns1", "uid": "uid-1"},
           "spec": {"terminationGracePeriodSeconds": grace_s}}  # fmt: skip
    w = worker.PodWorker(SimpleNamespace(settings=config), pod)  # type: ignore[arg-type]
    w.pod_ip = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    dead = probes.Probe("tcp", port=closed_port, period_s=0.0, failure_threshold=1)
    c = containers.ContainerRun(
        spec={"name": "vllm"},
        command=commands.LocalCommand(argv=DRAINING, env={"PATH": "/usr/bin:/bin"}),
        log_path=tmp_path / "vllm.log",
        events_path=tmp_path / "vllm.events",
        startup=None,
        readiness=None,
        liveness=probes.ProbeTracker(dead),
        view=pods.ContainerView(name="vllm", image="x"),
    )
    c.start(tmp_path)
    w.containers.append(c)
    deadline = time.time() + 30
    while "draining" not in c.log_path.read_text().splitlines() and time.time() < deadline:
        time.sleep(0.02)  # its SIGTERM handler is in place
    return w, c


def look_until_restart(w: worker.PodWorker, c: containers.ContainerRun) -> float:
    """Supervise until the container exits and is scheduled to restart; seconds taken."""
    t0 = time.time()
    while c.restart_at is None and time.time() - t0 < 30:
        w._check_container(c, "Always", time.time())
        time.sleep(0.05)
    return time.time() - t0


def test_a_failing_liveness_probe_restarts_the_container(tmp_path: Path) -> None:
    w, c = supervised(tmp_path, grace_s=1)
    look_until_restart(w, c)
    events = c.events_path.read_text()
    assert "liveness probe failed" in events and "grace period over: SIGKILL" in events, events
    assert c.view.last_exit is not None and c.view.last_exit[0] == 137


def test_a_container_being_stopped_gets_no_liveness_probe(tmp_path: Path) -> None:
    """Its drain runs to the pod's grace period however its probes fare."""
    w, c = supervised(tmp_path, grace_s=2)
    w.stop_main_container()
    took = look_until_restart(w, c)
    events = c.events_path.read_text()
    assert "liveness probe failed" not in events, events
    assert "grace period over: SIGKILL" in events and took >= 1.9, (took, events)
    assert c.view.restart_count == 1 and c.view.last_exit is not None
    assert c.view.last_exit[0] == 137


# -- the command line ------------------------------------------------------------------------


def test_the_command_line_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "e2e.platform.bridge", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--kubeconfig" in proc.stdout and "IMAGE_GLOB=RUNNER" in proc.stdout
