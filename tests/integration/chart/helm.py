"""Render the Helm chart with the toolchain's helm binary (tests/manifests.py validates what
comes out).

The chart tests need `helm` (built by `make toolchain` into the toolchain's bin dir, or
`PDFLEET_HELM` pointing at one): without it they fail, they never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.platform.cluster import toolchain_bin_dir
from tests.manifests import KUBE_VERSION, Manifest
from tests.spec_cases import ROOT

CHART = ROOT / "charts" / "pdfleet"
RELEASE = "pdfleet"
NAMESPACE = "pdfleet-system"
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

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
