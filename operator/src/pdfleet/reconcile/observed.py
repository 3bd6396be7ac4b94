"""Small, immutable projections of what the API server holds, built from raw objects.

The operator keeps these (not whole objects) in its watch indexes: they are what planning and
status need, and they keep memory flat with thousands of services. Parsing is pure so tests feed
it plain dicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pdfleet import labels

APPLIED_HASH = f"{labels.GROUP}/applied-hash"

Stuck = tuple[str, str]
"""(reason, message): why a pod cannot start without help."""

IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
VOLUME_UNAVAILABLE = "VolumeUnavailable"

# Waiting reasons kubelet gives a container that cannot start without help, and the cause each
# is reported under. A failing pull or start alternates between two of them with every retry
# (ErrImagePull and ImagePullBackOff, RunContainerError and CrashLoopBackOff): one cause, so
# the condition that names it, and its Event, do not flip with each retry. ContainerCreating
# and PodInitializing are progress, not causes: a pod that stays in them is caught by the
# progress deadline (reconcile/status.py).
STUCK_WAITING: Mapping[str, str] = {
    "ErrImagePull": IMAGE_PULL_BACK_OFF,
    "ImagePullBackOff": IMAGE_PULL_BACK_OFF,
    "RegistryUnavailable": IMAGE_PULL_BACK_OFF,
    "ErrImageNeverPull": "ErrImageNeverPull",
    "InvalidImageName": "InvalidImageName",
    "ImageInspectError": "ImageInspectError",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
    "RunContainerError": CRASH_LOOP_BACK_OFF,
    "CrashLoopBackOff": CRASH_LOOP_BACK_OFF,
}

# What the scheduler says of a pod whose volumes keep it off every node: a claim that does not
# exist or is not bound, volumes no node can reach. No node a cluster autoscaler adds would
# take it, so it is not a lack of capacity.
VOLUME_PROBLEM = re.compile(r"persistent ?volume|volume node affinity", re.IGNORECASE)

# A container's last words (its termination message) kept in a condition: enough to name the
# error, not a whole traceback, for every pod the informer holds.
LAST_WORDS_CHARS = 200


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
    ordinals_start: int = 0
    """A StatefulSet's spec.ordinals.start: its first pod's ordinal."""
    partition: int = 0
    """A StatefulSet's rolling-update partition: pods at positions below it keep the
    previous revision (a surge of a paired rollout, pdfleet.rollout)."""
    kv_revision: str | None = None
    """The KV revision label of a workload's pod template (the router's: the one it pairs)."""


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
    """The scheduler's message when the pod cannot be placed, whatever the cause: such a pod
    is no capacity (the autoscaler does not count it)."""
    stuck: Stuck | None = None
    """Why the pod cannot start without help, when its status names a cause: a container
    kubelet cannot pull, create or keep running, or volumes the scheduler cannot place.
    None while it starts, runs, or waits for capacity."""
    unready_since: str | None = None
    """When its current spell of not being Ready began (RFC 3339); None while Ready."""
    kv_revision: str | None = None
    """Its KV revision label (pdfleet.rollout.revision); None on pods made before it."""

    @property
    def pending(self) -> bool:
        return self.phase == "Pending" and not self.terminating

    @property
    def lacks_capacity(self) -> bool:
        """Unschedulable for want of nodes (GPUs, RDMA units, matching labels, tolerated
        taints), which a cluster autoscaler or a freed node can fix: not for its volumes."""
        return self.unschedulable is not None and self.stuck is None


@dataclass(frozen=True)
class Observed:
    """Everything observed about one InferenceService's children."""

    children: Mapping[tuple[str, str], ChildRef] = field(default_factory=dict)
    pods: tuple[PodInfo, ...] = ()
    networks: frozenset[str] | None = None
    """Names of the Multus NetworkAttachmentDefinitions in the service's namespace; None when
    the operator cannot tell (their CRD is not installed, or not listed yet)."""

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
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    rolling = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
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
        ordinals_start=int((spec.get("ordinals") or {}).get("start") or 0),
        partition=int(rolling.get("partition") or 0),
        kv_revision=template_labels.get(labels.KV_REVISION),
    )


