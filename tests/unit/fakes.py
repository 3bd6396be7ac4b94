"""Test doubles for the controller's I/O seams: `Writer` (a `pdfleet.kube.writer.Writer`)
records every call; `Inline` runs submitted work at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from typing import Any

from pdfleet.api.v1alpha1 import InferenceServiceStatus


class Writer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.last_status: dict[str, Any] = {}

    def apply(self, manifest: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        self.calls.append(("apply", (manifest["kind"], manifest.get("spec", {}).get("replicas"))))
        return {}

    def delete(self, kind_name: str, name: str, namespace: str) -> None:
        self.calls.append(("delete", (kind_name, name)))

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        # What the runtime writes must be what the CRD's schema (the same models) admits.
        InferenceServiceStatus.model_validate({k: v for k, v in status.items() if v is not None})
        self.calls.append(("status", None))
        self.last_status = dict(status)

    def patch_merge(
        self, kind_name: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> None:
        self.calls.append(("patch", (kind_name, name, patch)))

    def event(
        self, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        self.calls.append(("event", reason))


class Inline(Executor):
    """Runs each submitted call at once, so a pass finds its run finished."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:
            future.set_exception(err)
        return future
