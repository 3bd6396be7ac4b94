"""Small, immutable projections of what the API server holds, built from raw objects.

The operator keeps these (not whole objects) in its watch indexes: they are what planning and
status need, and they keep memory flat with thousands of services. Parsing is pure so tests feed
it plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pdfleet import labels

APPLIED_HASH = f"{labels.GROUP}/applied-hash"


@dataclass(frozen=True)
class ChildRef:
    """A child object the operator applied: enough to skip unchanged writes and find orphans."""

    kind: str
    name: str
    applied_hash: str
    replicas: int | None = None
    """spec.replicas of a StatefulSet or Deployment (another writer may have changed it)."""
    ready_replicas: int = 0
    available_replicas: int = 0
    updated_replicas: int = 0
    status_replicas: int = 0
    observed_generation: int = 0
    generation: int = 0


@dataclass(frozen=True)
class PodInfo:
    """One pod of a pool, as planning and status see it."""

    name: str
    role: str
    ordinal: int
    phase: str
    ready: bool
    pod_ip: str | None = None
    node: str | None = None
    terminating: bool = False
    draining_since: str | None = None
    unschedulable: str | None = None
    """The scheduler's message when the pod cannot be placed."""
    unschedulable_since: str | None = None

    @property
    def pending(self) -> bool:
        return self.phase == "Pending" and not self.terminating


@dataclass(frozen=True)
class Observed:
    """Everything observed about one InferenceService's children."""

    children: Mapping[tuple[str, str], ChildRef] = field(default_factory=dict)
    pods: tuple[PodInfo, ...] = ()

    def child(self, kind: str, name: str) -> ChildRef | None:
        return self.children.get((kind, name))

    def pods_of(self, role: str) -> list[PodInfo]:
        return sorted((p for p in self.pods if p.role == role), key=lambda p: p.ordinal)


def _ordinal(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in status.get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def child_ref(obj: Mapping[str, Any]) -> ChildRef:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    replicas = spec.get("replicas") if obj.get("kind") in ("StatefulSet", "Deployment") else None
    return ChildRef(
        kind=str(obj.get("kind")),
        name=str(meta.get("name")),
        applied_hash=str((meta.get("annotations") or {}).get(APPLIED_HASH, "")),
        replicas=replicas,
        ready_replicas=int(status.get("readyReplicas") or 0),
        available_replicas=int(status.get("availableReplicas") or 0),
        updated_replicas=int(status.get("updatedReplicas") or 0),
        status_replicas=int(status.get("replicas") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        generation=int(meta.get("generation") or 0),
    )


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = _condition(status, "Ready").get("status") == "True"
    scheduled = _condition(status, "PodScheduled")
    unschedulable = scheduled.get("reason") == "Unschedulable"
    return PodInfo(
        name=str(meta.get("name")),
        role=str((meta.get("labels") or {}).get(labels.ROLE, "")),
        ordinal=_ordinal(str(meta.get("name"))),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        pod_ip=status.get("podIP"),
        node=spec.get("nodeName"),
        terminating=meta.get("deletionTimestamp") is not None,
        draining_since=(meta.get("annotations") or {}).get(labels.DRAINING),
        unschedulable=str(scheduled.get("message") or "") if unschedulable else None,
        unschedulable_since=scheduled.get("lastTransitionTime") if unschedulable else None,
    )


def observed_from(objects: Iterable[Mapping[str, Any]]) -> Observed:
    """Build an Observed from raw child objects and pods (as listed or watched)."""
    children: dict[tuple[str, str], ChildRef] = {}
    pods: list[PodInfo] = []
    for obj in objects:
        if obj.get("kind") == "Pod":
            pods.append(pod_info(obj))
        else:
            ref = child_ref(obj)
            children[(ref.kind, ref.name)] = ref
    return Observed(children=children, pods=tuple(pods))


def index_lags(seen: ChildRef | None, written: ChildRef, age_s: float, fresh_s: float) -> bool:
    """Whether the watch index still shows a child as it was before this operator wrote it
    `age_s` ago. Workloads carry a generation the API server bumps on every spec change, so
    an older one is stale however long the index takes (seen lagging by more than 10 s under
    load), and an equal or newer one is the truth, ours or another writer's. Other kinds
    (and a child missing from the index, which may have been deleted since) count as stale
    only for `fresh_s` while they show another applied hash."""
    if seen is not None and seen.generation and written.generation:
        return seen.generation < written.generation
    changed = seen is None or seen.applied_hash != written.applied_hash
    return changed and age_s < fresh_s


def overlay(
    observed: Observed,
    written: Mapping[tuple[str, str], tuple[ChildRef, float]],
    fresh_s: float,
) -> Observed:
    """The observed children with what this operator has written laid over them where the
    index has not caught up (`index_lags`); `written` maps a child to (ref, age in seconds).

    Without this, the next pass would compare against the old object and write the same
    manifest again, and a drain would read a pool's old size and hold it there."""
    children = dict(observed.children)
    for key, (ref, age_s) in written.items():
        if index_lags(children.get(key), ref, age_s, fresh_s):
            children[key] = ref
    return Observed(children=children, pods=observed.pods)


def with_marks(observed: Observed, marks: Mapping[str, str | None]) -> Observed:
    """The observed pods with drain marks this operator has just written (None: unmarked)
    laid over them, while the pod index has not caught up."""
    if not marks:
        return observed
    pods = tuple(
        replace(p, draining_since=marks[p.name])
        if p.name in marks and not p.terminating and p.draining_since != marks[p.name]
        else p
        for p in observed.pods
    )
    return Observed(children=observed.children, pods=pods)
