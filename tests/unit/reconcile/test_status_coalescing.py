"""Pod counts that change one after another make one status write, not one each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet import controller as controller_module
from pdfleet.controller import Controller
from pdfleet.reconcile.observed import Observed, PodInfo
from tests.spec_cases import sample
from tests.unit.fakes import Writer

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
WINDOW = controller_module.STATUS_COALESCE_S


def _pod(role: str, ordinal: int, phase: str = "Running", ready: bool = False) -> PodInfo:
    return PodInfo(
        name=f"llama-8b-{role}-{ordinal}", role=role, ordinal=ordinal, phase=phase,
        ready=ready, pod_ip=f"10.0.0.{ordinal + 1}",
    )  # fmt: skip


def _status_writes(writer: Writer) -> int:
    return sum(1 for call, _ in writer.calls if call == "status")


def _created(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Controller, Writer, dict[str, Any], list[float]]:
    """A controller that has just created a service's children and written its first status,
    on a monotonic clock the test moves by hand."""
    clock = [100.0]
    monkeypatch.setattr("pdfleet.controller.time.monotonic", lambda: clock[0])
    body = sample("minimal")
    body["metadata"].update(namespace="ns", uid="u1", generation=1)
    writer = Writer()
    controller = Controller(writer, clock=lambda: NOW)
    controller.reconcile(body, Observed())
    return controller, writer, body, clock


def test_counts_wait_for_the_interval_and_go_out_with_the_latest_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller, writer, body, clock = _created(monkeypatch)
    assert _status_writes(writer) == 1

    clock[0] += 0.2 * WINDOW
    pending = controller.reconcile(body, Observed(pods=(_pod("prefill", 0, "Pending"),)))
    clock[0] += 0.3 * WINDOW
    running = controller.reconcile(body, Observed(pods=(_pod("prefill", 0),)))
    assert _status_writes(writer) == 1  # counts only, within the interval: not yet
    assert pending.requeue_after_s == pytest.approx(0.8 * WINDOW)  # the pass comes back for them
    assert running.requeue_after_s == pytest.approx(0.5 * WINDOW)

    clock[0] += 0.5 * WINDOW
    controller.reconcile(body, Observed(pods=(_pod("prefill", 0),)))
    assert _status_writes(writer) == 2
    assert writer.last_status["prefill"]["replicas"] == 1  # the figures of that moment
    assert writer.last_status["prefill"]["pending"] == 0


def test_a_start_up_step_waits_and_a_problem_is_written_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller, writer, body, clock = _created(monkeypatch)
    clock[0] += 0.1 * WINDOW
    ready = (_pod("prefill", 0, ready=True), _pod("decode", 0, ready=True))
    result = controller.reconcile(body, Observed(pods=ready))
    assert not result.status_written  # PoolsNotReady -> RouterNotReady: a step, not news
    assert result.requeue_after_s == pytest.approx(0.9 * WINDOW)

    clock[0] += 0.1 * WINDOW
    stuck = PodInfo(
        name="llama-8b-decode-1", role="decode", ordinal=1, phase="Pending", ready=False,
        unschedulable="0/3 nodes are available", unready_since="2026-01-02T02:50:00Z",
    )  # fmt: skip
    result = controller.reconcile(body, Observed(pods=(*ready, stuck)))
    assert result.status_written and _status_writes(writer) == 2
    conditions = {c["type"]: (c["status"], c["reason"]) for c in writer.last_status["conditions"]}
    assert conditions["Stalled"] == ("True", "InsufficientCapacity")


def _fleet_created(controller: Controller, count: int) -> list[str]:
    """A fleet applied in one go: each service writes its first status, not Ready."""
    names = [f"svc-{i}" for i in range(count)]
    for name in names:
        other = sample("minimal")
        other["metadata"].update(namespace="ns", name=name, uid=f"uid-{name}", generation=1)
        controller.reconcile(other, Observed())
    return names


def test_a_start_up_waits_longer_while_many_services_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller, writer, body, clock = _created(monkeypatch)
    others = _fleet_created(controller, 200)
    interval = min(
        controller_module.STARTUP_COALESCE_MAX_S,
        (len(others) + 1) / controller_module.STARTUP_PROGRESS_PER_S,
    )
    assert interval > 2 * WINDOW

    clock[0] += 2 * WINDOW
    ready = (_pod("prefill", 0, ready=True), _pod("decode", 0, ready=True))
    writes = _status_writes(writer)
    result = controller.reconcile(body, Observed(pods=ready))
    assert _status_writes(writer) == writes  # past STATUS_COALESCE_S, still waiting
    assert result.requeue_after_s == pytest.approx(interval - 2 * WINDOW)

    clock[0] += interval
    controller.reconcile(body, Observed(pods=ready))
    assert _status_writes(writer) == writes + 1


def test_services_that_went_away_no_longer_lengthen_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller, writer, body, clock = _created(monkeypatch)
    for name in _fleet_created(controller, 200):
        controller.forget("ns", name)

    clock[0] += 1.1 * WINDOW
    ready = (_pod("prefill", 0, ready=True), _pod("decode", 0, ready=True))
    writes = _status_writes(writer)
    assert controller.reconcile(body, Observed(pods=ready)).status_written
    assert _status_writes(writer) == writes + 1
