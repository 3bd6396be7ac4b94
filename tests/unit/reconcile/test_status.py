"""Status: per-role counts, kstatus conditions, stable transition times, no needless writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from pdfleet.api.v1alpha1 import InferenceService, InferenceServiceStatus
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo
from pdfleet.reconcile.status import (
    compute_status,
    invalid_status,
    progress_interval_s,
    progress_only,
    status_changed,
)
from pdfleet.rollout.plan import Phase, RolloutPlan
from tests.spec_cases import sample

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _service() -> InferenceService:
    obj = sample("minimal")
    obj["metadata"].update(namespace="ns", uid="u1", generation=3)
    return InferenceService.model_validate(obj)


def _pod(role: str, ordinal: int, **fields: Any) -> PodInfo:
    base: dict[str, Any] = {"phase": "Running", "ready": True}
    return PodInfo(
        name=f"llama-8b-{role}-{ordinal}", role=role, ordinal=ordinal, **{**base, **fields}
    )


def _sts(role: str, replicas: int = 1, updated: int = 1, generation: int = 1) -> ChildRef:
    return ChildRef(
        kind="StatefulSet", name=f"llama-8b-{role}", applied_hash="h", replicas=replicas,
        updated_replicas=updated, generation=generation, observed_generation=generation,
    )  # fmt: skip


def _router(available: int) -> ChildRef:
    return ChildRef(kind="Deployment", name="llama-8b-router", applied_hash="h", replicas=1,
                    available_replicas=available)  # fmt: skip


def _observed(pods: list[PodInfo], router: int = 1, **sts: ChildRef) -> Observed:
    children = {
        ("StatefulSet", f"llama-8b-{r}"): sts.get(r, _sts(r)) for r in ("prefill", "decode")
    }
    children[("Deployment", "llama-8b-router")] = _router(router)
    return Observed(children=children, pods=tuple(pods))


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


DESIRED = {"prefill": 1, "decode": 1}
ALL_READY = [_pod("prefill", 0), _pod("decode", 0)]


@pytest.mark.parametrize(
    ("pods", "router", "writes", "ready", "reconciling", "stalled"),
    [
        (ALL_READY, 1, 0, "True", "False", "False"),
        (ALL_READY, 1, 2, "False", "True", "False"),  # just wrote children: not settled yet
        (ALL_READY, 0, 0, "False", "True", "False"),  # router not available
        ([_pod("prefill", 0), _pod("decode", 0, ready=False)], 1, 0, "False", "True", "False"),
        (
            [_pod("prefill", 0), _pod("decode", 0, draining_since="t")],
            1,
            0,
            "False",
            "True",
            "False",
        ),
    ],
)
def test_kstatus_conditions(
    pods: list[PodInfo], router: int, writes: int, ready: str, reconciling: str, stalled: str
) -> None:
    status = compute_status(_service(), _observed(pods, router), None, DESIRED, NOW, writes)
    conditions = _conditions(status)
    assert (conditions["Ready"][0], conditions["Reconciling"][0], conditions["Stalled"][0]) == (
        ready, reconciling, stalled,
    )  # fmt: skip
    assert status["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])


def test_rollout_in_progress_is_not_ready() -> None:
    observed = _observed(ALL_READY, decode=_sts("decode", replicas=1, updated=0, generation=2))
    status = compute_status(_service(), observed, None, DESIRED, NOW, 0)
    assert _conditions(status)["Ready"][0] == "False"


def test_a_new_statefulset_is_rolled_out_once_its_pods_are_ready_before_its_status_says() -> None:
    # Created, its pod ready, and the controller-manager has not written its status yet.
    unseen = ChildRef(
        kind="StatefulSet", name="llama-8b-decode", applied_hash="h", replicas=1, generation=1,
    )  # fmt: skip
    status = compute_status(_service(), _observed(ALL_READY, decode=unseen), None, DESIRED, NOW, 0)
    assert _conditions(status)["Ready"] == ("True", "Serving")

    starting = [_pod("prefill", 0), _pod("decode", 0, ready=False)]
    status = compute_status(_service(), _observed(starting, decode=unseen), None, DESIRED, NOW, 0)
    assert _conditions(status)["Ready"][0] == "False"  # its pods still tell


def _unschedulable(since: datetime) -> PodInfo:
    return _pod(
        "decode", 0, phase="Pending", ready=False,
        unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        unready_since=since.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )  # fmt: skip


def test_insufficient_capacity_names_the_scheduler_reason_then_stalls() -> None:
    fresh = [_pod("prefill", 0), _unschedulable(NOW - timedelta(seconds=10))]
    status = compute_status(_service(), _observed(fresh), None, DESIRED, NOW, 0)
    conditions = _conditions(status)
    assert conditions["InsufficientCapacity"] == ("True", "Unschedulable")
    assert conditions["Stalled"][0] == "False" and conditions["Reconciling"][0] == "True"
    message = next(
        c["message"] for c in status["conditions"] if c["type"] == "InsufficientCapacity"
    )
    assert "Insufficient nvidia.com/gpu" in message
    assert status["decode"]["pending"] == 1

    old = [_pod("prefill", 0), _unschedulable(NOW - timedelta(minutes=11))]  # progressDeadline 10m
    conditions = _conditions(compute_status(_service(), _observed(old), None, DESIRED, NOW, 0))
    assert conditions["Stalled"] == ("True", "InsufficientCapacity")
    assert conditions["Reconciling"][0] == "False"


def test_role_counts_and_summary() -> None:
    pods = [
        _pod("decode", 0),
        _pod("decode", 1, draining_since="t"),
        _pod("decode", 2, phase="Pending", ready=False),
        _pod("decode", 3, terminating=True, ready=False),
    ]
    status = compute_status(_service(), _observed(pods), None, {"prefill": 0, "decode": 2}, NOW, 0)
    assert status["decode"] == {
        "desired": 2, "replicas": 3, "ready": 1, "pending": 1, "draining": 1, "summary": "1/2",
    }  # fmt: skip


def test_second_pass_with_nothing_new_writes_nothing() -> None:
    first = compute_status(_service(), _observed(ALL_READY), None, DESIRED, NOW, 0)
    later = NOW + timedelta(minutes=10)
    second = compute_status(_service(), _observed(ALL_READY), first, DESIRED, later, 0)
    assert not status_changed(first, second)


def test_transition_time_moves_only_on_flips() -> None:
    first = compute_status(_service(), _observed(ALL_READY, router=0), None, DESIRED, NOW, 0)
    later = NOW + timedelta(minutes=1)
    second = compute_status(_service(), _observed(ALL_READY), first, DESIRED, later, 0)
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times["Ready"] == "2026-11-29T12:01:00Z"
    assert times["Stalled"] == "2026-11-29T12:00:00Z"


def test_autoscaler_fields_survive_a_pass() -> None:
    previous = {"autoscaler": {"lastDecision": "prefill 1->2"}, "slo": {"ttft": "400ms/1s"}}
    status = compute_status(_service(), _observed(ALL_READY), previous, DESIRED, NOW, 0)
    assert status["autoscaler"] == previous["autoscaler"] and status["slo"] == previous["slo"]


def test_invalid_spec_is_stalled_with_the_message() -> None:
    status = invalid_status(None, 4, "spec.prefill.replicas.min: bad", NOW)
    conditions = _conditions(status)
    assert conditions["Stalled"] == ("True", "InvalidSpec")
    assert conditions["SpecValid"] == ("False", "InvalidSpec")
    assert status["observedGeneration"] == 4


def test_conditions_owned_elsewhere_are_kept() -> None:
    metrics = {"type": "MetricsAvailable", "status": "False", "reason": "PrometheusDown"}
    status = compute_status(
        _service(), _observed(ALL_READY), {"conditions": [metrics]}, DESIRED, NOW, 0
    )
    assert metrics in status["conditions"]


def test_pod_counts_alone_are_progress_and_a_condition_or_decision_is_not() -> None:
    isvc = _service()
    starting = [_pod("prefill", 0, ready=False), _pod("decode", 0, phase="Pending", ready=False)]
    before = compute_status(isvc, _observed(starting), None, DESIRED, NOW, writes=0)
    scheduled = [_pod("prefill", 0, ready=False), _pod("decode", 0, ready=False)]
    after = compute_status(isvc, _observed(scheduled), before, DESIRED, NOW, writes=0)
    assert status_changed(before, after) and progress_only(before, after)

    serving = compute_status(isvc, _observed(ALL_READY), after, DESIRED, NOW, writes=0)
    assert _conditions(serving)["Ready"] == ("True", "Serving")
    assert not progress_only(after, serving)  # Ready flipped: written at once

    scaled = {**after, "decode": {**after["decode"], "desired": 2}}  # an autoscaler decision
    assert not progress_only(after, scaled)
    measured = {**after, "kvTransport": {"fingerprint": "f", "error": ""}}
    assert not progress_only(after, measured)
    assert not progress_only(None, after)


def test_start_up_steps_are_progress_while_ready_stays_false_and_a_problem_is_not() -> None:
    isvc = _service()
    starting = [_pod("prefill", 0, ready=False), _pod("decode", 0, phase="Pending", ready=False)]
    before = compute_status(isvc, _observed(starting, router=0), None, DESIRED, NOW, writes=0)
    assert _conditions(before)["Ready"] == ("False", "PoolsNotReady")
    pools_up = compute_status(isvc, _observed(ALL_READY, router=0), before, DESIRED, NOW, 0)
    assert _conditions(pools_up)["Ready"] == ("False", "RouterNotReady")
    assert _conditions(pools_up)["RouterReady"][0] == "False"
    assert progress_only(before, pools_up)  # a step of the start-up: may wait

    serving = compute_status(isvc, _observed(ALL_READY), pools_up, DESIRED, NOW, writes=0)
    assert not progress_only(pools_up, serving)  # Ready flipped to True
    assert not progress_only(serving, pools_up)  # ... or back to False

    stalled = {
        **pools_up,
        "conditions": [
            {**c, "status": "True", "reason": "InsufficientCapacity"}
            if c["type"] == "Stalled" else c
            for c in pools_up["conditions"]
        ],
    }  # fmt: skip
    assert not progress_only(pools_up, stalled)


def test_progress_interval_grows_with_the_services_not_ready_within_bounds() -> None:
    assert progress_interval_s(1, 5.0, 5.0, 60.0) == 5.0  # a lone start-up
    assert progress_interval_s(100, 5.0, 5.0, 60.0) == 20.0  # 100 at 5 writes/s together
    assert progress_interval_s(1000, 5.0, 5.0, 60.0) == 60.0


def test_the_status_the_runtime_builds_is_what_the_crd_admits() -> None:
    """The status is built from the same models the CRD's schema comes from, and the unit
    tests' Writer checks every status written against them: the two cannot drift."""
    pods = (_pod("prefill", 0), _pod("decode", 0, ready=False, phase="Pending"))
    status = compute_status(
        _service(), Observed(pods=pods), None, {"prefill": 1, "decode": 2}, NOW, 0
    )
    InferenceServiceStatus.model_validate(status)
    stalled = invalid_status(status, 3, "bad", NOW)
    InferenceServiceStatus.model_validate(stalled)
    # A field the CRD does not know is refused, as the API server would prune it.
    with pytest.raises(ValidationError, match=r"prefill\.spare"):
        InferenceServiceStatus.model_validate(
            {**status, "prefill": {**status["prefill"], "spare": 1}}
        )


