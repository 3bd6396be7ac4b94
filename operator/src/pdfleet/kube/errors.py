"""The API server's refusals, as the operator reads them.

Where it fits: `pdfleet.kube.api.KubeWriter` turns every non-2xx answer into an `APIError`, so
nothing above `pdfleet.kube` handles the kubernetes client's own exception types. The
controller asks an error what kind of refusal it is (for good, or because the namespace is
going) and what the API server said, in words a user can act on; the work queue reads its
status and Retry-After. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Answers that refuse an object until someone changes the spec (400, 422: malformed or invalid)
# or the operator's rights (403: e.g. a chart older than a kind the spec asks for).
REFUSED_FOR_GOOD = (400, 403, 422)
# Server-side apply answers 500, not 422, when the applied object does not fit the schema at
# all (a string where a map belongs, an unknown field in a free-form part).
TYPED_PATCH_FAILURE = "failed to create typed patch object"


class APIError(Exception):
    """A request the API server answered with an error status (or that never got an answer:
    status 0). `body` is the raw answer, normally a metav1.Status in JSON."""

    def __init__(
        self,
        status: int,
        reason: str = "",
        body: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.reason = reason
        self.body = body
        self.headers: Mapping[str, str] = dict(headers or {})

    def _answer(self) -> dict[str, Any]:
        """The metav1.Status the API server sent, or {} for a body that is not one (a
        proxy's HTML page, an empty answer)."""
        try:
            answer = json.loads(self.body or "{}")
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    @property
    def refused_for_good(self) -> bool:
        """Whether the API server refused the object itself (retrying cannot help)."""
        if self.status in REFUSED_FOR_GOOD:
            return True
        return self.status == 500 and TYPED_PATCH_FAILURE in self.body

    @property
    def namespace_terminating(self) -> bool:
        """Whether a write was refused because its namespace is being deleted."""
        if self.status != 403:
            return False
        details = self._answer().get("details")
        causes = (details.get("causes") if isinstance(details, dict) else None) or ()
        return any(
            isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes
        )

    @property
    def message(self) -> str:
        """What the API server said (its Status message), else the HTTP reason."""
        return str(self._answer().get("message") or self.reason)
