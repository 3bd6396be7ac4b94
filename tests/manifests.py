"""Checks of rendered Kubernetes objects that need no cluster and no toolchain binary.

Built-in kinds are validated against the Kubernetes 1.36 OpenAPI schemas that
`kubernetes-validate` bundles (strict: unknown fields are errors). Used by the unit tests of
the operator's renders and by the chart tests (tests/integration/chart), which render with helm.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

KUBE_VERSION = "1.36.0"

Manifest = dict[str, Any]


def schema_errors(manifest: Manifest) -> str | None:
    """None when `manifest` is valid against the Kubernetes schema, else the error."""
    try:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return f"{error.message} at {'.'.join(map(str, error.path))}"
    return None


def by_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [m for m in by_kind(manifests, kind) if name in (None, m["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
