"""Fixtures for the process bridge against a real local control plane (docs/e2e.md).

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e/support.py;
* ``bridge`` (module): an :class:`e2e.platform.bridge.Bridge` running the simulator 10x faster than
  real time, with probe periods capped at 2 s so that the tests stay short.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/bridge``. A missing toolchain or namespace is a
failure, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.platform.bridge import Bridge, BridgeSettings
from e2e.platform.cluster import Cluster
from tests.e2e.support import api_client, bridge_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def bridge(bridge_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    settings = BridgeSettings(
        kubeconfig=bridge_cluster.kubeconfig,
        log_dir=tmp_path_factory.mktemp("bridge"),
        time_scale=0.1,
        probe_period_max_s=2.0,
    )
    with Bridge(settings) as running:
        yield running
