"""What an InferenceService's children should be, against what the API server holds.

Where it fits: the fault suite (e2e/scenarios/faults.py) and the integration tests ask, after a
fault, whether a service converged: every child the operator would render for the current spec
exists with that render's hash, is owned by the service (one controller reference, its uid), no
other object of the kinds pdfleet writes carries the service's label (no orphan, no duplicate), and
the status reports the current generation. The comparison is pure (`convergence_problems`);
`list_children` is the one read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.kube.api import KINDS
from pdfleet.reconcile.observed import APPLIED_HASH
from pdfleet.reconcile.plan import OWNED_KINDS, desired_replicas, with_hash
from pdfleet.render import RenderConfig, render_children
from pdfleet.rollout.plan import PoolLayout


def get_isvc(api: Any, namespace: str, name: str) -> dict[str, Any]:
    custom: Any = client.CustomObjectsApi(api)
    obj: dict[str, Any] = custom.get_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name
    )
    return obj


def patch_isvc(api: Any, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
    """A JSON merge patch of the InferenceService (the user's spec, as kubectl would)."""
    custom: Any = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name, dict(patch)
    )


def pod_summary(api: Any, namespace: str, service: str) -> list[str]:
    """name phase ready, per pod of the service: what a failed convergence check shows."""
    core: Any = client.CoreV1Api(api)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{labels.SERVICE}={service}")
    return [
        f"{p.metadata.name} {p.status.phase} ready="
        + ",".join(c.status for c in p.status.conditions or () if c.type == "Ready")
        + (" terminating" if p.metadata.deletion_timestamp else "")
        for p in pods.items
    ]


def list_children(api: Any, namespace: str, service: str) -> list[dict[str, Any]]:
    """Every object of the kinds pdfleet creates that carries the service's label."""
    selector = f"{labels.SERVICE}={service}"
    found = []
    for kind in OWNED_KINDS:
        path = KINDS[kind].collection(namespace)
        data = api.call_api(
            *api.param_serialize(
                "GET",
                path,
                query_params=[("labelSelector", selector)],
                auth_settings=["BearerToken"],
            )
        ).read()
        for item in json.loads(data)["items"]:
            found.append({**item, "kind": kind})
    return found


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for item in (obj.get("status") or {}).get("conditions") or ():
        if item.get("type") == kind:
            return dict(item)
    return {}


def convergence_problems(
    obj: Mapping[str, Any],
    children: Sequence[Mapping[str, Any]],
    config: RenderConfig | None = None,
    require_ready: bool = True,
) -> list[str]:
    """Why `children` are not what the operator renders for `obj` now (empty: converged).

    `obj` is the InferenceService as read from the API server (spec, status, uid)."""
    meta = obj["metadata"]
    isvc = InferenceService.model_validate(
        {"metadata": meta, "spec": obj.get("spec"), "status": None}
    )
    status = obj.get("status") or {}
    counts = desired_replicas(isvc, status)
    # A pool that went through a paired rollout starts at a later ordinal: the operator keeps
    # that start, so the StatefulSet's own is part of what it renders.
    starts = {
        str(c["metadata"]["labels"].get(labels.ROLE)): int(
            (c["spec"].get("ordinals") or {}).get("start") or 0
        )
        for c in children
        if c["kind"] == "StatefulSet"
    }
    layouts = {role: PoolLayout(counts[role], starts.get(role, 0)) for role in counts}
    desired = {
        (m["kind"], m["metadata"]["name"]): m
        for m in map(with_hash, render_children(isvc, counts, config, layouts))
    }
    problems: list[str] = []
    if status.get("rollout"):
        problems.append(f"rollout in progress: {status['rollout']}")
    if status.get("observedGeneration") != meta.get("generation"):
        problems.append(
            f"observedGeneration {status.get('observedGeneration')} != {meta.get('generation')}"
        )
    if require_ready and _condition(obj, "Ready").get("status") != "True":
        problems.append(f"not Ready: {_condition(obj, 'Ready')}")
    seen: dict[tuple[str, str], int] = {}
    for child in children:
        key = (str(child["kind"]), str(child["metadata"]["name"]))
        seen[key] = seen.get(key, 0) + 1
        want = desired.get(key)
        if want is None:
            problems.append(f"orphan {key[0]}/{key[1]}")
            continue
        got_hash = (child["metadata"].get("annotations") or {}).get(APPLIED_HASH)
        if got_hash != want["metadata"]["annotations"][APPLIED_HASH]:
            problems.append(f"stale {key[0]}/{key[1]} (applied-hash {got_hash})")
        if (
            "replicas" in want.get("spec", {})
            and child["spec"].get("replicas") != (want["spec"]["replicas"])
        ):
            problems.append(f"{key[0]}/{key[1]} replicas {child['spec'].get('replicas')}")
        controllers = [
            ref for ref in child["metadata"].get("ownerReferences") or () if ref.get("controller")
        ]
        if [ref.get("uid") for ref in controllers] != [meta.get("uid")]:
            problems.append(f"{key[0]}/{key[1]} controller owners {controllers}")
    problems += [f"missing {kind}/{name}" for kind, name in desired if (kind, name) not in seen]
    problems += [f"duplicate {k[0]}/{k[1]} x{n}" for k, n in seen.items() if n > 1]
    return problems
