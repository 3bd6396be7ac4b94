"""Small helpers for integration tests: InferenceService CRUD and waiting on conditions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client

from e2e.platform.children import get_isvc, list_children, patch_isvc
from pdfleet import labels

__all__ = ["get_isvc", "list_children", "patch_isvc"]

T = TypeVar("T")


def custom(api: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create_isvc(
    api: Any,
    namespace: str,
    obj: dict[str, Any],
    dry_run: bool = False,
    field_validation: str | None = None,
) -> dict[str, Any]:
    """Create `obj` in `namespace`; `dry_run`: admission only. `field_validation="Strict"`
    refuses unknown fields (what kubectl apply asks for)."""
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    created = custom(api).create_namespaced_custom_object(
        labels.GROUP,
        labels.VERSION,
        namespace,
        labels.PLURAL,
        obj,
        dry_run="All" if dry_run else None,
        field_validation=field_validation,
    )
    assert isinstance(created, dict), created
    return created


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in (obj.get("status") or {}).get("conditions") or ():
        if item["type"] == kind:
            return dict(item)
    return {}


def is_ready(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return current and condition(obj, "Ready").get("status") == "True"


def wait_for(
    predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2
) -> T:
    """The first truthy value of `predicate`, polled every `interval` for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def wait_ready(api: Any, namespace: str, name: str, timeout: float = 90.0) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def ready() -> dict[str, Any] | None:
        obj = get_isvc(api, namespace, name)
        seen[:] = [obj]
        return obj if is_ready(obj) else None

    try:
        result: dict[str, Any] = wait_for(ready, timeout, f"{namespace}/{name} Ready")
    except AssertionError as error:
        status = (seen[0].get("status") if seen else None) or {}
        conditions = [
            (c["type"], c["status"], c["reason"], c["message"])
            for c in status.get("conditions", [])
        ]
        raise AssertionError(f"{error}; conditions: {conditions}") from None
    return result


def pods(api: Any, namespace: str, service: str) -> list[Any]:
    items: list[Any] = (
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"{labels.SERVICE}={service}")
        .items
    )
    return items
