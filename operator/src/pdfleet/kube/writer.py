"""The one seam through which the operator writes to the API server.

Where it fits: the controller and its steps (drain, preflight) take a `Writer`; in the operator
it is `pdfleet.kube.api.KubeWriter`, in the unit tests `tests.unit.fakes.Writer`. Every method
raises `pdfleet.kube.errors.APIError` for an answer that is not a success, except `event`,
which never raises (an Event must not fail a reconcile).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Writer(Protocol):
    def apply(self, manifest: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Server-side apply of a child; the object the API server holds afterwards."""
        ...

    def delete(self, kind_name: str, name: str, namespace: str) -> None:
        """Delete an object; one that is already gone is not an error."""
        ...

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch an InferenceService's status subresource."""
        ...

    def patch_merge(
        self, kind_name: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> None:
        """Merge-patch an object (a pod's drain annotation)."""
        ...

    def event(
        self, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Record an Event about an object, without waiting for it."""
        ...
