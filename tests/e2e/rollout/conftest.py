"""Fixtures for revision-paired rollouts on the local cluster (docs/upgrade.md).

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e/support.py;
* ``deployed`` (module): a namespace with the InferenceService at 1 prefill and 2 decode
  workers (simulators), run by a bridge of its own and reconciled by a real
  ``pdfleet operator run`` process;
* ``service`` (each test): that service settled at those sizes, with no rollout in progress.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/rollout``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.cluster import Cluster, wait_until
from e2e.platform.service import Service, deployed_service, wait_settled
from pdfleet import labels
from tests.e2e.support import api_client, bridge_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent
POOLS = {labels.ROLE_PREFILL: 1, labels.ROLE_DECODE: 2}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def deployed(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log_dir = tmp_path_factory.mktemp("rollout")
    with deployed_service(bridge_cluster, api_client, log_dir, POOLS) as svc:
        yield svc


@pytest.fixture
def service(deployed: Service) -> Service:
    wait_until(lambda: "rollout" not in deployed.status(), 300, "no rollout in progress")
    wait_settled(deployed, POOLS, 240)
    return deployed
