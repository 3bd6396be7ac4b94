"""Fixtures for the chart's dashboard and alerts against a running fleet (docs/observability.md).

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e/support.py;
* ``rule_file`` (module): the chart's PrometheusRule, rendered by the toolchain's helm, as a
  Prometheus rule file, with a short ``monitoring.prometheusRule.sloViolationFor``;
* ``fleet`` (module): the demo fleet (``e2e/scenarios/demo-fleet.yaml``, simulators at time scale
  10, the real vllm-router and a real ``pdfleet operator run``) with a Prometheus that scrapes
  the workers through the shipped Kubernetes SD job and the operator as the chart's
  ServiceMonitor does, and evaluates ``rule_file``.

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/observability``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.platform.cluster import Cluster
from e2e.platform.fleet import OPERATOR_NAMESPACE, Fleet, running_fleet
from tests.e2e.support import api_client, bridge_cluster, mark_folder
from tests.integration.chart.helm import NAMESPACE, render
from tests.manifests import one

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent
TIME_SCALE = 10.0
#: How long an SLO must be missed before its alert fires: long enough that the rule's `for:`
#: is exercised (pending, then firing), short enough for a test.
SLO_VIOLATION_FOR = "10s"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The operator's scrape target is labelled with the release namespace the rules select on.
    assert NAMESPACE == OPERATOR_NAMESPACE
    workdir = tmp_path_factory.mktemp("rules")
    values = {
        "monitoring": {
            "prometheusRule": {"enabled": True, "sloViolationFor": SLO_VIOLATION_FOR},
        },
    }
    rule: dict[str, Any] = one(render(values, workdir, include_crds=False), "PrometheusRule")
    path = workdir / "pdfleet-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def fleet(
    bridge_cluster: Cluster,
    api_client: Any,
    rule_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("observability")
    namespace = f"observe-{uuid.uuid4().hex[:8]}"
    with running_fleet(
        bridge_cluster, api_client, workdir, namespace, TIME_SCALE, rule_files=[rule_file]
    ) as running:
        yield running
