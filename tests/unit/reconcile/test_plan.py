"""Planning: what to write, what to delete, how many replicas, and nothing when unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.observed import APPLIED_HASH, ChildRef, Observed, observed_from
from pdfleet.reconcile.plan import RenderCache, desired_replicas, plan, with_hash, write_waves
from pdfleet.render import render_children
from tests.spec_cases import merge_patch, sample


def _service(
    patch: dict[str, Any] | None = None, name: str = "minimal", generation: int | None = 1
) -> InferenceService:
    obj = merge_patch(sample(name), patch or {})
    obj["metadata"].update(namespace="ns", uid="u1", generation=generation)
    return InferenceService.model_validate(obj)


def _as_observed(manifests: list[dict[str, Any]]) -> Observed:
    """What the API server would hold after applying these manifests."""
    return observed_from(with_hash(m) for m in manifests)


def test_first_pass_applies_every_child() -> None:
    isvc = _service()
    _, child_plan = plan(isvc, Observed(), None)
    kinds = sorted(m["kind"] for m in child_plan.apply)
    per_pool = ["Service", "PodDisruptionBudget", "StatefulSet"]
    router = ["ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"]
    assert kinds == sorted(["ServiceAccount", *per_pool, *per_pool, *router])
    assert len(child_plan.apply) == len(render_children(isvc, {"prefill": 1, "decode": 1}))
    assert not child_plan.delete
    assert all(APPLIED_HASH in m["metadata"]["annotations"] for m in child_plan.apply)


def test_unchanged_service_plans_no_write() -> None:
    isvc = _service()
    observed = _as_observed(render_children(isvc, desired_replicas(isvc, None)))
    _, child_plan = plan(isvc, observed, None)
    assert child_plan.apply == [] and child_plan.delete == []
    assert child_plan.unchanged == len(observed.children)


def test_changed_worker_resources_rewrite_only_the_statefulsets() -> None:
    """Not a KV change (tests/unit/rollout has those): the router keeps its revision."""
    isvc = _service()
    observed = _as_observed(render_children(isvc, desired_replicas(isvc, None)))
    more_memory = {"resources": {"requests": {"memory": "99Gi"}}}
    changed = _service({"spec": {"prefill": more_memory, "decode": more_memory}})
    _, child_plan = plan(changed, observed, None)
    assert sorted(m["metadata"]["name"] for m in child_plan.apply) == [
        "llama-8b-decode",
        "llama-8b-prefill",
    ]


def test_replicas_changed_by_someone_else_are_taken_back() -> None:
    isvc = _service()
    observed = _as_observed(render_children(isvc, desired_replicas(isvc, None)))
    children = dict(observed.children)
    ref = children[("StatefulSet", "llama-8b-decode")]
    children[("StatefulSet", "llama-8b-decode")] = ChildRef(
        kind=ref.kind, name=ref.name, applied_hash=ref.applied_hash, replicas=5
    )
    _, child_plan = plan(isvc, Observed(children=children), None)
    assert [m["metadata"]["name"] for m in child_plan.apply] == ["llama-8b-decode"]


def test_switching_to_an_external_router_deletes_the_router_children() -> None:
    isvc = _service()
    observed = _as_observed(render_children(isvc, desired_replicas(isvc, None)))
    external = _service({"spec": {"router": {"type": "external"}}})
    _, child_plan = plan(external, observed, None)
    assert child_plan.apply == []
    assert child_plan.delete == [
        ("Deployment", "llama-8b-router"),
        ("Role", "llama-8b-router"),
        ("RoleBinding", "llama-8b-router"),
        ("Service", "llama-8b-router"),
        ("ServiceAccount", "llama-8b-router"),
    ]


AUTOSCALED = {
    "spec": {
        "prefill": {"replicas": {"min": 1, "max": 4, "initial": 2}},
        "decode": {"replicas": {"min": 1, "max": 4}},
        "slo": {"ttft": {"target": "1s"}, "itl": {"target": "20ms"}},
        "autoscaling": {"enabled": True, "gpuBudget": 8, "prometheus": {"url": "http://p:9090"}},
    }
}


@pytest.mark.parametrize(
    ("patch", "status", "expected"),
    [
        ({}, None, {"prefill": 1, "decode": 1}),
        (
            {"spec": {"prefill": {"replicas": {"max": 3, "initial": 2}}}},
            None,
            {"prefill": 2, "decode": 1},
        ),
        (AUTOSCALED, None, {"prefill": 2, "decode": 1}),
        (
            AUTOSCALED,
            {"prefill": {"desired": 3}, "decode": {"desired": 2}},
            {"prefill": 3, "decode": 2},
        ),
        (
            AUTOSCALED,
            {"prefill": {"desired": 9}, "decode": {"desired": 0}},
            {"prefill": 4, "decode": 1},
        ),
        # Autoscaling off: the autoscaler's old decision no longer counts.
        ({}, {"prefill": {"desired": 3}}, {"prefill": 1, "decode": 1}),
    ],
)
def test_desired_replicas(
    patch: dict[str, Any], status: dict[str, Any] | None, expected: dict[str, int]
) -> None:
    assert desired_replicas(_service(patch), status) == expected


def test_the_render_cache_renders_a_generation_once_per_pool_sizes() -> None:
    cache = RenderCache()
    isvc = _service()
    counts = {"prefill": 1, "decode": 1}
    first = cache.stamped(isvc, counts, None)
    assert cache.stamped(isvc, counts, None) is first  # a resync pass: no render, no hash
    assert cache.stamped(isvc, {"prefill": 2, "decode": 1}, None) is not first
    changed = _service({"spec": {"engine": {"image": "example.com/worker:2"}}}, generation=2)
    rendered = cache.stamped(changed, counts, None)
    assert rendered == [with_hash(m) for m in render_children(changed, counts)]
    cache.forget("ns", changed.metadata.name or "")
    assert cache.stamped(changed, counts, None) is not rendered


def test_an_object_without_a_generation_is_never_cached() -> None:
    cache = RenderCache()
    isvc = _service(generation=None)
    counts = {"prefill": 1, "decode": 1}
    assert cache.stamped(isvc, counts, None) is not cache.stamped(isvc, counts, None)


def test_workloads_are_written_after_what_their_pods_use() -> None:
    children = render_children(_service(), {"prefill": 1, "decode": 1})
    waves = write_waves(children)
    assert [sorted({m["kind"] for m in wave}) for wave in waves] == [
        ["PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"],
        ["Deployment", "StatefulSet"],
    ]
    assert [m for wave in waves for m in wave if m["kind"] == "Service"] == [
        m for m in children if m["kind"] == "Service"
    ]  # render order within a wave
    statefulsets = [m for m in children if m["kind"] == "StatefulSet"]
    assert write_waves(statefulsets) == [statefulsets]  # a spec change: one wave
    assert write_waves([]) == []
