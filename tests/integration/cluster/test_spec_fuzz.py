"""Generated specs against the real API server and the real operator.

Hypothesis draws InferenceServices that mix valid values with targeted violations
(tests/spec_strategies.py). For each one the pydantic models (the single source of the CRD)
say whether it is valid; the API server must agree: accept the valid ones, refuse every
invalid one at admission with a message that names a field the models name. The first
accepted ones are then created for real while the operator runs: each must get a status with
conditions, what only the operator can see (a child the API server refuses) must become a
Stalled condition and an Event, and the operator's log must show no traceback.

The run is derandomized (the same examples every time) so CI is reproducible.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.platform.cluster import Cluster
from e2e.platform.operator_process import OperatorProcess
from pdfleet import labels
from tests.integration.cluster.kube_helpers import condition, create_isvc, get_isvc, wait_for
from tests.spec_cases import normalize_path
from tests.spec_strategies import oracle, specs

EXAMPLES = 150
RECONCILED = 20  # accepted specs also created for real and reconciled
# Generated replica counts go up to 1000: a quota keeps the fake pods few on a shared machine.
POD_QUOTA = "24"

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Tally:
    accepted: int = 0
    rejected: int = 0
    created: list[str] = field(default_factory=list)
    rejected_fields: set[str] = field(default_factory=set)


def create(api: Any, namespace: str, obj: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    # Strict: what kubectl apply uses, unknown fields are refused
    return create_isvc(api, namespace, obj, dry_run=dry_run, field_validation="Strict")


def refusal_names(body: dict[str, Any], paths: list[str]) -> bool:
    """Whether the API server's refusal names one of the fields the models name."""
    causes = (body.get("details") or {}).get("causes") or []
    fields = {normalize_path(cause.get("field", "")) for cause in causes}
    message = normalize_path(body.get("message", ""))
    return any(path in fields or path in message for path in paths)


@pytest.fixture
def operator(
    cluster: Cluster, crds: list[str], namespace: str, api_client: Any, tmp_path: Path
) -> Iterator[OperatorProcess]:
    quota = {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": POD_QUOTA}}}
    client.CoreV1Api(api_client).create_namespaced_resource_quota(
        namespace, client.V1ResourceQuota.model_validate(quota)
    )
    proc = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        log_path=tmp_path / "operator.log",
        resync_seconds=5.0,
        extra_args=(f"--namespace={namespace}",),
    )
    with proc.serving(healthy_within=120):
        yield proc


def events_for(api: Any, namespace: str, name: str) -> list[str]:
    items = (
        client.CoreV1Api(api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
    return [str(item.reason) for item in items]


def remove_all(api: Any, namespace: str) -> None:
    """Delete the created services and wait for their pods to go, so that the tests after
    this one do not share the machine with their garbage collection."""
    client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, labels.PLURAL
    )
    core = client.CoreV1Api(api)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 120, "the pods to go", 1.0)


def test_generated_specs_admission_and_reconcile(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    tally = Tally()

    @FUZZ
    @given(obj=specs())
    def check(obj: dict[str, Any]) -> None:
        paths = oracle(obj)
        try:
            create(api_client, namespace, obj, dry_run=True)
        except ApiException as error:
            assert error.body is not None, error
            body = json.loads(error.body)
            assert paths, f"the API server refused a valid spec: {body['message']}\n{obj}"
            assert error.status in (400, 422), body
            assert refusal_names(body, paths), f"models name {paths}; API: {body['message']}"
            tally.rejected += 1
            tally.rejected_fields.update(paths)
            return
        assert not paths, f"the API server accepted a spec the models refuse: {paths}\n{obj}"
        tally.accepted += 1
        if len(tally.created) < RECONCILED:
            name = f"fuzz-{len(tally.created)}"
            create(api_client, namespace, {**obj, "metadata": {"name": name}}, dry_run=False)
            tally.created.append(name)

    check()
    print(
        f"\n{tally.accepted + tally.rejected} generated specs: {tally.accepted} accepted, "
        f"{tally.rejected} refused naming {len(tally.rejected_fields)} distinct fields; "
        f"{len(tally.created)} created and reconciled"
    )
    # A generator that stopped producing one side would make this test vacuous.
    assert tally.accepted >= RECONCILED and tally.rejected >= EXAMPLES // 4

    def reconciled(name: str) -> dict[str, Any] | None:
        obj = get_isvc(api_client, namespace, name)
        status = obj.get("status") or {}
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and condition(obj, "Ready") and condition(obj, "Stalled") else None

    def reported(name: str, reason: str) -> bool:
        return reason in events_for(api_client, namespace, name)

    try:
        for name in tally.created:
            obj = wait_for(partial(reconciled, name), 180, f"{name} to get conditions", 0.5)
            if condition(obj, "Stalled")["status"] == "True":
                reason = condition(obj, "Stalled")["reason"]
                wait_for(partial(reported, name, reason), 30, f"a {reason} Event for {name}")
    except AssertionError as error:
        obj = get_isvc(api_client, namespace, name)
        tail = operator.log_path.read_text(errors="replace")[-6000:]
        raise AssertionError(
            f"{error}\nspec: {obj['spec']}\nstatus: {obj.get('status')}\n{tail}"
        ) from None
    finally:
        operator.stop()
        remove_all(api_client, namespace)
    log = operator.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
    assert "failed; retrying later" not in log, log[-6000:]
