"""How the operator reads the API server's refusals (kube/errors.py)."""

from __future__ import annotations

import json

from pdfleet.kube.errors import APIError


def _refusal(status: int, body: dict[str, object] | str) -> APIError:
    return APIError(status, "test", body if isinstance(body, str) else json.dumps(body))


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
    assert _refusal(403, TERMINATING).namespace_terminating
    # other refusals are not mistaken for it, whatever their body looks like
    assert not _refusal(403, {"reason": "Forbidden", "code": 403}).namespace_terminating
    assert not _refusal(422, TERMINATING).namespace_terminating
    assert not _refusal(403, "<html>proxy error</html>").namespace_terminating
    assert not _refusal(403, {"details": {"causes": ["odd"]}}).namespace_terminating
    assert _refusal(422, {"reason": "Invalid", "code": 422}).refused_for_good