def test_a_paired_rollout_serves_ready_reports_its_revisions_and_stalls_past_the_deadline() -> None:
    """While the old revision serves, the service stays Ready and Reconciling says RollingOut;
    status.revisions counts each revision's pods; past spec.progressDeadline (10m) since the
    rollout began it is Stalled=True, RolloutStalled, with the pods' own cause."""
    new = [
        _pod("prefill", 1, kv_revision="r2", ready=False, unready_since="2026-11-29T11:58:00Z"),
        _pod("decode", 1, kv_revision="r2"),
    ]
    old = [_pod("prefill", 0, kv_revision="r1"), _pod("decode", 0, kv_revision="r1")]
    surging = _sts("prefill", replicas=2, updated=1, generation=2)
    observed = _observed(
        [*old, *new], prefill=surging, decode=_sts("decode", replicas=2, updated=1, generation=2)
    )
    rollout = RolloutPlan(Phase.SURGING, "r2", "r1", waiting="revision r2: prefill 0/1 ready")
    status = compute_status(_service(), observed, None, DESIRED, NOW, 0, rollout)
    assert _conditions(status)["Ready"] == ("True", "Serving")
    assert _conditions(status)["Reconciling"] == ("True", "RollingOut")
    assert _conditions(status)["Stalled"][0] == "False"
    assert status["revision"] == "r2"
    assert status["revisions"] == [
        {"revision": "r1", "prefill": 1, "decode": 1, "serving": True},
        {"revision": "r2", "prefill": 1, "decode": 1, "serving": False},
    ]
    assert status["rollout"]["phase"] == "Surging"
    assert status["rollout"]["startedTime"] == "2026-11-29T12:00:00Z"
    InferenceServiceStatus.model_validate(status)
    later = compute_status(_service(), observed, status, DESIRED, NOW + timedelta(minutes=11), 0,
                           rollout)  # fmt: skip
    stalled = next(c for c in later["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "RolloutStalled")
    assert "revision r1 keeps serving" in stalled["message"]
    assert "llama-8b-prefill-1" in stalled["message"], "the pod's own cause is appended"
    assert later["rollout"]["startedTime"] == "2026-11-29T12:00:00Z"
    done = compute_status(_service(), _observed(new), later, DESIRED, NOW, 0,
                          RolloutPlan(Phase.STABLE, "r2", "r2"))  # fmt: skip
    assert "rollout" not in done
