"""The release workflow's chart path with real parts: the chart is linted and packaged as
.github/workflows/release.yml does it, pushed with `helm push` to an OCI registry (the CNCF
distribution registry, on 127.0.0.1 over plain HTTP), and installed on the local cluster with
`helm install oci://...`.

What it shows:

* the registry holds exactly the package: its manifest names the package's sha256 and size as
  the chart layer, the manifest's digest is the one `helm push` reported, and `helm pull` gets
  the same bytes back under the same digest;
* the chart installs from the registry: the release records the pushed name and version, its
  Deployment names the operator image tagged with that appVersion, and every object (CRD when
  the cluster has none yet, RBAC, ServiceAccount, Deployment) is accepted and rolled out;
* that release can run a fleet: `pdfleet operator run` from this checkout, with the arguments
  of the Deployment the install created and a token of the ServiceAccount it created, turns the
  minimal sample Ready.

kwok runs no containers, so the Deployment's pods are fake and the operator runs as a local
process, as in test_chart.py. The operator image is not built here (docs/release.md); that the
image starts is not shown.

The registry is the Makefile's (`make registry`; `PDFLEET_REGISTRY` points at another build):
without it the test fails.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e.platform.cluster import Cluster, free_port, wait_until
from e2e.platform.tools import ToolMissingError, built_tool
from tests.integration.cluster.test_chart import (
    CHART,
    RELEASE,
    Release,
    assert_sample_becomes_ready,
    helm,
    helm_run,
    install,
    run_operator,
)

REPOSITORY = "charts"  # the path under the registry, as ghcr.io/pdfleet/charts
HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# Set by the Deployment for a pod with its own network; here every process shares one network
# stack, so OperatorProcess binds the metrics and health servers to loopback on free ports.
POD_NETWORK_ARGS = ("--bind=", "--metrics-port=", "--health-port=")


@dataclass(frozen=True)
class OCIRegistry:
    port: int
    log_path: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"


@dataclass(frozen=True)
class PushedChart:
    registry: OCIRegistry
    package: Path  # what `helm package` wrote
    version: str
    digest: str  # the manifest digest `helm push` reported

    @property
    def reference(self) -> str:
        return f"oci://{self.registry.host}/{REPOSITORY}/{CHART.name}"

    def source(self) -> tuple[str, ...]:
        """The flags that locate the chart for `helm pull` and `helm install`."""
        return ("--version", self.version, "--plain-http")


def registry_binary() -> Path:
    """The registry `make registry` builds (`PDFLEET_REGISTRY` names another build)."""
    try:
        return built_tool(
            "registry", "PDFLEET_REGISTRY",
            "the OCI registry (github.com/distribution/distribution/v3/cmd/registry)",
        )  # fmt: skip
    except ToolMissingError as missing:
        pytest.fail(str(missing), pytrace=False)


def registry_config(port: int, storage: Path) -> dict[str, Any]:
    """Loopback only, plain HTTP, a throw-away filesystem store; no debug server."""
    return {
        "version": "0.1",
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }


def answers(registry: OCIRegistry) -> bool:
    try:
        return httpx.get(registry.url("/v2/"), timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OCIRegistry]:
    binary = registry_binary()
    work = tmp_path_factory.mktemp("oci-registry")
    registry = OCIRegistry(port=free_port(), log_path=work / "registry.log")
    config = work / "config.yml"
    config.write_text(yaml.safe_dump(registry_config(registry.port, work / "storage")))
    with registry.log_path.open("ab") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [str(binary), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def up() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the registry exited:\n{registry.log_path.read_text()[-3000:]}")
            return answers(registry)

        wait_until(up, 30, f"the OCI registry on {registry.host}")
        yield registry
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def chart_version() -> str:
    """The chart's version, which the workflow requires the tag to equal."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert isinstance(version, str), version
    return version


