"""The real API server accepts the samples and refuses every invalid case, naming the field.

The same cases (tests/cases/invalid_specs.yaml) run against the pydantic models in the unit
tier; here they prove the schema and CEL rules of the generated CRD.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.integration.cluster.kube_helpers import create_isvc
from tests.spec_cases import InvalidCase, invalid_cases, normalize_path, sample, sample_names

CASES = invalid_cases()


def _create(api_client: Any, namespace: str, obj: dict[str, Any], strict: bool = True) -> Any:
    validation = "Strict" if strict else "Ignore"
    return create_isvc(api_client, namespace, obj, dry_run=True, field_validation=validation)


@pytest.mark.parametrize("name", sample_names())
def test_sample_is_accepted(api_client: Any, crds: list[str], namespace: str, name: str) -> None:
    created = _create(api_client, namespace, sample(name))
    # Defaults from the models are applied by the API server.
    assert created["spec"]["kvTransfer"]["sideChannelPort"] == 5600
    assert created["spec"]["drain"]["timeout"] == "300s"


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_invalid_spec_is_rejected_naming_the_field(
    api_client: Any, crds: list[str], namespace: str, case: InvalidCase
) -> None:
    with pytest.raises(ApiException) as rejected:
        _create(api_client, namespace, case.obj, strict=case.strict)
    # Schema and CEL failures are 422; Strict field validation refuses unknown fields with 400.
    assert rejected.value.status == (400 if case.strict else 422), rejected.value.body
    assert rejected.value.body is not None
    body = json.loads(rejected.value.body)
    causes = (body.get("details") or {}).get("causes") or []
    fields = [normalize_path(cause.get("field", "")) for cause in causes]
    message = normalize_path(body["message"])
    expected = normalize_path(case.field)
    assert expected in fields or expected in message, body["message"]
