"""Render the Helm chart with the toolchain's helm binary and validate what comes out.

The chart tests need `helm` (built by `make toolchain` into the toolchain's bin dir, or
`PDFLEET_HELM` pointing at one): without it they fail, they never skip. Built-in kinds are
checked against the Kubernetes 1.36 OpenAPI schemas that `kubernetes-validate` bundles
(strict: unknown fields are errors).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from e2e.cluster import toolchain_bin_dir
from tests.spec_cases import ROOT

CHART = ROOT / "charts" / "pdfleet"
KUBE_VERSION = "1.36.0"
RELEASE = "pdfleet"
NAMESPACE = "pdfleet-system"
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

Manifest = dict[str, Any]

# Values sets every test renders: the defaults, namespaced mode, and everything switched on.
VALUE_SETS: dict[str, Manifest] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "monitoring": {
        "monitoring": {
            "labels": {"release": "kube-prometheus-stack"},
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "workersPodMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "alertLabels": {"team": "inference"}},
        },
        "grafana": {"dashboards": {"enabled": True, "namespace": "monitoring"}},
    },
    "namespaced-monitoring": {
        "watchNamespaces": ["serving"],
        "monitoring": {"workersPodMonitor": {"enabled": True}},
    },
    "single": {"replicaCount": 1, "leaderElection": {"enabled": False}},
}


def toolchain_binary(name: str, env: str) -> Path:
    """A toolchain binary: $`env`, else the toolchain's bin dir, else PATH. Fails if absent."""
    override = os.environ.get(env)
    candidates = [Path(override)] if override else []
    candidates.append(toolchain_bin_dir() / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    pytest.fail(
        f"{name} not found (looked at {', '.join(map(str, candidates))}): run `make toolchain`",
        pytrace=False,
    )


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with a throw-away home, so no user configuration or repository is read."""
    binary = toolchain_binary("helm", "PDFLEET_HELM")
    home = ROOT / ".pytest_cache" / "helm-home"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, check=check, env=env, timeout=60
    )


def render_text(
    values: Mapping[str, Any], *extra: str, tmp: Path
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with `values`; the caller checks the exit code."""
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(dict(values)))
    return helm(
        "template", RELEASE, str(CHART),
        "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSION,
        "--values", str(values_file),
        *extra,
        check=False,
    )  # fmt: skip


def render(values: Mapping[str, Any], tmp: Path, include_crds: bool = True) -> list[Manifest]:
    """Every object `helm template` renders for `values` (CRDs included by default)."""
    result = render_text(values, *(["--include-crds"] if include_crds else []), tmp=tmp)
    if result.returncode != 0:
        pytest.fail(f"helm template failed:\n{result.stderr}", pytrace=False)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def schema_errors(manifest: Manifest) -> str | None:
    """None when `manifest` is valid against the Kubernetes schema, else the error."""
    try:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return f"{error.message} at {'.'.join(map(str, error.path))}"
    return None


def by_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [m for m in by_kind(manifests, kind) if name in (None, m["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
