"""The agent's drain hooks against a real simulator process (no mocks)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdfleet_worker import drain
from pdfleet_worker.sim.procs import SimProc, start_sim


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProc]:
    p = start_sim(str(tmp_path), extra=["--preset", "llama-3.1-8b-h200"])
    try:
        yield p
    finally:
        p.stop()


def _background_request(url: str, max_tokens: int) -> tuple[threading.Thread, list[int]]:
    status: list[int] = []

    def run() -> None:
        r = httpx.post(
            f"{url}/v1/completions",
            timeout=30.0,
            json={"model": "sim-model", "prompt": "hi", "max_tokens": max_tokens},
        )
        status.append(r.status_code)

    t = threading.Thread(target=run)
    t.start()
    return t, status


def _wait_running(url: str) -> None:
    for _ in range(100):
        if drain.in_flight(httpx.get(f"{url}/metrics").text) > 0:
            return
        threading.Event().wait(0.02)
    raise AssertionError("request never showed up as running")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n',
            5.0,
        ),
        (
            'vllm:num_requests_running{engine="0"} 1.0\nvllm:num_requests_running{engine="1"} 1.0\n'
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 7.0\n',
            2.0,
        ),
        (  # a decode pulling KV: the waiting gauge holds the deferred requests, counted once
            'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 0.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",reason="deferred"} 2.0\n',
            2.0,
        ),
        ("# TYPE vllm:num_requests_running gauge\n", 0.0),
    ],
)
def test_in_flight_parses_vllm_gauges(text: str, expected: float) -> None:
    assert drain.in_flight(text) == expected


def test_prestop_waits_for_in_flight_then_returns(sim: SimProc, tmp_path: Path) -> None:
    marker = str(tmp_path / "draining")
    assert drain.check_ready(sim.url, marker) == (True, "ok")
    t, status = _background_request(sim.url, max_tokens=150)  # ~0.76 s of decode
    _wait_running(sim.url)
    env = {
        "PDFLEET_PORT": str(sim.port),
        "PDFLEET_DRAIN_FILE": marker,
        "PDFLEET_DRAIN_TIMEOUT": "10",
        "PATH": "",
    }
    out = subprocess.run(
        [sys.executable, "-m", "pdfleet_worker.agent", "prestop", "--interval", "0.1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert '"drained": true' in out.stdout
    # By the time preStop returns, the request is finished and the pod reports unready.
    t.join(5)
    assert status == [200]
    assert drain.check_ready(sim.url, marker) == (False, "draining")
    ready = subprocess.run(
        [sys.executable, "-m", "pdfleet_worker.agent", "ready"],
        env=env,
        capture_output=True,
        timeout=20,
    )
    assert ready.returncode == 1


def test_wait_idle_times_out(sim: SimProc) -> None:
    t, _ = _background_request(sim.url, max_tokens=400)  # ~2 s
    _wait_running(sim.url)
    result = drain.wait_idle(sim.url, timeout_s=0.3, interval_s=0.1)
    assert not result.drained and result.last_in_flight == 1.0
    t.join(10)


def test_unreachable_engine_counts_as_drained_and_unready(tmp_path: Path) -> None:
    from pdfleet_worker.sim.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert drain.wait_idle(url, timeout_s=1, interval_s=0.1).drained
    ok, why = drain.check_ready(url, str(tmp_path / "none"))
    assert not ok and "unreachable" in why
