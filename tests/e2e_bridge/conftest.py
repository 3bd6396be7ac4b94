"""Fixtures for the process bridge against a real local control plane (docs/e2e.md).

* ``bridge_cluster`` (session): a kwok cluster whose kwok stages leave every pod with a
  ``pdfleet.dev/role`` label to the bridge (``ClusterConfig(bridge_label=OWNED_LABEL)``);
* ``api_client`` (session): a ``kubernetes.client.ApiClient`` for it;
* ``bridge`` (session): an :class:`e2e.bridge.Bridge` running the simulator 10x faster than
  real time, with probe periods capped at 2 s so that the tests stay short.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/netns.sh .venv/bin/pytest tests/e2e_bridge``. A missing toolchain or namespace is a
failure, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from e2e.bridge import OWNED_LABEL, Bridge, BridgeSettings
from e2e.cluster import (
    Cluster,
    ClusterConfig,
    in_private_netns,
    missing_binaries,
    start,
    stop,
    toolchain_bin_dir,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def bridge_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster whose pdfleet pods (any ``pdfleet.dev/role``) are run by a bridge."""
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
            "bridge tests must run inside the private network namespace: "
            "e2e/netns.sh .venv/bin/pytest tests/e2e_bridge",
            pytrace=False,
        )
    cfg = ClusterConfig(
        name="pdfleet-bridge",
        workdir=tmp_path_factory.mktemp("kwok"),
        bin_dir=bin_dir,
        bridge_label=OWNED_LABEL,
    )
    started = start(cfg)
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture(scope="session")
def api_client(bridge_cluster: Cluster) -> Iterator[Any]:
    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(bridge_cluster.kubeconfig)
    )
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def bridge(bridge_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    settings = BridgeSettings(
        kubeconfig=bridge_cluster.kubeconfig,
        log_dir=tmp_path_factory.mktemp("bridge"),
        time_scale=0.1,
        probe_period_max_s=2.0,
    )
    with Bridge(settings) as running:
        yield running
