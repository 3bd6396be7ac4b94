"""Compute the InferenceService status from what was observed: pure, written once per pass.

Conditions follow kstatus: `Ready` (True when the fleet serves as specified), `Reconciling`
(True while converging, `RollingOut` during a paired rollout), `Stalled` (True when it cannot
converge without help: a pod not Ready for longer than spec.progressDeadline, a paired rollout
past it (`RolloutStalled`), or a spec it cannot use). Specific conditions say why:
`RouterReady`, `InsufficientCapacity` (pods the scheduler cannot place for want of nodes, with
its message), `PodsStuck` (a pod that cannot start without help, by name and cause: an image
it cannot pull, a crash loop, a volume, a missing network), `SpecValid` (what only the operator
can check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from pdfleet import labels
from pdfleet.api.types import parse_duration
from pdfleet.api.v1alpha1 import (
    Condition,
    InferenceService,
    RevisionStatus,
    RoleStatus,
    RolloutStatus,
)
from pdfleet.reconcile.observed import Observed, PodInfo, Stuck, parse_time
from pdfleet.reconcile.plan import asleep
from pdfleet.render.common import child_name
from pdfleet.render.router import endpoint
from pdfleet.rollout.plan import RolloutPlan

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
ROUTER_READY = "RouterReady"
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
PODS_STUCK = "PodsStuck"
SPEC_VALID = "SpecValid"

# Reasons of PodsStuck and Stalled besides the pods' own (reconcile/observed.STUCK_WAITING,
# VOLUME_UNAVAILABLE): a Multus network the fabric names that does not exist, and a pod not
# Ready past the deadline with nothing in its status to say why.
NETWORK_MISSING = "NetworkAttachmentMissing"
NO_PROGRESS = "ProgressDeadlineExceeded"

# Status fields other parts of the operator write (the autoscaler, the KV preflight): kept.
OTHER_WRITERS = ("slo", "autoscaler", "kvTransport")

# Conditions whose turning True, or naming another cause while True, is a Warning Event, with
# the Event's reason (None: the condition's own, e.g. ImagePullBackOff).
EVENT_CONDITIONS: tuple[tuple[str, str | None], ...] = (
    (INSUFFICIENT_CAPACITY, "InsufficientCapacity"),
    (PODS_STUCK, None),
    (STALLED, NO_PROGRESS),
)


@dataclass(frozen=True)
class ConditionValue:
    type: str
    status: bool
    reason: str
    message: str = ""


def role_status(pods: Sequence[PodInfo], desired: int) -> dict[str, Any]:
    live = [p for p in pods if not p.terminating]
    ready = sum(1 for p in live if p.ready and not p.draining_since)
    return RoleStatus(
        desired=desired,
        replicas=len(live),
        ready=ready,
        pending=sum(1 for p in live if p.pending),
        draining=sum(1 for p in pods if p.draining_since),
        summary=f"{ready}/{desired}",
    ).wire()


def _age_s(since: str | None, now: datetime) -> float:
    if not since:
        return 0.0
    return (now - parse_time(since)).total_seconds()


def _capacity_condition(pods: Sequence[PodInfo]) -> ConditionValue:
    stuck = [p for p in pods if p.lacks_capacity and not p.terminating]
    if not stuck:
        return ConditionValue(INSUFFICIENT_CAPACITY, False, "AllPodsScheduled")
    names = ", ".join(p.name for p in stuck[:5])
    return ConditionValue(
        INSUFFICIENT_CAPACITY, True, "Unschedulable", f"{names}: {stuck[0].unschedulable}"
    )


def missing_networks(isvc: InferenceService, present: frozenset[str] | None) -> list[str]:
    """The NetworkAttachmentDefinitions the fabric names (spec.kvTransfer.fabric.networks,
    names in the service's namespace) that do not exist; none when `present` is None: the
    operator cannot tell (no Multus CRD in the cluster, or not listed yet)."""
    fabric = isvc.spec.kv_transfer.fabric
    if present is None or fabric is None:
        return []
    return [name for name in fabric.networks if name not in present]


def _network_problem(isvc: InferenceService, observed: Observed) -> str | None:
    missing = missing_networks(isvc, observed.networks)
    if not missing:
        return None
    names = ", ".join(f"{isvc.metadata.namespace}/{name}" for name in missing)
    return (
        f"NetworkAttachmentDefinition {names} not found (spec.kvTransfer.fabric.networks): "
        "workers cannot attach it"
    )


def pod_causes(pods: Sequence[PodInfo], network: str | None) -> list[tuple[PodInfo, Stuck]]:
    """Each live pod that is not Ready, with the cause that keeps it so where one is named,
    by pod name: its own status's (PodInfo.stuck), else, for a worker, a network its fabric
    names that does not exist (`network`: Multus cannot set up its sandbox, and the pod's
    status says only ContainerCreating)."""
    causes: list[tuple[PodInfo, Stuck]] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.terminating or pod.ready:
            continue
        if pod.stuck is not None:
            causes.append((pod, pod.stuck))
        elif network is not None and pod.role in labels.WORKER_ROLES:
            causes.append((pod, (NETWORK_MISSING, network)))
    return causes


def _stuck_condition(
    causes: Sequence[tuple[PodInfo, Stuck]], network: str | None, workers_short: bool
) -> ConditionValue:
    """PodsStuck: the first pod that cannot start without help, by name and its own cause
    (`causes`); else a network the fabric names that does not exist while a worker pool is
    short of Ready workers: their pods say only ContainerCreating, or do not exist yet, so
    the network is named rather than a pod, and the condition does not come and go as they
    appear."""
    if causes:
        pod, (reason, message) = causes[0]
        others = f"; {len(causes) - 1} more pod(s) stuck" if len(causes) > 1 else ""
        return ConditionValue(PODS_STUCK, True, reason, f"pod {pod.name}: {message}{others}")
    if network is not None and workers_short:
        return ConditionValue(PODS_STUCK, True, NETWORK_MISSING, network)
    return ConditionValue(PODS_STUCK, False, "NoPodStuck")


def _stalled_condition(
    isvc: InferenceService,
    pods: Sequence[PodInfo],
    causes: Sequence[tuple[PodInfo, Stuck]],
    capacity: ConditionValue,
    now: datetime,
) -> ConditionValue | None:
    """Stalled=True once a live pod has not been Ready for longer than spec.progressDeadline,
    with what keeps it so: its named cause, else the lack of capacity, else the deadline
    itself (the pod's Events say more). Before the deadline a cause is only reported
    (PodsStuck, InsufficientCapacity): a pull may succeed on retry, a cluster autoscaler may
    add nodes. None while no pod is past the deadline."""
    deadline = isvc.spec.progress_deadline
    deadline_s = parse_duration(deadline)
    overdue = [
        p
        for p in pods
        if not p.terminating and not p.ready and _age_s(p.unready_since, now) >= deadline_s
    ]
    if not overdue:
        return None
    named = {pod.name: cause for pod, cause in causes}
    pod = min(overdue, key=lambda p: (p.name not in named, not p.lacks_capacity, p.name))
    if pod.name in named:
        reason, message = named[pod.name][0], f"pod {pod.name}: {named[pod.name][1]}"
    elif pod.lacks_capacity:
        reason, message = INSUFFICIENT_CAPACITY, capacity.message
    else:
        reason = NO_PROGRESS
        message = f"pod {pod.name}: {pod.phase} and not Ready; its Events say why"
    message += f" (not Ready for more than spec.progressDeadline {deadline})"
    return ConditionValue(STALLED, True, reason, message)


def _router_condition(isvc: InferenceService, observed: Observed) -> ConditionValue:
    if isvc.spec.router.type != "vllm-router":
        return ConditionValue(ROUTER_READY, True, "External", "requests go through your gateway")
    front = None
    if isvc.spec.autoscaling.scale_to_zero is not None:
        # Clients reach the service through the activator (render/activator.py).
        front = observed.child("Deployment", child_name(isvc, labels.ROLE_ACTIVATOR))
        if front is None or front.available_replicas < 1:
            return ConditionValue(
                ROUTER_READY, False, "ActivatorUnavailable", "no activator replica is ready"
            )
    ref = observed.child("Deployment", child_name(isvc, labels.ROLE_ROUTER))
    if ref is None or ref.available_replicas < 1:
        return ConditionValue(
            ROUTER_READY, False, "RouterUnavailable", "no router replica is ready"
        )
    message = f"{ref.available_replicas} router replica(s) ready"
    if front is not None:
        message += f", {front.available_replicas} activator replica(s)"
    return ConditionValue(ROUTER_READY, True, "RouterAvailable", message)


def rolled_out(isvc: InferenceService, observed: Observed) -> bool:
    """Every pool's StatefulSet has seen its latest spec and replaced all its pods.

    A StatefulSet at generation 1 has had one spec since it was created, so every pod it
    made runs it: its pods tell, without waiting for its status. The controller-manager
    writes that status after the pods change, late under load, as when many services start
    at once (docs/benchmarks/scale). (Pods
    adopted from an orphaning delete are the exception: the StatefulSet's status shows their
    rollout once the controller-manager starts it.)"""
    for role in labels.WORKER_ROLES:
        ref = observed.child("StatefulSet", child_name(isvc, role))
        if ref is None:
            return False
        if ref.generation == 1:
            continue
        if ref.observed_generation < ref.generation or ref.updated_replicas < (ref.replicas or 0):
            return False
    return True


def _pools_message(roles: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{role} {s['ready']}/{s['desired']} ready" for role, s in roles.items())


ROLLOUT_STALLED = "RolloutStalled"


def revisions(observed: Observed, serving: str) -> list[dict[str, Any]]:
    """status.revisions: the live worker pods of each KV revision, the serving one first."""
    counts: dict[str, dict[str, int]] = {}
    for pod in observed.pods:
        if pod.role in labels.WORKER_ROLES and pod.kv_revision and not pod.terminating:
            pools = counts.setdefault(pod.kv_revision, dict.fromkeys(labels.WORKER_ROLES, 0))
            pools[pod.role] += 1
    return [
        RevisionStatus(revision=rev, serving=rev == serving, **pools).wire()
        for rev, pools in sorted(counts.items(), key=lambda item: (item[0] != serving, item[0]))
    ]


def rollout_status(
    isvc: InferenceService,
    rollout: RolloutPlan,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> tuple[dict[str, Any] | None, ConditionValue | None]:
    """status.rollout, and Stalled=True once the rollout has waited longer than
    spec.progressDeadline (the serving revision keeps serving meanwhile)."""
    if not rollout.rolling:
        return None, None
    before = (previous or {}).get("rollout") or {}
    started = before.get("startedTime") if before.get("revision") == rollout.target else None
    started = started or now.strftime("%Y-%m-%dT%H:%M:%SZ")
    record = RolloutStatus(
        phase=rollout.phase.value,  # type: ignore[arg-type]
        revision=rollout.target,
        serving_revision=rollout.router,
        started_time=started,
        message=f"waiting for {rollout.waiting}" if rollout.waiting else "",
    ).wire()
    deadline = isvc.spec.progress_deadline
    if _age_s(started, now) < parse_duration(deadline):
        return record, None
    message = (
        f"rollout to revision {rollout.target} past spec.progressDeadline {deadline}, waiting "
        f"for {rollout.waiting}; revision {rollout.router} keeps serving"
    )
    return record, ConditionValue(STALLED, True, ROLLOUT_STALLED, message)


def conditions(
    isvc: InferenceService,
    observed: Observed,
    roles: Mapping[str, Mapping[str, Any]],
    now: datetime,
    writes: int,
    rollout: RolloutPlan | None = None,
    rollout_stalled: ConditionValue | None = None,
    sleeping: bool = False,
) -> list[ConditionValue]:
    """The conditions this module owns. During a paired rollout (`rollout`) the service is
    Ready while the serving revision's pools are, Reconciling says RollingOut, and a rollout
    past its deadline (`rollout_stalled`) is Stalled with the pods' own cause appended."""
    rolling = rollout is not None and rollout.rolling
    router = _router_condition(isvc, observed)
    capacity = _capacity_condition(observed.pods)
    network = _network_problem(isvc, observed)
    pools_ready = all(s["ready"] >= max(1, s["desired"]) for s in roles.values())
    pools_settled = all(s["replicas"] == s["desired"] and not s["draining"] for s in roles.values())
    converged = rolling or rolled_out(isvc, observed)
    ready = pools_ready and router.status and writes == 0 and converged
    # Asleep, the router has no pair to be ready with; the activator answers for the service.
    idle = sleeping and router.reason != "ActivatorUnavailable"
    ready = ready or idle
    stuck = _stuck_condition(pod_causes(observed.pods, None), network, not pools_ready)
    causes = pod_causes(observed.pods, network)
    stalled = _stalled_condition(isvc, observed.pods, causes, capacity, now)
    if rollout_stalled is not None:
        why = f": {stalled.message}" if stalled is not None else ""
        stalled = replace(rollout_stalled, message=rollout_stalled.message + why)
    if idle:
        message = "asleep: both pools at zero; the activator holds the next request and wakes them"
        ready_value = ConditionValue(READY, True, "Idle", message)
    elif ready:
        ready_value = ConditionValue(READY, True, "Serving", _pools_message(roles))
    else:
        if stuck.status:
            reason = PODS_STUCK
        elif capacity.status:
            reason = INSUFFICIENT_CAPACITY
        else:
            reason = "PoolsNotReady"
        if pools_ready and not router.status:
            reason = "RouterNotReady"
        ready_value = ConditionValue(READY, False, reason, _pools_message(roles))
    if stalled is not None:
        reconciling = ConditionValue(RECONCILING, False, "Stalled", stalled.message)
    elif rolling:
        assert rollout is not None
        message = f"{rollout.phase.value} to revision {rollout.target}: {rollout.waiting}"
        reconciling = ConditionValue(RECONCILING, True, "RollingOut", message)
    elif not ready or not pools_settled:
        reconciling = ConditionValue(RECONCILING, True, "Progressing", _pools_message(roles))
    else:
        reconciling = ConditionValue(RECONCILING, False, "Reconciled")
    stalled_value = stalled or ConditionValue(
        STALLED, False, "Progressing" if not ready else "Reconciled"
    )
    return [
        ready_value,
        reconciling,
        stalled_value,
        router,
        capacity,
        stuck,
        ConditionValue(SPEC_VALID, True, "Valid"),
    ]


def _foreign_conditions(
    previous: Mapping[str, Any], values: Sequence[ConditionValue]
) -> list[dict[str, Any]]:
    """Conditions another part of the operator owns (e.g. the autoscaler's MetricsAvailable),
    kept as they are."""
    ours = {value.type for value in values}
    return [dict(c) for c in previous.get("conditions") or [] if c.get("type") not in ours]


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    values: Sequence[ConditionValue],
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """metav1.Condition dicts; lastTransitionTime moves only when the status flips."""
    before = {c.get("type"): c for c in previous}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    merged = []
    for value in values:
        status: Literal["True", "False"] = "True" if value.status else "False"
        old = before.get(value.type) or {}
        changed = old.get("status") != status
        condition = Condition(
            type=value.type,
            status=status,
            reason=value.reason,
            message=value.message,
            last_transition_time=stamp if changed else old.get("lastTransitionTime", stamp),
            observed_generation=generation,
        )
        merged.append(condition.wire())
    return merged


def compute_status(
    isvc: InferenceService,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    desired: Mapping[str, int],
    now: datetime,
    writes: int,
    rollout: RolloutPlan | None = None,
) -> dict[str, Any]:
    """The full status for this pass. Fields another writer owns (OTHER_WRITERS) are kept."""
    previous = dict(previous or {})
    roles = {role: role_status(observed.pods_of(role), desired[role]) for role in desired}
    record, rollout_stalled = (
        rollout_status(isvc, rollout, previous, now) if rollout is not None else (None, None)
    )
    sleeping = asleep(isvc, previous)
    values = conditions(isvc, observed, roles, now, writes, rollout, rollout_stalled, sleeping)
    status: dict[str, Any] = {
        **{k: v for k, v in previous.items() if k in OTHER_WRITERS},
        **_scale_to_zero_record(isvc, previous),
        "observedGeneration": isvc.metadata.generation,
        "conditions": merge_conditions(
            previous.get("conditions") or [], values, isvc.metadata.generation, now
        )
        + _foreign_conditions(previous, values),
        **roles,
    }
    url = endpoint(isvc)
    if url:
        status["endpoint"] = url
    if rollout is not None:
        status["revision"] = rollout.target
        status["revisions"] = revisions(observed, rollout.router)
    if record is not None:
        status["rollout"] = record
    return status


def _scale_to_zero_record(isvc: InferenceService, previous: Mapping[str, Any]) -> dict[str, Any]:
    """The autoscaler writes status.scaleToZero; it goes when the spec turns scaleToZero off."""
    record = previous.get("scaleToZero")
    if record is None or isvc.spec.autoscaling.scale_to_zero is None:
        return {}
    return {"scaleToZero": record}


def invalid_status(
    previous: Mapping[str, Any] | None,
    generation: int | None,
    message: str,
    now: datetime,
    reason: str = "InvalidSpec",
) -> dict[str, Any]:
    """Status for a spec the API server accepted but the operator cannot use: one written
    before a CRD upgrade (InvalidSpec), or one whose children the API server refuses
    (ChildRejected, e.g. a malformed node selector key). Stalled with the reason, nothing
    else touched."""
    previous = dict(previous or {})
    values = [
        ConditionValue(READY, False, reason, message),
        ConditionValue(RECONCILING, False, reason, message),
        ConditionValue(STALLED, True, reason, message),
        ConditionValue(SPEC_VALID, False, reason, message),
    ]
    conditions_ = merge_conditions(previous.get("conditions") or [], values, generation, now)
    status = {**previous, "conditions": conditions_ + _foreign_conditions(previous, values)}
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def condition_status(status: Mapping[str, Any] | None, kind: str) -> str | None:
    """The status ("True", "False", ...) of the `kind` condition in `status`; None without."""
    for condition in (status or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return None


def merge_foreign_condition(
    conditions: Sequence[Mapping[str, Any]],
    condition: Mapping[str, str],
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Set one condition another part of the operator owns (e.g. MetricsAvailable), keeping
    its lastTransitionTime unless its status flips."""
    value = ConditionValue(
        condition["type"], condition["status"] == "True", condition["reason"],
        condition.get("message", ""),
    )  # fmt: skip
    merged = merge_conditions(conditions, [value], generation, now)
    return [dict(c) for c in conditions if c.get("type") != value.type] + merged


def condition_events(
    previous: Mapping[str, Any] | None, new: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(reason, message) of the Warning Events `new` is news for (EVENT_CONDITIONS): a
    problem that turned True, or that names another cause. Nothing while it stays as it was:
    a pass runs on every pod event and every resync."""
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or ()}
    events = []
    for kind, event_reason in EVENT_CONDITIONS:
        now = next((c for c in new.get("conditions") or () if c.get("type") == kind), None)
        if now is None or now.get("status") != "True":
            continue
        old = before.get(kind) or {}
        if old.get("status") != "True" or old.get("reason") != now.get("reason"):
            events.append((event_reason or str(now["reason"]), str(now.get("message") or "")))
    return events


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything (the status is written only then)."""
    return dict(old or {}) != dict(new)


# Pool counts that follow pods from one moment to the next; a change to nothing else is
# progress (see progress_only).
POD_COUNTS = ("replicas", "ready", "pending", "draining", "summary")
# Conditions that follow a start-up from one step to the next (pods scheduled, pools ready,
# the router available): while the service is not Ready before and after, their changes are
# progress too. Stalled, SpecValid and PodsStuck report a problem, so they always go out at once.
STARTUP_CONDITIONS = (READY, RECONCILING, ROUTER_READY, INSUFFICIENT_CAPACITY)


def progress_only(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` differs from `old` only in the pools' pod counts, the condition messages
    that quote them and, while Ready stays False, the start-up conditions: Ready did not
    flip, Stalled, SpecValid and PodsStuck did not change, and no decision (a pool's `desired`, the
    autoscaler's blocks) or preflight record changed."""
    starting = old is not None and _not_ready(old) and _not_ready(new)

    def essence(status: Mapping[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in status.items():
            if key == "conditions":
                kept[key] = sorted(
                    (c.get("type"), c.get("status"), c.get("reason"))
                    for c in value
                    if not (starting and c.get("type") in STARTUP_CONDITIONS)
                )
            elif isinstance(value, Mapping) and "summary" in value:  # a pool's block
                kept[key] = {k: v for k, v in value.items() if k not in POD_COUNTS}
            else:
                kept[key] = value
        return kept

    return old is not None and essence(old) == essence(new)


def progress_interval_s(unready: int, least_s: float, fleet_per_s: float, most_s: float) -> float:
    """How long a start-up's progress waits after its last status write while `unready`
    services are not Ready: long enough that their progress together stays under
    `fleet_per_s` writes a second, within [least_s, most_s]."""
    return min(most_s, max(least_s, unready / fleet_per_s))


def _not_ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == READY and c.get("status") == "False"
        for c in status.get("conditions") or ()
    )
