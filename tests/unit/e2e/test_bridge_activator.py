"""The process bridge's activator runner: ``--listen`` on the pod IP, ``--upstream`` from the
router's Service to one of its endpoints (no cluster DNS, no kube-proxy), and a container
whose Service has no endpoint yet waiting (CreateContainerConfigError) to be tried again.

The pod is the one the operator renders for a service that scales to zero, so a renderer
change that the bridge cannot run shows up here first.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from e2e.platform.bridge import commands, pods, settings
from e2e.platform.bridge.bridge import Bridge
from e2e.platform.bridge.containers import ContainerRun
from e2e.platform.bridge.worker import PodWorker
from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.cli import build_parser
from pdfleet.render import RenderConfig, render_children
from tests.spec_cases import merge_patch, sample

POD_IP = "10.244.1.7"
ROUTER_IP = "10.244.2.3"
SLEEPY = {
    "metadata": {"namespace": "ns1"},
    "spec": {"autoscaling": {"scaleToZero": {"idleAfter": "30m", "maxWait": "90s"}}},
}


def rendered_sleepy() -> list[dict[str, Any]]:
    isvc = InferenceService.model_validate(merge_patch(sample("production"), SLEEPY))
    config = RenderConfig(activator_image="registry.example/pdfleet/operator:1.2.3")
    return render_children(isvc, {"prefill": 1, "decode": 1}, config)


def child(kind: str, role: str) -> dict[str, Any]:
    for m in rendered_sleepy():
        if m["kind"] == kind and m["metadata"]["labels"][labels.ROLE] == role:
            return m
    raise AssertionError(f"no {kind} for {role}")


def activator_pod() -> dict[str, Any]:
    template = child("Deployment", labels.ROLE_ACTIVATOR)["spec"]["template"]
    return {
        "metadata": {
            "name": "a-0",
            "namespace": "ns1",
            "uid": "uid-a",
            "labels": template["metadata"]["labels"],
        },
        "spec": {**template["spec"], "nodeName": "cpu-0", "restartPolicy": "Always"},
        "status": {"phase": "Pending"},
    }


class FakeResolver:
    """Service -> endpoint, recording the lookups; unknown Services have none."""

    def __init__(self, endpoints: dict[tuple[str, str, int], tuple[str, int]]) -> None:
        self.endpoints = endpoints
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, namespace: str, name: str, port: int) -> tuple[str, int] | None:
        self.calls.append((namespace, name, port))
        return self.endpoints.get((namespace, name, port))


def ctx(resolver: commands.ServiceResolver | None = None) -> commands.LaunchContext:
    return commands.LaunchContext(
        pod_ip=POD_IP,
        pod_dir=Path("/tmp/pods/ns1_a-0"),
        bin_dir=Path("/venv/bin"),
        kubeconfig=Path("/kwok/kubeconfig"),
        search_path="/usr/bin",
        namespace="ns1",
        resolve_service=resolver,
    )


def no_lookup(namespace: str, name: str, port: int) -> tuple[str, int] | None:
    raise AssertionError(f"looked up {namespace}/{name}:{port}")


# -- the rendered pod -------------------------------------------------------------------------


def test_the_activator_pod_is_run_by_the_activator_runner() -> None:
    pod = activator_pod()
    (container,) = pod["spec"]["containers"]
    assert commands.select_runner(pod, container, settings.DEFAULT_RULES) == "activator"
    # Other roles keep their runners: the activator's rule matches its role only.
    router = child("Deployment", labels.ROLE_ROUTER)["spec"]["template"]
    router_pod = {"metadata": {"labels": router["metadata"]["labels"]}}
    assert (
        commands.select_runner(router_pod, router["spec"]["containers"][0], settings.DEFAULT_RULES)
        == "router"
    )


def test_the_activator_listens_on_the_pod_ip_and_forwards_to_a_router_endpoint() -> None:
    pod = activator_pod()
    (container,) = pod["spec"]["containers"]
    resolver = FakeResolver({("ns1", "llama-70b-router", 8000): (ROUTER_IP, 8000)})
    cmd = commands.activator_command(container, {}, ctx(resolver))
    assert cmd.argv[0] == "pdfleet"
    assert cmd.env["PATH"].startswith("/venv/bin:")
    assert "KUBECONFIG" not in cmd.env  # it holds no credentials, here either
    # What `pdfleet activator` makes of it: the same parser as in the pod.
    parsed = build_parser().parse_args(list(cmd.argv[1:]))
    assert parsed.listen == (POD_IP, 8000)
    assert parsed.upstream == f"http://{ROUTER_IP}:8000"
    assert parsed.service == ("ns1", "llama-70b")
    assert resolver.calls == [("ns1", "llama-70b-router", 8000)]


def test_the_router_service_resolves_to_the_router_pods_port() -> None:
    """The rendered router Service, with the EndpointSlice kube-controller-manager writes for
    its not-ready pod: the activator's upstream port is the router container's."""
    service = child("Service", labels.ROLE_ROUTER)
    router = child("Deployment", labels.ROLE_ROUTER)["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in router["containers"][0]["ports"]}
    endpoint_slice = {
        "addressType": "IPv4",
        "ports": [{"name": name, "port": port, "protocol": "TCP"} for name, port in ports.items()],
        "endpoints": [{"addresses": [ROUTER_IP], "conditions": {"ready": False}}],
    }
    found = commands.service_endpoint("ns1", "llama-70b-router", service, [endpoint_slice], 8000)
    assert found == (ROUTER_IP, ports["http"])


def test_the_venv_has_the_pdfleet_command() -> None:
    assert (settings.VENV_BIN / "pdfleet").is_file()


# -- --listen ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "out"),
    [
        (["--listen", "0.0.0.0:8000"], ["--listen", f"{POD_IP}:8000"]),
        (
            ["--listen=0.0.0.0:8000", "--max-wait", "9"],
            [f"--listen={POD_IP}:8000", "--max-wait", "9"],
        ),
        (["--listen", "[::]:8000"], ["--listen", f"{POD_IP}:8000"]),
        (["--listen", ":8000"], ["--listen", f"{POD_IP}:8000"]),
        (["--listen", "127.0.0.1:8000"], ["--listen", "127.0.0.1:8000"]),
        (["--listen=10.0.0.1:80"], ["--listen=10.0.0.1:80"]),
        (["--max-wait", "0.0.0.0:8000"], ["--max-wait", "0.0.0.0:8000"]),
        (["--listen"], ["--listen"]),
    ],
)
def test_rewrite_listen_args(args: list[str], out: list[str]) -> None:
    assert commands.rewrite_listen_args(args, POD_IP) == out


def test_an_ipv6_pod_ip_is_bracketed() -> None:
    assert commands.rewrite_listen_args(["--listen=0.0.0.0:80"], "fd00::7") == [
        "--listen=[fd00::7]:80"
    ]


# -- --upstream -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "service", "out"),
    [
        ("http://r.ns2.svc:8000", ("ns2", "r", 8000), f"http://{ROUTER_IP}:8001"),
        ("http://r.ns2.svc.cluster.local:8000", ("ns2", "r", 8000), f"http://{ROUTER_IP}:8001"),
        ("http://r.ns2.svc.cluster.local.:8000", ("ns2", "r", 8000), f"http://{ROUTER_IP}:8001"),
        ("http://r.ns2:8000", ("ns2", "r", 8000), f"http://{ROUTER_IP}:8001"),
        ("http://r:8000", ("ns1", "r", 8000), f"http://{ROUTER_IP}:8001"),  # the pod's namespace
        ("http://R.NS2.svc:8000/v1/", ("ns2", "r", 8000), f"http://{ROUTER_IP}:8001/v1/"),
        ("http://r.ns2.svc", ("ns2", "r", 80), f"http://{ROUTER_IP}:8001"),
        ("https://r.ns2.svc", ("ns2", "r", 443), f"https://{ROUTER_IP}:8001"),
        ("http://r.svc:8000", ("svc", "r", 8000), f"http://{ROUTER_IP}:8001"),  # namespace svc
    ],
)
def test_an_upstream_service_becomes_one_of_its_endpoints(
    url: str, service: tuple[str, str, int], out: str
) -> None:
    resolver = FakeResolver({service: (ROUTER_IP, 8001)})
    args = commands.activator_command(
        {"args": ["activator", "--upstream", url]}, {}, ctx(resolver)
    ).argv
    assert args == ("pdfleet", "activator", "--upstream", out)
    assert resolver.calls == [service]
    spelled = commands.activator_command({"args": [f"--upstream={url}"]}, {}, ctx(resolver)).argv
    assert spelled == ("pdfleet", f"--upstream={out}")


def test_an_ipv6_endpoint_is_bracketed() -> None:
    resolver = FakeResolver({("ns1", "r", 8000): ("fd00::3", 8000)})
    assert commands.resolve_upstream("http://r:8000", ctx(resolver)) == "http://[fd00::3]:8000"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://10.244.2.3:8000/v1",
        "http://[::1]:8000",
        "http://localhost:8000",
        "http://router.example.com:8000",
        "http://r.ns2.pod.cluster.local:8000",
        "http://r_x.ns2.svc:8000",
        "http://r.ns2.svc:notaport",
        "not a url",
    ],
)
def test_other_upstreams_are_left_alone(url: str) -> None:
    assert commands.resolve_upstream(url, ctx(no_lookup)) == url
    cmd = commands.activator_command({"args": ["--upstream", url]}, {}, ctx(no_lookup))
    assert cmd.argv == ("pdfleet", "--upstream", url)


def test_an_upstream_with_no_endpoint_is_a_clear_start_error() -> None:
    with pytest.raises(commands.StartError, match=r"--upstream http://r\.ns2\.svc:8000: .*ns2/r"):
        commands.resolve_upstream("http://r.ns2.svc:8000", ctx(FakeResolver({})))

    def reasoned(namespace: str, name: str, port: int) -> tuple[str, int] | None:
        raise commands.StartError(f"Service {namespace}/{name} not found after 60s")

    with pytest.raises(commands.StartError) as err:
        commands.activator_command({"args": ["--upstream", "http://r:8000"]}, {}, ctx(reasoned))
    assert str(err.value) == "--upstream http://r:8000: Service ns1/r not found after 60s"
    with pytest.raises(commands.StartError, match="no way to resolve Service ns1/r"):
        commands.resolve_upstream("http://r:8000", ctx(None))


@pytest.mark.parametrize(
    ("host", "ref"),
    [
        ("r.ns2.svc.cluster.local", ("ns2", "r")),
        ("r.ns2.svc", ("ns2", "r")),
        ("r.ns2", ("ns2", "r")),
        ("r", ("ns1", "r")),
        ("r.svc", ("svc", "r")),
        ("10.0.0.1", None),
        ("::1", None),
        ("localhost", None),
        ("a.b.c", None),
        ("-r.ns2", None),
        ("", None),
    ],
)
def test_service_of_host(host: str, ref: tuple[str, str] | None) -> None:
    assert commands.service_of_host(host, "ns1") == ref


# -- choosing an endpoint ---------------------------------------------------------------------

SERVICE = {"spec": {"ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}}


def endpoint(address: str, **conditions: bool) -> dict[str, Any]:
    return {"addresses": [address], "conditions": conditions}


def slice_of(*endpoints: dict[str, Any], port: int = 8001, name: str = "http") -> dict[str, Any]:
    return {
        "addressType": "IPv4",
        "ports": [{"name": name, "port": port, "protocol": "TCP"}],
        "endpoints": list(endpoints),
    }


def test_a_ready_endpoint_first_then_a_not_ready_one_then_a_terminating_one() -> None:
    def pick(*slices: dict[str, Any]) -> tuple[str, int]:
        return commands.service_endpoint("ns1", "r", SERVICE, list(slices), 8000)

    ready, not_ready = endpoint("10.0.0.9", ready=True), endpoint("10.0.0.1", ready=False)
    leaving = endpoint("10.0.0.0", ready=False, terminating=True)
    assert pick(slice_of(not_ready, leaving), slice_of(ready)) == ("10.0.0.9", 8001)
    assert pick(slice_of(leaving, not_ready)) == ("10.0.0.1", 8001)
    assert pick(slice_of(leaving)) == ("10.0.0.0", 8001)
    assert pick(slice_of({"addresses": ["10.0.0.5"]})) == ("10.0.0.5", 8001)  # unset: ready
    # Ties go to the lowest address, whatever the listing order.
    assert pick(slice_of(endpoint("10.0.0.4"), endpoint("10.0.0.2"))) == ("10.0.0.2", 8001)


def test_the_endpoint_port_is_the_service_ports_target() -> None:
    metrics = {"name": "metrics", "port": 29000, "targetPort": 29001}
    service = {"spec": {"ports": [*SERVICE["spec"]["ports"], metrics]}}
    both = {
        **slice_of(endpoint("10.0.0.1")),
        "ports": [{"name": "http", "port": 8001}, {"name": "metrics", "port": 29001}],
    }
    assert commands.service_endpoint("ns1", "r", service, [both], 8000) == ("10.0.0.1", 8001)
    assert commands.service_endpoint("ns1", "r", service, [both], 29000) == ("10.0.0.1", 29001)
    # A slice of pods without that port name does not serve it, unless the target is a number.
    other = slice_of(endpoint("10.0.0.2"), name="grpc")
    assert commands.service_endpoint("ns1", "r", service, [other], 29000) == ("10.0.0.2", 29001)
    with pytest.raises(commands.StartError, match="no endpoint with an address"):
        commands.service_endpoint("ns1", "r", service, [other], 8000)


def test_no_endpoint_is_a_start_error_with_the_reason() -> None:
    with pytest.raises(commands.StartError, match="Service ns1/r not found"):
        commands.service_endpoint("ns1", "r", None, [], 8000)
    with pytest.raises(commands.StartError, match=r"has no port 9000 \(its ports: 8000\)"):
        commands.service_endpoint("ns1", "r", SERVICE, [slice_of(endpoint("10.0.0.1"))], 9000)
    no_address = slice_of({"addresses": [], "conditions": {}})
    fqdn = {**slice_of(endpoint("router.example.com")), "addressType": "FQDN"}
    for slices in ([], [slice_of()], [no_address], [fqdn]):
        with pytest.raises(commands.StartError, match="ns1/r has no endpoint with an address yet"):
            commands.service_endpoint("ns1", "r", SERVICE, slices, 8000)


# -- the bridge's lookup ----------------------------------------------------------------------


class FakeApi:
    """The two reads ``Bridge.resolve_service`` makes, as ``_preload_content=False`` answers."""

    def __init__(self, service: dict[str, Any] | None, slices: list[list[dict[str, Any]]]) -> None:
        self.service = service
        self.slices = slices  # one listing per call; the last one repeats
        self.selectors: list[str] = []

    def read_namespaced_service(self, name: str, namespace: str, **_: Any) -> Any:
        if self.service is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.service).encode())

    def list_namespaced_endpoint_slice(self, namespace: str, label_selector: str, **_: Any) -> Any:
        self.selectors.append(label_selector)
        items = self.slices.pop(0) if len(self.slices) > 1 else self.slices[0]
        return SimpleNamespace(data=json.dumps({"items": items}).encode())


def bridge_with(api: FakeApi, tmp_path: Path) -> Bridge:
    bridge = Bridge(settings.BridgeSettings(kubeconfig=tmp_path / "kc", log_dir=tmp_path), object())
    fake: Any = api  # stands in for CoreV1Api and DiscoveryV1Api
    bridge.core = fake
    bridge.discovery = fake
    return bridge


def test_the_bridge_waits_for_the_router_pod_to_have_an_address(tmp_path: Path) -> None:
    api = FakeApi(SERVICE, [[], [slice_of()], [slice_of(endpoint(ROUTER_IP, ready=False))]])
    bridge = bridge_with(api, tmp_path)
    assert bridge.resolve_service("ns1", "r", 8000, wait_s=10) == (ROUTER_IP, 8001)
    assert api.selectors == ["kubernetes.io/service-name=r"] * 3


def test_the_bridge_gives_up_after_its_wait_with_the_reason(tmp_path: Path) -> None:
    bridge = bridge_with(FakeApi(None, [[]]), tmp_path)
    t0 = time.monotonic()
    with pytest.raises(commands.StartError, match=r"^Service ns1/r not found after 0\.6s$"):
        bridge.resolve_service("ns1", "r", 8000, wait_s=0.6)
    assert 0.5 < time.monotonic() - t0 < 5
    bridge = bridge_with(FakeApi(SERVICE, [[]]), tmp_path)
    with pytest.raises(commands.StartError, match=r"no endpoint with an address yet .*going away"):
        bridge.resolve_service("ns1", "r", 8000, wait_s=60, abandoned=lambda: True)


# -- the pod worker: a container that cannot start yet ---------------------------------------


def test_a_start_error_leaves_the_container_waiting_then_it_is_tried_again(tmp_path: Path) -> None:
    bridge_settings = settings.BridgeSettings(
        kubeconfig=tmp_path / "kc", log_dir=tmp_path, restart_backoff_s=0.0
    )
    fake_bridge: Any = SimpleNamespace(settings=bridge_settings)
    worker = PodWorker(fake_bridge, activator_pod())
    worker.pod_dir.mkdir(parents=True)
    run = ContainerRun(
        spec={"name": "activator"},
        command=commands.LocalCommand((), {}),
        log_path=worker.pod_dir / "activator.log",
        events_path=worker.pod_dir / "activator.events.log",
        startup=None,
        readiness=None,
        liveness=None,
        view=pods.ContainerView(name="activator", image="img"),
    )
    worker.containers.append(run)
    outcomes: list[commands.StartError | None] = [commands.StartError("Service ns1/r not found")]
    sleeper = commands.LocalCommand(
        (sys.executable, "-c", "import time; time.sleep(60)"), {"PATH": "/usr/bin"}
    )

    def build() -> commands.LocalCommand:
        if outcomes:
            error = outcomes.pop()
            if error is not None:
                raise error
        return sleeper

    worker._commands["activator"] = build
    assert not worker._create(run)
    assert run.popen is None and run.restart_at is not None
    status = pods.container_status(run.view)
    assert status["state"] == {
        "waiting": {"reason": "CreateContainerConfigError", "message": "Service ns1/r not found"}
    }
    assert pods.pod_phase([run.view], None) == "Pending"
    try:
        worker._check_container(run, "Always", time.time() + 1)
        assert run.running() and run.view.state == "running" and run.view.message == ""
        assert run.view.restart_count == 0  # it never ran before: not a restart
        events = run.events_path.read_text()
        assert "cannot start: Service ns1/r not found; trying again in 0s" in events
        assert events.rstrip().endswith("started")
    finally:
        run.stop(grace_s=2.0)
