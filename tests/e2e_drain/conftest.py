"""Fixtures for the drain on the local cluster (docs/drain.md, e2e/drain_scenario.py).

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e_support.py;
* ``service`` (module): a namespace with the InferenceService at 3 prefill and 4 decode
  workers, run by a bridge of its own (that namespace only) and reconciled by a real
  ``pdfleet operator run`` process (``service.log_dir``: the bridge's pod logs).

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/netns.sh .venv/bin/pytest tests/e2e_drain``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.drain_scenario import Service, deployed_service
from tests.e2e_support import api_client, bridge_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def service(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    with deployed_service(bridge_cluster, api_client, tmp_path_factory.mktemp("drain")) as svc:
        yield svc
