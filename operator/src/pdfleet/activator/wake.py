"""The activator's wake signal in a cluster: an annotation on its InferenceService.

Where it fits: pdfleet.activator.server calls an `AnnotationWake` when it holds the first
request for a service whose router has no pair (and again every `wake_every_s` while requests
stay held). The merge patch sets `pdfleet.dev/wake-requested: <RFC 3339 time>`; the new value
is a change the operator's watch sees at once (reading it is not built yet:
docs/design/scale-to-zero.md). The activator needs RBAC to patch that one object.

The kubernetes client blocks, so the patch runs in a thread: the event loop that holds and
streams requests never waits on the API server. Failures are raised to the caller, the
server's wake task, which logs and counts them; no request ever sees them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from pdfleet import labels
from pdfleet.kube.api import KubeWriter

FIELD_MANAGER = "pdfleet-activator"
# Connect and read: a signal that cannot get through in this long is retried by the next one.
TIMEOUT_S = 10.0


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wake_patch(moment: datetime) -> dict[str, Any]:
    """The merge patch: only this annotation changes, every other key stays."""
    return {"metadata": {"annotations": {labels.WAKE_REQUESTED: rfc3339(moment)}}}


class AnnotationWake:
    """`await wake()` annotates the InferenceService `namespace/name` with the time."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self._writer = KubeWriter(api, FIELD_MANAGER)
        self.namespace, self.name = namespace, name
        self._now = now
        self._timeout_s = timeout_s

    async def __call__(self) -> None:
        await asyncio.to_thread(self.patch)

    def patch(self) -> None:
        """One merge patch; raises APIError for any answer but a success (404: no such
        service, 403: no RBAC for it), or the client's own error when there is no answer."""
        self._writer.patch_merge(
            labels.KIND,
            self.namespace,
            self.name,
            wake_patch(self._now()),
            timeout=(self._timeout_s, self._timeout_s),
        )
