"""Plan one reconcile pass: desired children + observed children -> writes, deletes, status.

Pure: the I/O layer (pdfleet.kube) executes the plan. A child is written only when what we
would apply differs from what we applied last time (a hash of the manifest, kept in an
annotation) or another writer changed its replica count, so an unchanged InferenceService
costs no API writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.observed import APPLIED_HASH, ChildRef, Observed
from pdfleet.render import Manifest, RenderConfig, render_children
from pdfleet.render.common import child_name
from pdfleet.rollout.plan import PoolLayout, PoolState, RolloutPlan, plan_rollout
from pdfleet.rollout.revision import kv_revision

# Kinds the operator creates; anything of these kinds labelled for a service and not
# desired any more is an orphan and gets deleted.
OWNED_KINDS = (
    "ServiceAccount",
    "Service",
    "PodDisruptionBudget",
    "StatefulSet",
    "Role",
    "RoleBinding",
    "Deployment",
    "NetworkPolicy",
)
SCALABLE_KINDS = ("StatefulSet", "Deployment")


def manifest_hash(manifest: Manifest) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_hash(manifest: Manifest) -> Manifest:
    """The manifest carrying the hash of itself, so the next pass can tell it is unchanged."""
    digest = manifest_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), APPLIED_HASH: digest}
    return {**manifest, "metadata": meta}


def _key(manifest: Manifest) -> tuple[str, str]:
    return str(manifest["kind"]), str(manifest["metadata"]["name"])


def needs_write(desired: Manifest, observed: ChildRef | None) -> bool:
    if observed is None:
        return True
    if observed.applied_hash != desired["metadata"]["annotations"][APPLIED_HASH]:
        return True
    # Someone else scaled it (kubectl scale, an HPA): take the count back.
    return desired["kind"] in SCALABLE_KINDS and observed.replicas != desired["spec"]["replicas"]


def write_waves(manifests: Sequence[Manifest]) -> list[list[Manifest]]:
    """The applies of a pass in waves whose members go out together, in render order within
    each: first whatever a workload's pods use (ServiceAccount, Services, budgets, RBAC,
    NetworkPolicies), then the workloads. A pod whose ServiceAccount does not exist yet is
    refused, and its StatefulSet controller backs off before trying again."""
    uses = [m for m in manifests if m["kind"] not in SCALABLE_KINDS]
    workloads = [m for m in manifests if m["kind"] in SCALABLE_KINDS]
    return [wave for wave in (uses, workloads) if wave]


@dataclass(frozen=True)
class ChildPlan:
    """The writes and deletes one pass needs."""

    apply: list[Manifest] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)
    unchanged: int = 0


def plan_children(
    stamped: Sequence[Manifest], observed: Observed, held: Set[tuple[str, str]] = frozenset()
) -> ChildPlan:
    """`stamped`: the desired children, each carrying its hash (`with_hash`); `held`: those
    left as they are this pass (wanted, so never deleted, but not written)."""
    wanted = {_key(manifest) for manifest in stamped}
    apply = [m for m in stamped if _key(m) not in held and needs_write(m, observed.child(*_key(m)))]
    delete = sorted(key for key in observed.children if key not in wanted)
    return ChildPlan(apply=apply, delete=delete, unchanged=len(stamped) - len(apply))


class RenderCache:
    """Each service's last rendered, hash-stamped children, with what they were rendered
    from. A resync pass of an unchanged service would otherwise render and hash the same
    dozen manifests again, a large share of an idle operator's CPU (docs/benchmarks/scale).

    The inputs are the object's uid and generation (the API server bumps it on every spec
    change; the children are rendered from name, namespace, uid and spec), the pool sizes and
    the operator's settings. Without a generation (an object that never came from an API
    server) nothing is cached."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[Hashable, list[Manifest]]] = {}

    def stamped(
        self,
        isvc: InferenceService,
        counts: Mapping[str, int],
        config: RenderConfig | None,
        layouts: Mapping[str, PoolLayout] | None = None,
        router_revision: str | None = None,
    ) -> list[Manifest]:
        meta = isvc.metadata
        key = (str(meta.namespace), str(meta.name))
        shape = tuple(sorted((r, (lay.start, lay.partition)) for r, lay in (layouts or {}).items()))
        inputs = (meta.uid, meta.generation, tuple(sorted(counts.items())), config, shape,
                  router_revision)  # fmt: skip
        cached = self._last.get(key)
        if cached is not None and cached[0] == inputs:
            return cached[1]
        rendered = render_children(isvc, counts, config, layouts, router_revision)
        stamped = [with_hash(m) for m in rendered]
        if meta.generation is not None:
            self._last[key] = (inputs, stamped)
        return stamped

    def forget(self, namespace: str, name: str) -> None:
        self._last.pop((namespace, name), None)