def parse_time(text: str) -> datetime:
    """A Kubernetes timestamp ("2026-01-02T03:04:05Z") as an aware datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def volume_problem(message: str) -> bool:
    """Whether every reason the scheduler gives for passing over the nodes is about the pod's
    volumes. Its message reads "0/5 nodes are available: <count> <reason>, <count> <reason>.
    preemption: ...", or names one reason when no node was even tried (a claim not found).
    A mix (some nodes lack GPUs, others the volume) is capacity: more nodes may help."""
    head = message.split(" preemption:", 1)[0]
    _, counted, reasons = head.partition("nodes are available: ")
    parts = [part for part in (reasons if counted else head).rstrip(" .").split(", ") if part]
    return bool(parts) and all(VOLUME_PROBLEM.search(part) for part in parts)


def _last_failure(container: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's latest run when it failed (a non-zero exit code): the one that has
    just ended (state.terminated), else the one before (lastState.terminated). A container
    that has just completed (an init container done) has no failure."""
    ended = (container.get("state") or {}).get("terminated")
    if ended is None:
        ended = (container.get("lastState") or {}).get("terminated")
    return dict(ended) if ended and ended.get("exitCode") else None


def _exit_message(name: str, ended: Mapping[str, Any]) -> str:
    """'container vllm exited with OOMKilled (exit code 137): <its last words>'."""
    text = f"container {name} exited with {ended.get('reason') or 'Error'} "
    text += f"(exit code {ended.get('exitCode')})"
    words = str(ended.get("message") or "").strip()
    return f"{text}: {words[:LAST_WORDS_CHARS]}" if words else text


def container_stuck(container: Mapping[str, Any], unready_since: str | None) -> Stuck | None:
    """Why one container (or init container) cannot start without help, from its status.

    A crash loop is a cause while the container waits to restart, and also while it has just
    ended or runs again, not ready, after failing in the pod's current spell of not being
    Ready: otherwise the cause would come and go with every restart. A failure from before
    that spell (the container was Ready since) is history, not a cause."""
    name = str(container.get("name"))
    waiting = (container.get("state") or {}).get("waiting") or {}
    reason = STUCK_WAITING.get(str(waiting.get("reason")))
    failed = _last_failure(container)
    if reason == CRASH_LOOP_BACK_OFF and failed is not None:
        return reason, _exit_message(name, failed)
    if reason is not None:
        return reason, f"container {name}: {waiting.get('message') or waiting.get('reason')}"
    if not (failed and unready_since and failed.get("finishedAt")) or container.get("ready"):
        return None
    if parse_time(failed["finishedAt"]) < parse_time(unready_since):
        return None
    return CRASH_LOOP_BACK_OFF, _exit_message(name, failed)


def pod_stuck(
    status: Mapping[str, Any], unschedulable: str | None, since: str | None
) -> Stuck | None:
    """The first cause that keeps a pod from starting without help: volumes the scheduler
    cannot place, then its init containers (they run first), then its containers."""
    if unschedulable is not None:
        return (VOLUME_UNAVAILABLE, unschedulable) if volume_problem(unschedulable) else None
    containers = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]
    return next(
        (cause for c in containers if (cause := container_stuck(c, since)) is not None), None
    )


def _unready_since(
    meta: Mapping[str, Any], ready: Mapping[str, Any], scheduled: Mapping[str, Any]
) -> str | None:
    """When the pod's current spell of not being Ready began: Ready's last transition, or,
    before a kubelet reported one, the scheduler's verdict or the pod's creation."""
    if ready.get("status") == "True":
        return None
    since = ready.get("lastTransitionTime") or scheduled.get("lastTransitionTime")
    return since or meta.get("creationTimestamp")


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready_condition = _condition(status, "Ready")
    ready = ready_condition.get("status") == "True"
    scheduled = _condition(status, "PodScheduled")
    unschedulable = scheduled.get("reason") == "Unschedulable"
    message = str(scheduled.get("message") or "") if unschedulable else None
    since = _unready_since(meta, ready_condition, scheduled)
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
        unschedulable=message,
        stuck=None if ready else pod_stuck(status, message, since),
        unready_since=since,
        kv_revision=(meta.get("labels") or {}).get(labels.KV_REVISION),
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
    an older one is stale however long the index takes (many seconds under load), and an
    equal or newer one is the truth, ours or another writer's. Other kinds
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
    return replace(observed, children=children)


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
    return replace(observed, pods=pods)
