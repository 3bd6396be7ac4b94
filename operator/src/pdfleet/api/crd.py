"""Generate the InferenceService CustomResourceDefinition from the pydantic models.

`make manifests` writes the result to crds/; a unit test regenerates it and fails on drift.
Pydantic's JSON Schema is close to what Kubernetes wants; this module makes it structural:
references inlined, `Optional` unwrapped to "may be absent", titles and `additionalProperties:
false` dropped, and the metadata/apiVersion/kind stubs every CRD carries.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService

CRD_FILE = f"{labels.GROUP}_{labels.PLURAL}.yaml"

_DROPPED_KEYS = ("title", "additionalProperties")


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Resolve $ref against defs everywhere, merging sibling keys (a field's description wins
    over its type's docstring)."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **siblings}, defs)
    return {key: _inline(value, defs) for key, value in node.items()}


def _unwrap_optional(node: dict[str, Any]) -> dict[str, Any]:
    """`X | None` becomes plain X: absence, not null, is how Kubernetes spells "unset"."""
    variants = node.get("anyOf")
    if not variants or not any(v.get("type") == "null" for v in variants):
        return node
    rest = [v for v in variants if v.get("type") != "null"]
    merged = {k: v for k, v in node.items() if k != "anyOf"}
    if len(rest) == 1:
        merged = {**rest[0], **merged}
    else:
        merged["anyOf"] = rest
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = _unwrap_optional(node)
    if isinstance(node.get("description"), str):
        # Docstrings are wrapped for the source; kubectl explain wraps on its own.
        node["description"] = " ".join(node["description"].split())
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS and not (key == "additionalProperties" and value is not False):
            continue
        if key == "properties":
            out[key] = {name: _structural(prop) for name, prop in value.items()}
        else:
            out[key] = _structural(value)
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        # JSON Schema 2020-12 (pydantic) writes the bound itself; Kubernetes' OpenAPI v3 takes
        # the limit plus a boolean.
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[limit], out[bound] = out[bound], True
    if "properties" in out or "x-kubernetes-preserve-unknown-fields" in out:
        out.setdefault("type", "object")
    return out


def _add_enum_types(node: Any) -> None:
    """Enums from Literals need an explicit type in a structural schema."""
    if isinstance(node, list):
        for item in node:
            _add_enum_types(item)
    elif isinstance(node, dict):
        if "enum" in node and "type" not in node:
            node["type"] = "string"
        for value in node.values():
            _add_enum_types(value)


def openapi_schema() -> dict[str, Any]:
    """The structural openAPIV3Schema of the InferenceService resource."""
    raw = InferenceService.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(_inline(raw, raw.pop("$defs", {})))
    _add_enum_types(schema)
    props = schema["properties"]
    props["apiVersion"] = {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation.",
    }
    props["kind"] = {
        "type": "string",
        "description": "Kind is a string value representing the REST resource.",
    }
    props["metadata"] = {"type": "object"}
    props["status"]["description"] = (
        "Observed state, written by the operator once per reconcile pass; observedGeneration "
        "0 until its first pass."
    )
    # kstatus (Flux's health checks, `kubectl wait`-style tools) reads a custom resource
    # without status.observedGeneration as Current. With this default the API server shows a
    # service the operator has not reconciled yet (just created, or the operator down) at
    # observedGeneration 0, behind metadata.generation: InProgress, as docs/gitops.md says.
    props["status"]["default"] = {"observedGeneration": 0}
    schema["required"] = ["spec"]
    return schema


PRINTER_COLUMNS = [
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.prefill.summary",
        "description": "Prefill workers ready/desired.",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.decode.summary",
        "description": "Decode workers ready/desired.",
    },
    {
        "name": "TTFT",
        "type": "string",
        "jsonPath": ".status.slo.ttft",
        "description": "Measured/target time to first token.",
    },
    {
        "name": "ITL",
        "type": "string",
        "jsonPath": ".status.slo.itl",
        "description": "Measured/target inter-token latency.",
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether the service serves within its spec.",
    },
    # Ready's reason tells a start-up (PoolsNotReady) from a fleet that waits on help
    # (PodsStuck, InsufficientCapacity), and Stalled says when the operator has given up
    # waiting: READY False alone looks the same in all three.
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "description": "Why the service is (not) Ready.",
    },
    {
        "name": "Stalled",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Stalled")].status',
        "description": "Whether the fleet cannot converge without help (see the reason).",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Endpoint",
        "type": "string",
        "jsonPath": ".status.endpoint",
        "priority": 1,
        "description": "URL clients send requests to.",
    },
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{labels.PLURAL}.{labels.GROUP}",
            "labels": {labels.APP_PART_OF: "pdfleet"},
        },
        "spec": {
            "group": labels.GROUP,
            "names": {
                "kind": labels.KIND,
                "listKind": f"{labels.KIND}List",
                "plural": labels.PLURAL,
                "singular": labels.SINGULAR,
                "shortNames": list(labels.SHORT_NAMES),
                "categories": list(labels.CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": labels.VERSION,
                    "served": True,
                    "storage": True,
                    # No scale subresource: the spec holds bounds, not a replica count, and a
                    # scale writer (HPA, kubectl scale) would fight GitOps over the user's spec.
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = "# GENERATED by `make manifests` from operator/src/pdfleet/api. Do not edit.\n"


def render_crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)


def main() -> None:
    """Write the CRD into the directory given as the only argument (default: crds/)."""
    import pathlib
    import sys

    out_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "crds")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CRD_FILE).write_text(render_crd_yaml())


if __name__ == "__main__":
    main()
