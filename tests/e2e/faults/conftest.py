"""Fixtures for the fault suite (e2e/scenarios/faults.py, docs/reliability.md).

* ``control_plane`` (module): a cluster of its own where kwok runs every pod (the operator's
  faults need no data plane), the CRDs applied; its own ``cp_api`` client;
* ``deployed_fleet`` (module): on ``bridge_cluster`` (tests/e2e/support.py), a service of 1
  prefill and 2 decode workers and a router run by a bridge of its own, reconciled by a real
  operator;
* ``fleet`` (each test): that service with autoscaling off and its pools back at 1 prefill and
  2 decode workers, settled, whatever an earlier test left (the Prometheus faults turn the
  autoscaler on, after which the pools may change size), so that the tests run in any order.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/faults``. A missing toolchain or namespace
is a failure, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.children import patch_isvc
from e2e.platform.cluster import Cluster
from e2e.platform.service import Service, apply_crds, deployed_service, wait_settled
from e2e.scenarios.faults import FLEET, autoscaling_off_patch
from tests.e2e.support import api_client, bridge_cluster, kube_client, local_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory, "pdfleet-faults", None, "tests/e2e/faults") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cp_api(control_plane: Cluster) -> Iterator[Any]:
    with kube_client(control_plane) as api:
        apply_crds(control_plane, api)
        yield api


@pytest.fixture(scope="module")
def deployed_fleet(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log_dir = tmp_path_factory.mktemp("faults-fleet")
    with deployed_service(bridge_cluster, api_client, log_dir, FLEET) as service:
        yield service


@pytest.fixture
def fleet(deployed_fleet: Service) -> Service:
    service = deployed_fleet
    patch_isvc(service.api, service.namespace, service.name, autoscaling_off_patch(FLEET))
    wait_settled(service, FLEET, 300)
    return service
