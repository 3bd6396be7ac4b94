"""Fixtures shared by the e2e folders that run a cluster with the process bridge.

* ``bridge_cluster`` (session): a kwok cluster whose kwok stages leave every pod with a
  ``pdfleet.dev/role`` label to the bridge (``ClusterConfig(bridge_label=OWNED_LABEL)``);
* ``api_client`` (session): a ``kubernetes.client.ApiClient`` for it.

Each folder's conftest imports these and adds its own ``bridge`` (module scope, so two folders'
bridges never run the same pods). Run them inside the private network namespace, e.g.
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/bridge``. A missing toolchain or namespace is a
failure, never a skip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from e2e.platform.bridge import OWNED_LABEL
from e2e.platform.cluster import (
    Cluster,
    ClusterConfig,
    in_private_netns,
    missing_binaries,
    start,
    stop,
    toolchain_bin_dir,
)


def mark_folder(items: list[pytest.Item], folder: Path, marker: pytest.MarkDecorator) -> None:
    """Add ``marker`` to every item collected from ``folder``."""
    for item in items:
        if folder in item.path.parents:
            item.add_marker(marker)


def require_cluster_tools(suite: str) -> Path:
    """The toolchain's bin dir; fails the run (never skips) when a binary is missing or the
    tests are not inside the private network namespace."""
    bin_dir = toolchain_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        pytest.fail(
            f"Kubernetes toolchain incomplete (missing {', '.join(missing)} in {bin_dir}): "
            "run `make toolchain` first",
            pytrace=False,
        )
    if not in_private_netns():
        pytest.fail(
            f"these tests must run inside the private network namespace: "
            f"e2e/platform/netns.sh .venv/bin/pytest {suite}",
            pytrace=False,
        )
    return bin_dir


@contextlib.contextmanager
def local_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str, bridge_label: str | None, suite: str
) -> Iterator[Cluster]:
    """A cluster for a fixture: started in a temp dir, stopped and deleted afterwards."""
    bin_dir = require_cluster_tools(suite)
    cfg = ClusterConfig(
        name=name,
        workdir=tmp_path_factory.mktemp("kwok"),
        bin_dir=bin_dir,
        bridge_label=bridge_label,
    )
    started = start(cfg)
    try:
        yield started
    finally:
        stop(started)


@contextlib.contextmanager
def kube_client(cluster: Cluster) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` for ``cluster``, closed afterwards."""
    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig)
    )
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def bridge_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster whose pdfleet pods (any ``pdfleet.dev/role``) are run by a bridge."""
    with local_cluster(tmp_path_factory, "pdfleet-bridge", OWNED_LABEL, "tests/e2e/bridge") as c:
        yield c


@pytest.fixture(scope="session")
def api_client(bridge_cluster: Cluster) -> Iterator[Any]:
    with kube_client(bridge_cluster) as api:
        yield api
