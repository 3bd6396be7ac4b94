"""The fault suite's pure parts: fault choice, convergence check, failure split, table, the
autoscaling patches."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from e2e.platform.children import convergence_problems
from e2e.platform.fault_proxy import FaultRates, choose_fault, injected
from e2e.platform.loadgen import ERROR, OK, TRUNCATED, Record
from e2e.platform.prometheus_proxy import Mode, rewrite
from e2e.platform.service import service_manifest
from e2e.scenarios.faults import (
    FLEET,
    Outcome,
    autoscaling_off_patch,
    autoscaling_patch,
    base_service,
    merged,
    new_warnings,
    random_change,
    split_failures,
    table,
)
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.autoscale.metrics import PrometheusSource
from pdfleet.autoscale.policy import PolicyConfig, metrics_problem
from pdfleet.reconcile.plan import desired_replicas, with_hash
from pdfleet.render import render_children
from tests.spec_cases import merge_patch

RATES = FaultRates(conflict=0.1, throttle=0.2)


@pytest.mark.parametrize(
    ("method", "draw", "code"),
    [
        ("GET", 0.0, None),  # reads and watches always pass
        ("PATCH", 0.05, 409),
        ("POST", 0.15, 429),
        ("PUT", 0.29, 429),
        ("DELETE", 0.31, None),
        ("patch", 0.0, 409),
    ],
)
def test_choose_fault(method: str, draw: float, code: int | None) -> None:
    assert choose_fault(method, draw, RATES) == code


def test_injected_counts_by_code() -> None:
    from collections import Counter

    counts = Counter({"PATCH injected 409": 2, "POST injected 409": 1, "PUT injected 429": 4,
                      "GET 200": 9})  # fmt: skip
    assert injected(counts) == {409: 3, 429: 4}


def service_object() -> dict[str, Any]:
    obj = base_service("svc", "ns")
    obj["metadata"] |= {"uid": "u-1", "generation": 2}
    obj["status"] = {
        "observedGeneration": 2,
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return obj


def children_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    isvc = InferenceService.model_validate({**obj, "status": None})
    out = []
    for manifest in map(with_hash, render_children(isvc, desired_replicas(isvc, None))):
        manifest["metadata"]["ownerReferences"] = [{"uid": "u-1", "controller": True}]
        out.append(manifest)
    return out


def test_rendered_children_are_converged() -> None:
    obj = service_object()
    assert convergence_problems(obj, children_of(obj)) == []


def test_convergence_problems_name_what_is_wrong() -> None:
    obj = service_object()
    children = children_of(obj)
    sts = next(c for c in children if c["kind"] == "StatefulSet")
    sts["spec"]["replicas"] = 5
    sts["metadata"]["annotations"]["pdfleet.dev/applied-hash"] = "old"
    orphan = {"kind": "Service", "metadata": {"name": "svc-extra", "ownerReferences": []}}
    duplicate = dict(children[0])
    dropped = children.pop()
    obj["status"]["observedGeneration"] = 1
    problems = convergence_problems(obj, [*children, orphan, duplicate])
    name = f"{sts['kind']}/{sts['metadata']['name']}"
    assert f"stale {name} (applied-hash old)" in problems
    assert f"{name} replicas 5" in problems
    assert "orphan Service/svc-extra" in problems
    assert f"missing {dropped['kind']}/{dropped['metadata']['name']}" in problems
    assert f"duplicate {children[0]['kind']}/{children[0]['metadata']['name']} x2" in problems
    assert "observedGeneration 1 != 2" in problems


def test_a_foreign_controller_owner_is_a_problem() -> None:
    obj = service_object()
    children = children_of(obj)
    children[0]["metadata"]["ownerReferences"] = [{"uid": "other", "controller": True}]
    assert any("controller owners" in p for p in convergence_problems(obj, children))


def test_random_changes_are_valid_specs() -> None:
    rng = random.Random(7)
    for _ in range(50):
        obj = base_service("svc", "ns")
        patch = random_change(rng)
        for key, value in patch["spec"].items():
            obj["spec"][key] = {**obj["spec"].get(key, {}), **value}
        InferenceService.model_validate(obj)


def record(start: float, outcome: str) -> Record:
    return Record("steady", start, outcome, math.nan, math.nan, 0)


def test_split_failures_by_start_time() -> None:
    records = [record(1, OK), record(2, ERROR), record(5, TRUNCATED), record(6, ERROR),
               record(9, OK), record(12, ERROR)]  # fmt: skip
    assert split_failures(records, kill_s=4, settled_s=10) == {
        "requests": 6,
        "in_flight_broken": 1,
        "failed_before_settled": 2,
        "failed_after_settled": 1,
    }


def test_table() -> None:
    rows = [Outcome("a", 3, 0), Outcome("b", 2, 1, requests=100, lost=4)]
    assert table(rows).splitlines()[2:] == ["| a | 3 | 0 | n/a | n/a |", "| b | 2 | 1 | 100 | 4 |"]


def test_merged_replaces_rows_of_the_faults_run_again() -> None:
    old = [Outcome("a", 1, 0), Outcome("b", 1, 1)]
    new = [Outcome("b", 5, 0), Outcome("c", 2, 0)]
    assert [(o.fault, o.runs) for o in merged(old, new)] == [("a", 1), ("b", 5), ("c", 2)]


ANSWER = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1000.0, "2.5"]}]},
}


def test_the_prometheus_proxy_rewrites_each_sample_as_its_mode_says() -> None:
    def sample(mode: Mode) -> list[Any]:
        return list(rewrite(ANSWER, mode, 600.0)["data"]["result"][0]["value"])

    assert sample("pass") == [1000.0, "2.5"]
    assert sample("nan") == [1000.0, "NaN"]
    assert sample("stale") == [400.0, "2.5"]
    assert rewrite(ANSWER, "empty", 600.0)["data"]["result"] == []
    matrix = {"data": {"result": [{"values": [[1.0, "1"], [2.0, "2"]]}]}}
    assert rewrite(matrix, "nan", 0)["data"]["result"][0]["values"] == [[1.0, "NaN"], [2.0, "NaN"]]
    assert ANSWER["data"]["result"][0]["value"] == [1000.0, "2.5"]  # type: ignore[index]
    assert rewrite({"status": "error"}, "nan", 600.0) == {"status": "error"}


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("pass", None), ("nan", "MetricsNaN"), ("stale", "MetricsStale"), ("empty", "MetricsMissing")],
)
def test_each_proxy_mode_gives_the_operator_its_reason(mode: Mode, reason: str | None) -> None:
    """What the proxy sends is what the operator's reader turns into each condition reason."""

    class Client:
        def custom_query(self, query: str) -> list[dict[str, Any]]:
            return list(rewrite(ANSWER, mode, 600.0)["data"]["result"])

    window = PrometheusSource("http://proxy", client=Client()).window("n", "s", 1000.0, 90, 30)
    config = PolicyConfig(ttft_target_s=0.5, itl_target_s=0.05)
    assert metrics_problem(1000.0, config, window) == reason


def test_new_warnings_count_only_the_reason_since_the_snapshot() -> None:
    before = {"a": ("MetricsMissing", 3), "b": ("MetricsNaN", 1)}
    after = {"a": ("MetricsMissing", 5), "b": ("MetricsNaN", 2), "c": ("MetricsNaN", 1)}
    assert new_warnings(before, after, "MetricsNaN") == 2
    assert new_warnings(before, after, "MetricsMissing") == 2
    assert new_warnings(after, after, "MetricsStale") == 0


def test_turning_autoscaling_off_gives_back_the_deployed_spec() -> None:
    deployed = service_manifest("faults", FLEET)
    autoscaled = merge_patch(deployed, autoscaling_patch("http://127.0.0.1:9090"))
    assert autoscaled["spec"]["autoscaling"]["enabled"]
    InferenceService.model_validate(autoscaled)
    assert merge_patch(autoscaled, autoscaling_off_patch(FLEET)) == deployed
