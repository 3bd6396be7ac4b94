"""Fixtures for the autoscaler on the local cluster (docs/autoscaling.md, e2e/platform/fleet.py).

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e/support.py;
* ``fleet`` (module): the demo fleet (``e2e/scenarios/demo-fleet.yaml``) in a namespace of its own,
  with Prometheus (Kubernetes service discovery), a bridge for that namespace (simulators at
  time scale 10) and a real ``pdfleet operator run`` process, Ready.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/autoscale``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.cluster import Cluster
from e2e.platform.fleet import Fleet, running_fleet
from tests.e2e.support import api_client, bridge_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent
TIME_SCALE = 10.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def fleet(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("autoscale")
    namespace = f"autoscale-{uuid.uuid4().hex[:8]}"
    with running_fleet(bridge_cluster, api_client, workdir, namespace, TIME_SCALE) as running:
        yield running