def reported_digest(result: subprocess.CompletedProcess[str]) -> str:
    """The manifest digest helm prints after a push or a pull (on stderr)."""
    match = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", result.stdout + result.stderr, re.M)
    assert match, f"no digest in helm's output:\n{result.stdout}\n{result.stderr}"
    return match.group(1)


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture(scope="module")
def pushed_chart(
    cluster: Cluster, oci_registry: OCIRegistry, tmp_path_factory: pytest.TempPathFactory
) -> PushedChart:
    """The workflow's chart job against the local registry: lint, package, push."""
    version = chart_version()
    out = tmp_path_factory.mktemp("chart-package")
    helm(cluster, "lint", "--strict", str(CHART))
    helm(
        cluster, "package", str(CHART), "--version", version, "--app-version", version,
        "--destination", str(out),
    )  # fmt: skip
    package = out / f"{CHART.name}-{version}.tgz"
    pushed = helm_run(
        cluster, "push", str(package), f"oci://{oci_registry.host}/{REPOSITORY}", "--plain-http"
    )
    return PushedChart(oci_registry, package, version, reported_digest(pushed))


def test_the_registry_holds_exactly_the_packaged_chart(
    cluster: Cluster, pushed_chart: PushedChart, tmp_path: Path
) -> None:
    chart = pushed_chart
    packaged = chart.package.read_bytes()
    path = f"/v2/{REPOSITORY}/{CHART.name}"

    tags = httpx.get(chart.registry.url(f"{path}/tags/list"), timeout=10, trust_env=False)
    assert tags.status_code == 200, tags.text
    assert tags.json()["tags"] == [chart.version]

    response = httpx.get(
        chart.registry.url(f"{path}/manifests/{chart.version}"),
        headers={"Accept": OCI_MANIFEST},
        timeout=10,
        trust_env=False,
    )
    assert response.status_code == 200, response.text
    # The registry's digest is the manifest's own sha256, and the one helm reported.
    assert response.headers["Docker-Content-Digest"] == sha256(response.content)
    assert response.headers["Docker-Content-Digest"] == chart.digest
    manifest = response.json()
    (layer,) = (entry for entry in manifest["layers"] if entry["mediaType"] == HELM_CHART_LAYER)
    assert layer["digest"] == sha256(packaged)
    assert layer["size"] == len(packaged)
    assert manifest["annotations"]["org.opencontainers.image.version"] == chart.version

    pulled = helm_run(
        cluster, "pull", chart.reference, *chart.source(), "--destination", str(tmp_path)
    )
    assert reported_digest(pulled) == chart.digest
    assert (tmp_path / chart.package.name).read_bytes() == packaged


@pytest.fixture
def oci_release(
    cluster: Cluster, namespace: str, pushed_chart: PushedChart, tmp_path: Path
) -> Iterator[Release]:
    yield from install(
        cluster, namespace, tmp_path, {}, chart=pushed_chart.reference,
        source=pushed_chart.source(),
    )  # fmt: skip


def operator_args(deployment: dict[str, Any]) -> tuple[str, ...]:
    """The Deployment's `pdfleet operator run` arguments, less those that place its servers on
    the pod's own network (POD_NETWORK_ARGS)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    # `--log-level=...` belongs before the subcommand, which OperatorProcess writes itself.
    assert args[0].startswith("--log-level=") and args[1:3] == ["operator", "run"], args
    return tuple(arg for arg in args[3:] if not arg.startswith(POD_NETWORK_ARGS))


def test_the_chart_installed_from_the_registry_runs_a_fleet(
    cluster: Cluster,
    api_client: Any,
    pushed_chart: PushedChart,
    oci_release: Release,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = oci_release.namespace
    metadata = json.loads(helm(cluster, "get", "metadata", RELEASE, "-n", namespace, "-o", "json"))
    assert (metadata["chart"], metadata["version"], metadata["appVersion"]) == (
        CHART.name,
        pushed_chart.version,
        pushed_chart.version,
    )
    deployment = json.loads(
        cluster.kubectl("get", "deployment", RELEASE, "-n", namespace, "-o", "json")
    )
    assert deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f"/operator:{pushed_chart.version}"), container["image"]

    op = run_operator(oci_release, tmp_path, monkeypatch, extra_args=operator_args(deployment))
    try:
        assert_sample_becomes_ready(api_client, namespace, op)
    finally:
        op.stop()
    log = op.log_path.read_text()
    assert "failed; retrying later" not in log, "a reconcile was refused"
