"""The controller's preflight step: runs once a service is ready, sets KVTransportReady and
status.kvTransport, records an Event, retries failed runs without rewriting the same status, and
never makes a pass wait for a run."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.controller import Controller
from pdfleet.preflight import plan
from pdfleet.preflight.step import PREFLIGHT_POLL_S
from pdfleet.reconcile.observed import Observed, PodInfo
from pdfleet_wire.preflight import PreflightResult, failed
from tests.spec_cases import merge_patch, sample
from tests.unit.fakes import Inline, Writer

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PODS = Observed(
    pods=(
        PodInfo("llama-8b-prefill-0", "prefill", 0, "Running", True, pod_ip="10.244.1.5"),
        PodInfo("llama-8b-decode-0", "decode", 0, "Running", True, pod_ip="10.244.2.5"),
    )
)
TCP = PreflightResult(
    ok=True, verified=True, transport="tcp/lo", transport_kind="tcp", lanes=("tcp/lo",),
    total_bytes=64 << 20, seconds=(0.2, 0.2), latency_s=0.002,
)  # fmt: skip


def _body(patch: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = merge_patch(sample("minimal"), patch or {})
    obj["metadata"].update(namespace="ns", uid="u1", generation=2)
    return obj


def _status(ready: bool) -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}


class Runs:
    def __init__(self, result: PreflightResult) -> None:
        self.result = result
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, url: str, body: dict[str, Any], timeout_s: float) -> PreflightResult:
        self.calls.append((url, body))
        return self.result


def _controller(writer: Writer) -> Controller:
    return Controller(writer, preflight_runner=Inline())


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Runs:
    fake = Runs(TCP)
    monkeypatch.setattr("pdfleet.preflight.io.run", fake)
    return fake


def _step(
    controller: Controller, body: dict[str, Any], status: dict[str, Any]
) -> tuple[dict[str, Any], float | None]:
    isvc = InferenceService.model_validate(body)
    return controller._preflight(body, isvc, PODS, status, NOW)


def _condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == plan.KV_TRANSPORT_READY)


def test_waits_for_ready_then_runs_once(runs: Runs) -> None:
    writer = Writer()
    controller = _controller(writer)
    body = _body()
    status, after = _step(controller, body, _status(False))
    assert runs.calls == [] and "kvTransport" not in status and after is None
    status, after = _step(controller, body, _status(True))
    assert [url for url, _ in runs.calls] == ["http://10.244.2.5:5590/preflight/run"]
    assert runs.calls[0][1]["peer"] == "http://10.244.1.5:5590"
    assert _condition(status)["status"] == "True" and _condition(status)["reason"] == "Measured"
    assert status["kvTransport"]["transport"] == "tcp/lo" and after is None
    assert ("event", "KVTransportMeasured") in writer.calls
    again, _ = _step(controller, body, status)
    assert len(runs.calls) == 1 and again == status


def test_a_fabric_change_runs_again_and_warns_on_tcp_fallback(runs: Runs) -> None:
    writer = Writer()
    controller = _controller(writer)
    status, _ = _step(controller, _body(), _status(True))
    rdma = _body({"spec": {"kvTransfer": {"fabric": {"rdmaResource": "rdma/ib"}}}})
    status, _ = _step(controller, rdma, status)
    assert len(runs.calls) == 2
    condition = _condition(status)
    assert (condition["status"], condition["reason"]) == ("False", "TCPFallback")
    assert ("event", "KVTransportTCPFallback") in writer.calls


def test_a_failed_run_is_retried_later_without_rewriting_the_status(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs.result = failed("decode preflight listener: connection refused")
    writer = Writer()
    controller = _controller(writer)
    body = _body()
    start = time.monotonic()
    clock = [start]
    monkeypatch.setattr("pdfleet.preflight.step.time.monotonic", lambda: clock[0])
    status, after = _step(controller, body, _status(True))
    assert _condition(status)["reason"] == "PreflightFailed" and after == plan.RETRY_S
    clock[0] = start + 20
    # too soon: no run, and the pass comes back when the retry is due, not a minute later
    assert _step(controller, body, status) == (status, plan.RETRY_S - 20)
    assert len(runs.calls) == 1
    clock[0] = start + plan.RETRY_S + 1
    retried, _ = _step(controller, body, status)
    assert len(runs.calls) == 2 and retried == status  # same failure: same record, no Event
    assert [c for c in writer.calls if c[0] == "event"] == [("event", "KVTransportPreflightFailed")]


def test_disabled_drops_the_condition_and_the_record(runs: Runs) -> None:
    controller = _controller(Writer())
    status, _ = _step(controller, _body(), _status(True))
    off = _body({"spec": {"kvTransfer": {"preflight": {"enabled": False}}}})
    status, _ = _step(controller, off, status)
    assert "kvTransport" not in status
    assert [c["type"] for c in status["conditions"]] == ["Ready"]


def test_a_pass_never_waits_for_a_run(runs: Runs, monkeypatch: pytest.MonkeyPatch) -> None:
    # a run takes as long as the fabric needs (up to its timeout); meanwhile the service's
    # passes go on, coming back every PREFLIGHT_POLL_S, and the run starts only once
    release = threading.Event()

    def slow(url: str, body: dict[str, Any], timeout_s: float) -> PreflightResult:
        release.wait(10)
        return runs(url, body, timeout_s)

    monkeypatch.setattr("pdfleet.preflight.io.run", slow)
    pool = ThreadPoolExecutor(max_workers=1)
    controller = Controller(Writer(), preflight_runner=pool)
    body, ready = _body(), _status(True)
    assert _step(controller, body, ready) == (ready, PREFLIGHT_POLL_S)
    assert _step(controller, body, ready) == (ready, PREFLIGHT_POLL_S)
    release.set()
    pool.shutdown(wait=True)
    status, _ = _step(controller, body, ready)
    assert len(runs.calls) == 1 and _condition(status)["reason"] == "Measured"


def test_a_run_that_raises_is_a_failed_result(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(url: str, body: dict[str, Any], timeout_s: float) -> PreflightResult:
        raise RuntimeError("listener answered nonsense")

    monkeypatch.setattr("pdfleet.preflight.io.run", broken)
    status, after = _step(_controller(Writer()), _body(), _status(True))
    assert _condition(status)["reason"] == "PreflightFailed"
    assert after == pytest.approx(plan.RETRY_S, abs=1)  # a minute after the attempt
    assert "listener answered nonsense" in status["kvTransport"]["error"]
