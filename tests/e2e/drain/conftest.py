"""Fixtures for the drain on the local cluster (docs/drain.md, e2e/scenarios/drain_scenario.py).

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e/support.py;
* ``deployed`` (module): a namespace with the InferenceService at 3 prefill and 4 decode
  workers, run by a bridge of its own (that namespace only) and reconciled by a real
  ``pdfleet operator run`` process (``service.log_dir``: the bridge's pod logs);
* ``service`` (each test): that service back at 3 prefill and 4 decode workers and settled
  (every pod Ready, none draining, the router listing exactly those), whatever an earlier
  test left, so that the tests run in any order.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/drain``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.cluster import Cluster
from e2e.platform.service import HIGH, Service, deployed_service, wait_settled
from tests.e2e.support import api_client, bridge_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def deployed(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    with deployed_service(bridge_cluster, api_client, tmp_path_factory.mktemp("drain")) as svc:
        yield svc


@pytest.fixture
def service(deployed: Service) -> Service:
    deployed.scale(HIGH)
    wait_settled(deployed, HIGH, 240)
    return deployed
