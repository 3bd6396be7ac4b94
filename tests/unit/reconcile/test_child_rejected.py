"""A child the API server refuses becomes Stalled/ChildRejected and one Event, not an exception.

Free-form parts of a spec (nodeSelector keys, affinity, env sources) are checked by the API
server only when the StatefulSet built from them is written. The pass must end normally, so
the work queue does not retry it in a loop, and must say which child and why. The Stalled
condition reaches the operator's metrics too, as it does for a stored spec that no longer
validates: PdfleetServiceStalled reads it there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet import metrics
from pdfleet.controller import Controller, rejection_message
from pdfleet.kube.errors import APIError
from pdfleet.reconcile.observed import Observed
from tests.spec_cases import sample
from tests.unit.fakes import Writer
from tests.unit.operator_metrics import counted, labels, value

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
REFUSALS = {
    400: 'StatefulSet.apps "llama-8b-prefill" is invalid: spec.template.spec.nodeSelector: bad',
    422: 'StatefulSet.apps "llama-8b-prefill" is invalid: spec.template.spec.nodeSelector: bad',
    403: 'statefulsets.apps "llama-8b-prefill" is forbidden: User "system:serviceaccount:'
    'pdfleet:pdfleet" cannot patch resource "statefulsets" in API group "apps"',
    # What server-side apply answers for a value of the wrong shape (seen on 1.36).
    500: "failed to create typed patch object (ns/llama-8b-prefill; apps/v1, Kind=StatefulSet):"
    " .spec.template.spec.affinity.nodeAffinity: expected map, got &{everywhere}",
    503: "the server is shutting down",
}


class RefusingWriter(Writer):
    """Refuses StatefulSets with the given HTTP status, like the API server does."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    def apply(self, manifest: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        if manifest["kind"] == "StatefulSet":
            answer = json.dumps({"kind": "Status", "message": REFUSALS[self.status]})
            raise APIError(self.status, "Unprocessable Entity", answer)
        return super().apply(manifest, namespace)


def _body(status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    obj = sample("minimal")
    obj["metadata"].update(namespace="ns", uid="u1", generation=2)
    obj["status"] = dict(status or {})
    return obj


def _conditions(status: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.parametrize("code", [400, 403, 422, 500])
def test_a_refused_child_stalls_the_service_with_one_event(code: int) -> None:
    metrics.forget_service("ns", "llama-8b")
    writer = RefusingWriter(code)
    with counted("pdfleet_reconcile_errors_total") as errors:
        result = Controller(writer, clock=lambda: NOW).reconcile(_body(), Observed())
    assert errors == {labels(reason=str(code)): 1.0}  # the pass ended normally, but failed
    assert result.status_written
    conditions = _conditions(writer.last_status)
    assert conditions["Stalled"] == ("True", "ChildRejected")
    assert conditions["SpecValid"] == ("False", "ChildRejected")
    message = next(c["message"] for c in writer.last_status["conditions"] if c["type"] == "Ready")
    assert message == f"StatefulSet llama-8b-prefill: {REFUSALS[code]}"
    assert [c for c in writer.calls if c[0] == "event"] == [("event", "ChildRejected")]
    assert _stalled_series() == 1.0

    # The next pass (a resync) finds the same refusal: no status write, no second Event.
    again = RefusingWriter(code)
    Controller(again, clock=lambda: NOW).reconcile(_body(writer.last_status), Observed())
    assert ("status", None) not in again.calls
    assert not [c for c in again.calls if c[0] == "event"]


def test_a_stored_spec_that_no_longer_validates_is_exported_as_stalled() -> None:
    metrics.forget_service("ns", "llama-8b")
    body = _body()
    body["spec"]["decode"]["replicas"]["min"] = -1  # e.g. stored before a CRD upgrade
    writer = Writer()
    Controller(writer, clock=lambda: NOW).reconcile(body, Observed())
    assert _conditions(writer.last_status)["Stalled"] == ("True", "InvalidSpec")
    assert _stalled_series() == 1.0


def _stalled_series() -> float | None:
    return value(
        "pdfleet_service_condition", namespace="ns", pdfleet_service="llama-8b", condition="Stalled"
    )


def test_a_transient_error_still_raises_for_a_retry() -> None:
    with (
        counted("pdfleet_reconcile_errors_total") as errors,
        counted("pdfleet_reconcile_duration_seconds_count") as passes,
        pytest.raises(APIError),
    ):
        Controller(RefusingWriter(503), clock=lambda: NOW).reconcile(_body(), Observed())
    assert errors == {labels(reason="503"): 1.0}
    assert passes == {labels(): 1.0}  # a failed pass is timed too


def test_rejection_message_without_a_json_body() -> None:
    error = APIError(400, "Bad Request", "<html>proxy error</html>")
    manifest = {"kind": "Service", "metadata": {"name": "x-router"}}
    assert rejection_message(manifest, error) == "Service x-router: Bad Request"
