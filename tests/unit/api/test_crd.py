"""The committed CRD is exactly what the models generate, and it is structural."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from pdfleet.api.crd import CRD_FILE, crd, render_crd_yaml
from tests.spec_cases import ROOT

STUBS = {"apiVersion", "kind", "metadata"}


def _walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _walk(schema[key], f"{path}[{key}]")


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crd_matches_the_models() -> None:
    committed = (ROOT / "crds" / CRD_FILE).read_text()
    assert committed == render_crd_yaml(), "crds/ is stale: run `make manifests`"


def test_schema_is_structural() -> None:
    text = yaml.safe_dump(_schema())
    assert "$ref" not in text and "$defs" not in text
    for path, node in _walk(_schema()):
        assert "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "null" not in str(node.get("type")), path
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path} has no type"


def test_every_field_is_described_for_kubectl_explain() -> None:
    undescribed = [
        path
        for path, node in _walk(_schema())
        if path
        and path.lstrip(".") not in STUBS
        and "[" not in path.rsplit(".", 1)[-1]
        and not node.get("description")
    ]
    assert not undescribed


def test_cross_field_rules_are_in_the_crd() -> None:
    spec = _schema()["properties"]["spec"]
    rules = [entry["rule"] for entry in spec["x-kubernetes-validations"]]
    assert any("gpuBudget" in rule for rule in rules)
    replicas = spec["properties"]["prefill"]["properties"]["replicas"]
    assert {entry["fieldPath"] for entry in replicas["x-kubernetes-validations"]} == {
        ".min",
        ".initial",
    }


def test_defaults_in_the_crd_match_the_models() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["kvTransfer"]["properties"]["sideChannelPort"]["default"] == 5600
    assert spec["drain"]["properties"]["timeout"]["default"] == "300s"
    assert spec["prefill"]["properties"]["tolerations"]["default"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_status_not_written_yet_reads_as_generation_0_observed() -> None:
    """kstatus reads a status without observedGeneration as Current (docs/gitops.md)."""
    status = _schema()["properties"]["status"]
    assert status["default"] == {"observedGeneration": 0}
    assert status["properties"]["observedGeneration"]["type"] == "integer"


def test_names_and_columns() -> None:
    names = crd()["spec"]["names"]
    assert names["kind"] == "InferenceService"
    assert "isvc" not in names["shortNames"]
    columns = [c["name"] for c in crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:8] == ["Prefill", "Decode", "TTFT", "ITL", "Ready", "Reason", "Stalled", "Age"]
    assert crd()["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_chart_crd_is_a_copy_of_crds() -> None:
    chart_copy = (ROOT / "charts" / "pdfleet" / "crds" / CRD_FILE).read_text()
    assert chart_copy == (ROOT / "crds" / CRD_FILE).read_text(), "run `make manifests`"


def test_api_reference_is_current() -> None:
    from pdfleet.api.docs import render_api_docs

    assert (ROOT / "docs" / "api.md").read_text() == render_api_docs(), "run `make manifests`"


def test_exclusive_bounds_use_the_openapi_v3_boolean_form() -> None:
    for path, node in _walk(_schema()):
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(key, True) is True, f"{path}.{key} must be a boolean"
