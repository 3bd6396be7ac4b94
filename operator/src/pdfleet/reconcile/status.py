"""Compute the InferenceService status from what was observed: pure, written once per pass.

Conditions follow kstatus: `Ready` (True when the fleet serves as specified), `Reconciling`
(True while converging), `Stalled` (True when it cannot converge without help). Specific
conditions say why: `RouterReady`, `InsufficientCapacity` (pods the scheduler cannot place,
with its message), `SpecValid` (what only the operator can check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.observed import Observed, PodInfo
from pdfleet.render.common import child_name
from pdfleet.render.router import endpoint

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
ROUTER_READY = "RouterReady"
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
SPEC_VALID = "SpecValid"

# Status fields other parts of the operator write (the autoscaler, the KV preflight): kept.
OTHER_WRITERS = ("slo", "autoscaler", "kvTransport")

# Pods unschedulable for this long make the service Stalled (before that: Reconciling), so a
# cluster autoscaler gets time to add nodes before GitOps tools report a failure.
STALL_AFTER_S = 120.0


@dataclass(frozen=True)
class ConditionValue:
    type: str
    status: bool
    reason: str
    message: str = ""


def role_status(pods: Sequence[PodInfo], desired: int) -> dict[str, Any]:
    live = [p for p in pods if not p.terminating]
    ready = sum(1 for p in live if p.ready and not p.draining_since)
    return {
        "desired": desired,
        "replicas": len(live),
        "ready": ready,
        "pending": sum(1 for p in live if p.pending),
        "draining": sum(1 for p in pods if p.draining_since),
        "summary": f"{ready}/{desired}",
    }


def _age_s(since: str | None, now: datetime) -> float:
    if not since:
        return 0.0
    return (now - datetime.fromisoformat(since.replace("Z", "+00:00"))).total_seconds()


def _capacity_condition(pods: Sequence[PodInfo]) -> ConditionValue:
    stuck = [p for p in pods if p.unschedulable and not p.terminating]
    if not stuck:
        return ConditionValue(INSUFFICIENT_CAPACITY, False, "AllPodsScheduled")
    names = ", ".join(p.name for p in stuck[:5])
    return ConditionValue(
        INSUFFICIENT_CAPACITY, True, "Unschedulable", f"{names}: {stuck[0].unschedulable}"
    )


def _router_condition(isvc: InferenceService, observed: Observed) -> ConditionValue:
    if isvc.spec.router.type != "vllm-router":
        return ConditionValue(ROUTER_READY, True, "External", "requests go through your gateway")
    ref = observed.child("Deployment", child_name(isvc, labels.ROLE_ROUTER))
    if ref is None or ref.available_replicas < 1:
        return ConditionValue(
            ROUTER_READY, False, "RouterUnavailable", "no router replica is ready"
        )
    return ConditionValue(
        ROUTER_READY, True, "RouterAvailable", f"{ref.available_replicas} router replica(s) ready"
    )


def rolled_out(isvc: InferenceService, observed: Observed) -> bool:
    """Every pool's StatefulSet has seen its latest spec and replaced all its pods.

    A StatefulSet at generation 1 has had one spec since it was created, so every pod it
    made runs it: its pods tell, without waiting for its status. The controller-manager
    writes that status after the pods change, late under load: with 300 services starting,
    a median 14 s (p90 23 s) after their pods were ready (docs/benchmarks/scale). (Pods
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


def conditions(
    isvc: InferenceService,
    observed: Observed,
    roles: Mapping[str, Mapping[str, Any]],
    now: datetime,
    writes: int,
) -> list[ConditionValue]:
    router = _router_condition(isvc, observed)
    capacity = _capacity_condition(observed.pods)
    pools_ready = all(s["ready"] >= max(1, s["desired"]) for s in roles.values())
    pools_settled = all(s["replicas"] == s["desired"] and not s["draining"] for s in roles.values())
    ready = pools_ready and router.status and writes == 0 and rolled_out(isvc, observed)
    stuck_since = min(
        (_age_s(p.unschedulable_since, now) for p in observed.pods if p.unschedulable),
        default=0.0,
    )
    stalled = capacity.status and stuck_since >= STALL_AFTER_S
    if ready:
        ready_value = ConditionValue(READY, True, "Serving", _pools_message(roles))
    else:
        reason = "InsufficientCapacity" if capacity.status else "PoolsNotReady"
        if pools_ready and not router.status:
            reason = "RouterNotReady"
        ready_value = ConditionValue(READY, False, reason, _pools_message(roles))
    if stalled:
        reconciling = ConditionValue(RECONCILING, False, "Stalled", capacity.message)
    elif not ready or not pools_settled:
        reconciling = ConditionValue(RECONCILING, True, "Progressing", _pools_message(roles))
    else:
        reconciling = ConditionValue(RECONCILING, False, "Reconciled")
    stalled_value = (
        ConditionValue(STALLED, True, "InsufficientCapacity", capacity.message)
        if stalled
        else ConditionValue(STALLED, False, "Progressing" if not ready else "Reconciled")
    )
    return [
        ready_value,
        reconciling,
        stalled_value,
        router,
        capacity,
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
        status = "True" if value.status else "False"
        old = before.get(value.type) or {}
        changed = old.get("status") != status
        merged.append(
            {
                "type": value.type,
                "status": status,
                "reason": value.reason,
                "message": value.message,
                "lastTransitionTime": stamp if changed else old.get("lastTransitionTime", stamp),
            }
        )
        if generation is not None:
            merged[-1]["observedGeneration"] = generation
    return merged


def compute_status(
    isvc: InferenceService,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    desired: Mapping[str, int],
    now: datetime,
    writes: int,
) -> dict[str, Any]:
    """The full status for this pass. Fields another writer owns (OTHER_WRITERS) are kept."""
    previous = dict(previous or {})
    roles = {role: role_status(observed.pods_of(role), desired[role]) for role in desired}
    values = conditions(isvc, observed, roles, now, writes)
    status: dict[str, Any] = {
        **{k: v for k, v in previous.items() if k in OTHER_WRITERS},
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
    return status


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


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything (the status is written only then)."""
    return dict(old or {}) != dict(new)


# Pool counts that follow pods from one moment to the next; a change to nothing else is
# progress (see progress_only).
POD_COUNTS = ("replicas", "ready", "pending", "draining", "summary")
# Conditions that follow a start-up from one step to the next (pods scheduled, pools ready,
# the router available): while the service is not Ready before and after, their changes are
# progress too. Stalled and SpecValid report a problem, so they always go out at once.
STARTUP_CONDITIONS = (READY, RECONCILING, ROUTER_READY, INSUFFICIENT_CAPACITY)


def progress_only(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` differs from `old` only in the pools' pod counts, the condition messages
    that quote them and, while Ready stays False, the start-up conditions: Ready did not
    flip, Stalled and SpecValid did not change, and no decision (a pool's `desired`, the
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
