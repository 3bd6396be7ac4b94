"""The chart's side of what the rendered NetworkPolicies let through (docs/security.md; the
operator's renders are checked in tests/unit/render/test_security.py)."""

from __future__ import annotations

from pathlib import Path

from pdfleet.render import RenderConfig
from tests.integration.chart.helm import render
from tests.manifests import one


def test_the_operator_pods_carry_the_labels_the_policies_let_through(tmp_path: Path) -> None:
    deployment = one(render({}, tmp_path), "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert dict(RenderConfig().operator_labels).items() <= pod_labels.items()
