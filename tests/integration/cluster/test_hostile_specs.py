"""What the real API server admits, the operator can run; and free text is text.

The hostile specs of tests/cases/hostile_specs.yaml (a zero stabilization window, a 0s target,
extra flags and env the operator sets, colliding ports, an rdmaPerReplica without its
resource, an empty router image) must be refused at admission with a message that names the
field. A spec with non-ASCII text in every free-text field (an emoji, CJK, the characters YAML
reads as line breaks or may not carry) must be admitted and stored unchanged, and every child
the operator renders from it must be accepted by the API server through the operator's own
server-side apply, with the text intact.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.kube.api import KubeWriter
from pdfleet.reconcile.plan import desired_replicas, with_hash
from pdfleet.render import render_children
from tests.integration.cluster.kube_helpers import create_isvc
from tests.spec_cases import (
    HOSTILE_FILE,
    InvalidCase,
    invalid_cases,
    merge_patch,
    normalize_path,
    sample,
)

CASES = invalid_cases(HOSTILE_FILE)

# Beyond the Basic Multilingual Plane, CJK and accents, and characters YAML either may not carry
# literally (DEL, C1 controls, the byte-order mark) or reads as line breaks (NEL, U+2028).
TEXT = "模型 😀🚀 é \u2028 \u0085 \x7f \x01 \ufeff"


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_spec_is_refused_naming_the_field(
    api_client: Any, crds: list[str], namespace: str, case: InvalidCase
) -> None:
    with pytest.raises(ApiException) as refused:
        create_isvc(api_client, namespace, case.obj, dry_run=True, field_validation="Strict")
    assert refused.value.status == 422, refused.value.body
    body = json.loads(str(refused.value.body))
    causes = (body.get("details") or {}).get("causes") or []
    fields = [normalize_path(cause.get("field", "")) for cause in causes]
    message = normalize_path(body["message"])
    assert normalize_path(case.field) in fields or normalize_path(case.field) in message, message
    assert case.message in body["message"], body["message"]


# Look-alikes of the flags and names the operator owns, which are the user's to set.
LOOKALIKES = {
    "spec": {
        "engine": {
            "extraArgs": ["--portal", "--data-parallel-size-local=1", "--model-impl", "vllm", "-t"],
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}},
                {"name": "HF_HOME", "value": "/data/hf"},
                {"name": "PDFLEET_ENGINE", "value": "vllm"},
                {"name": "UCX_LOG_LEVEL", "value": "info"},
            ],
        }
    }
}


def test_lookalikes_of_owned_flags_and_names_are_admitted(
    api_client: Any, crds: list[str], namespace: str
) -> None:
    obj = merge_patch(sample("minimal"), LOOKALIKES)
    InferenceService.model_validate(obj)
    created = create_isvc(api_client, namespace, obj, dry_run=True, field_validation="Strict")
    for key in ("extraArgs", "env"):
        assert created["spec"]["engine"][key] == obj["spec"]["engine"][key]


def _text_everywhere(source: dict[str, Any]) -> dict[str, Any]:
    """The minimal sample with non-ASCII text in every free-text field."""
    obj = sample("minimal")
    spec = obj["spec"]
    spec["model"] = {"name": f"org/llama {TEXT}", "source": source}
    spec["engine"]["extraArgs"] = [f'--override-generation-config={{"stop": "{TEXT}"}}']
    spec["engine"]["env"] = [{"name": "NOTE", "value": TEXT}]
    for role in labels.WORKER_ROLES:
        spec[role]["extraArgs"] = ["--chat-template-content-format", TEXT]
        spec[role]["env"] = [{"name": f"NOTE_{role.upper()}", "value": f"{role} {TEXT}"}]
    return obj


SOURCES = {
    "hub": {"hub": {"id": f"org/模型-{TEXT}", "revision": f"ветка {TEXT}"}},
    "pvc": {"pvc": {"claimName": "models", "path": f"/models/{TEXT}"}},
}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_text_in_every_free_text_field_reaches_the_children_intact(
    api_client: Any, crds: list[str], namespace: str, source: str
) -> None:
    obj = _text_everywhere(SOURCES[source])
    InferenceService.model_validate(obj)  # the models admit it, as the API server must
    created = create_isvc(api_client, namespace, obj)
    assert created["spec"]["model"] == obj["spec"]["model"]
    isvc = InferenceService.model_validate(created)
    writer = KubeWriter(api_client)
    applied = [
        writer.apply(with_hash(child), namespace, dry_run=True)
        for child in render_children(isvc, desired_replicas(isvc, None))
    ]
    workers = [child for child in applied if child["kind"] == "StatefulSet"]
    assert len(workers) == len(labels.WORKER_ROLES)
    for worker in workers:
        env = _env(worker["spec"]["template"]["spec"]["containers"][0])
        role = worker["metadata"]["labels"][labels.ROLE]
        assert env["PDFLEET_SERVED_MODEL_NAME"] == obj["spec"]["model"]["name"]
        assert env["NOTE"] == TEXT and env[f"NOTE_{role.upper()}"] == f"{role} {TEXT}"
        extra = [*obj["spec"]["engine"]["extraArgs"], *obj["spec"][role]["extraArgs"]]
        assert json.loads(env["PDFLEET_EXTRA_ARGS"]) == extra
