"""The controller's drain hook: StatefulSets stay at the current size while a pool drains, the
first pass marks pods with a merge patch, and an idle service does no drain I/O at all."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet import labels
from pdfleet.controller import Controller
from pdfleet.drain import io as drain_io
from pdfleet.drain.step import DRAIN_POLL_S
from pdfleet.reconcile.observed import Observed, PodInfo, observed_from
from pdfleet.reconcile.plan import desired_replicas, with_hash
from pdfleet.render import render_children
from tests.spec_cases import merge_patch, sample
from tests.unit.fakes import Writer

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _body(decode: int) -> dict[str, Any]:
    obj: dict[str, Any] = merge_patch(
        sample("minimal"),
        {"spec": {"decode": {"replicas": {"min": 1, "max": 4, "initial": decode}}}},
    )
    obj["metadata"].update(namespace="ns", uid="u1", generation=1)
    return obj


def _observed(body: dict[str, Any], decode_now: int) -> Observed:
    """Children as applied for `decode_now` decode workers, with their pods Running."""
    from pdfleet.api.v1alpha1 import InferenceService

    isvc = InferenceService.model_validate(body)
    counts = {**desired_replicas(isvc, None), "decode": decode_now}
    observed = observed_from(with_hash(m) for m in render_children(isvc, counts))
    pods = [
        PodInfo(name=f"{isvc.metadata.name}-{role}-{i}", role=role, ordinal=i, phase="Running",
                ready=True, pod_ip=f"10.244.{j}.{i + 1}")
        for j, (role, n) in enumerate(counts.items())
        for i in range(n)
    ]  # fmt: skip
    return replace(observed, pods=tuple(pods))


@pytest.fixture
def no_http(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record any attempt at router/worker HTTP instead of doing it."""
    attempts: list[str] = []

    def fake_read_loads(fleet: Any, workers: Mapping[str, Any]) -> dict[str, Any]:
        attempts.append(f"read {sorted(workers)}")
        return {}

    monkeypatch.setattr("pdfleet.drain.step.read_loads", fake_read_loads)
    monkeypatch.setattr(drain_io.RouterFleet, "deregister", lambda self, url: attempts.append(url))
    return attempts


def test_idle_service_does_no_drain_io_and_no_write(no_http: list[str]) -> None:
    body = _body(decode=2)
    writer = Writer()
    result = Controller(writer, clock=lambda: NOW).reconcile(body, _observed(body, 2))
    assert no_http == [] and result.requeue_after_s is None
    assert not [c for c in writer.calls if c[0] in ("apply", "patch", "delete")]


def test_scale_down_marks_the_top_pods_and_holds_the_statefulset(no_http: list[str]) -> None:
    body = _body(decode=1)
    writer = Writer()
    result = Controller(writer, clock=lambda: NOW).reconcile(body, _observed(body, 3))
    patches = [c[1] for c in writer.calls if c[0] == "patch"]
    assert [(kind, name) for kind, name, _ in patches] == [
        ("Pod", "llama-8b-decode-1"),
        ("Pod", "llama-8b-decode-2"),
    ]
    assert patches[0][2] == {
        "metadata": {"annotations": {labels.DRAINING: "2026-01-02T03:04:05.000Z"}}
    }
    # No StatefulSet write lowers the count: it stays at 3 until the pods are drained.
    assert ("apply", ("StatefulSet", 1)) not in writer.calls
    assert result.requeue_after_s == DRAIN_POLL_S
    assert no_http == ["read []"]  # nothing marked yet, so no worker to read


def test_a_pass_before_the_pod_index_catches_up_does_not_mark_again(
    no_http: list[str],
) -> None:
    body = _body(decode=1)
    writer = Writer()
    clock = [NOW]
    controller = Controller(writer, clock=lambda: clock[0])
    stale = _observed(body, 3)  # the index still shows the pods unmarked
    controller.reconcile(body, stale)
    first = [c for c in writer.calls if c[0] == "patch"]
    clock[0] = NOW.replace(second=9)
    controller.reconcile(body, stale)
    again = [c for c in writer.calls if c[0] == "patch"][len(first) :]
    assert len(first) == 2 and again == [], "the drain clock must not restart"