def asleep(isvc: InferenceService, status: Mapping[str, Any] | None) -> bool:
    """Both pools are asleep by the scaleToZero rule (autoscale/idle.py): the activator
    holds requests, so a service with no worker is still what its user asked for."""
    record = (status or {}).get("scaleToZero") or {}
    return isvc.spec.autoscaling.scale_to_zero is not None and record.get("state") == "Idle"


def desired_replicas(isvc: InferenceService, status: Mapping[str, Any] | None) -> dict[str, int]:
    """How many workers each pool should have now.

    Without autoscaling it is the spec's starting count. With it, the autoscaler's last
    decision (kept in status, never in the spec) clamped to the current bounds, so editing
    min/max takes effect at once; asleep (scaleToZero's Idle), zero whatever min says."""
    if asleep(isvc, status):
        return {role: 0 for role in labels.WORKER_ROLES}
    result = {}
    for role in labels.WORKER_ROLES:
        bounds = isvc.spec.role(role).replicas
        decided = ((status or {}).get(role) or {}).get("desired")
        if not isvc.spec.autoscaling.enabled or decided is None:
            result[role] = bounds.start
        else:
            result[role] = min(max(int(decided), bounds.min), bounds.max)
    return result


def router_rolled(isvc: InferenceService, observed: Observed, revision: str) -> bool:
    """Every live router pod pairs `revision`, and its Deployment has seen its latest spec."""
    ref = observed.child("Deployment", child_name(isvc, labels.ROLE_ROUTER))
    pods = [p for p in observed.pods_of(labels.ROLE_ROUTER) if not p.terminating]
    if ref is None or ref.observed_generation < ref.generation or not pods:
        return False
    return all(p.kv_revision == revision for p in pods) and ref.updated_replicas >= (
        ref.replicas or 0
    )


def plan_pools(
    isvc: InferenceService,
    observed: Observed,
    desired: Mapping[str, int],
    pair_proven: bool,
) -> RolloutPlan:
    """The paired rollout's step (pdfleet.rollout.plan) from what the StatefulSets, the
    router and the pods show. `pair_proven`: the KV preflight passed between two pods of the
    spec's revision, or is off."""
    target = kv_revision(isvc)
    pools: dict[str, PoolState | None] = {}
    ready: dict[str, int] = {}
    unlabelled = sum(
        1
        for role in labels.WORKER_ROLES
        for p in observed.pods_of(role)
        if p.kv_revision is None and not p.terminating
    )
    for role in labels.WORKER_ROLES:
        ref = observed.child("StatefulSet", child_name(isvc, role))
        pools[role] = (
            None
            if ref is None
            else PoolState(ref.replicas or 0, ref.ordinals_start, ref.partition, ref.kv_revision)
        )
        ready[role] = sum(
            1
            for p in observed.pods_of(role)
            if p.kv_revision == target and p.ready and not p.terminating and not p.draining_since
        )
    router = observed.child("Deployment", child_name(isvc, labels.ROLE_ROUTER))
    serving = router.kv_revision if router is not None else None
    return plan_rollout(
        target,
        pools,
        serving,
        serving is not None and router_rolled(isvc, observed, serving),
        desired,
        ready,
        pair_proven,
        {role: isvc.spec.role(role).gpus_per_replica for role in labels.WORKER_ROLES},
        isvc.spec.autoscaling.gpu_budget if isvc.spec.autoscaling.enabled else None,
        pinned=isvc.spec.router.type == "vllm-router",
        unlabelled=unlabelled,
    )


def plan(
    isvc: InferenceService,
    observed: Observed,
    status: Mapping[str, Any] | None,
    config: RenderConfig | None = None,
    applied: Mapping[str, int] | None = None,
    cache: RenderCache | None = None,
    rollout: RolloutPlan | None = None,
) -> tuple[dict[str, int], ChildPlan]:
    """The desired replica counts and the child writes.

    `applied` overrides the counts written into the StatefulSets: while a pool drains
    (pdfleet.drain) it stays at its current size until the drained pods may go. `rollout`
    places a paired rollout's revisions (its held StatefulSets are not written)."""
    replicas = desired_replicas(isvc, status)
    counts = {**replicas, **(applied or {})}
    layouts = rollout.pools if rollout is not None else None
    router = rollout.router if rollout is not None else None
    stamped = (cache or RenderCache()).stamped(isvc, counts, config, layouts, router)
    held = {
        ("StatefulSet", child_name(isvc, role))
        for role, layout in (layouts or {}).items()
        if layout.hold
    }
    return replicas, plan_children(stamped, observed, held)
