"""How the controller reads the API server's refusals of a child (controller.py)."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from pdfleet.controller import is_rejection, namespace_terminating


def _refusal(status: int, body: dict[str, object] | str) -> ApiException:
    error = ApiException(status=status, reason="test")
    error.body = body if isinstance(body, str) else json.dumps(body)
    return error


TERMINATING = {
    "kind": "Status",
    "status": "Failure",
    "message": 'serviceaccounts "x" is forbidden: unable to create new content in namespace '
    "ns because it is being terminated",
    "reason": "Forbidden",
    "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
    "code": 403,
}


def test_a_terminating_namespace_is_not_a_rejection_to_report() -> None:
    assert namespace_terminating(_refusal(403, TERMINATING))
    # other refusals are not mistaken for it, whatever their body looks like
    assert not namespace_terminating(_refusal(403, {"reason": "Forbidden", "code": 403}))
    assert not namespace_terminating(_refusal(422, TERMINATING))
    assert not namespace_terminating(_refusal(403, "<html>proxy error</html>"))
    assert not namespace_terminating(_refusal(403, {"details": {"causes": ["odd"]}}))
    assert is_rejection(_refusal(422, {"reason": "Invalid", "code": 422}))
