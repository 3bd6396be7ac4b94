"""The simulator's NIXL P/D edge cases and SIGTERM drain, against real processes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from pdfleet_worker.sim.procs import SimProc, start_sim

FAST = ["--preset", "llama-3.1-8b-h200", "--time-scale", "0.1"]


def _post(sim: SimProc, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{sim.url}/v1/completions",
        timeout=20.0,
        json={"model": "sim-model", "prompt": "a b c d", **body},
    )


def test_prefill_holds_until_lease_expiry_and_decode_fallbacks(tmp_path: Path) -> None:
    p = start_sim(str(tmp_path), extra=[*FAST, "--kv-lease-duration", "3"], name="p")
    d = start_sim(str(tmp_path), extra=FAST, name="d")
    try:
        r = _post(p, {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        params = r.json()["kv_transfer_params"]
        assert params["remote_port"] == p.side_channel_port and params["do_remote_prefill"]
        assert p.stats()["held_now"] == 1  # held, visible on the prefill
        # Incomplete params: the decode recomputes locally (vLLM's warning path).
        bad = {k: v for k, v in params.items() if k != "remote_request_id"}
        assert _post(d, {"max_tokens": 3, "kv_transfer_params": bad}).status_code == 200
        assert d.stats()["recompute_invalid_params"] == 1
        time.sleep(0.5)  # lease 3 simulated s = 0.3 wall s
        assert p.stats()["held_now"] == 0 and p.stats()["kv_expired"] == 1
        # Valid params but the blocks are gone: kv_load_failure_policy=fail -> 500.
        r = _post(d, {"max_tokens": 3, "kv_transfer_params": params})
        assert r.status_code == 500
        assert d.stats()["kv_pull_failures"] == 1 and d.stats()["kv_pulls"] == 0
    finally:
        p.stop()
        d.stop()


def test_recompute_policy_and_successful_pull(tmp_path: Path) -> None:
    p = start_sim(str(tmp_path), extra=FAST, name="p")
    d = start_sim(
        str(tmp_path),
        extra=[
            *FAST,
            "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_role":"kv_both",'
            '"kv_load_failure_policy":"recompute"}',
        ],
        name="d",
    )
    try:
        params = _post(
            p, {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        ).json()["kv_transfer_params"]
        assert _post(d, {"max_tokens": 2, "kv_transfer_params": params}).status_code == 200
        assert d.stats()["kv_pulls"] == 1 and p.stats()["kv_released"] == 1
        # Read already: a second decode with the same params recomputes instead of failing.
        r = _post(d, {"max_tokens": 2, "kv_transfer_params": params})
        assert r.status_code == 200 and d.stats()["kv_pull_failures"] == 1
    finally:
        p.stop()
        d.stop()


def _running(sim: SimProc) -> float:
    text = httpx.get(f"{sim.url}/metrics", timeout=5.0).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


def _until(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_sigterm_drains_in_flight_then_exits(tmp_path: Path) -> None:
    # Steps wait for what they need rather than sleeping: on a loaded machine the request may
    # reach the engine late, and the signal may be handled after the next request arrives.
    sim = start_sim(str(tmp_path), extra=[*FAST, "--shutdown-timeout", "30"])
    try:
        result: list[httpx.Response] = []
        t = threading.Thread(target=lambda: result.append(_post(sim, {"max_tokens": 6000})))
        t.start()  # 6000 tokens x ~5 ms x 0.1 = ~3 s wall
        _until(lambda: _running(sim) >= 1, 10.0)
        sim.signal(signal.SIGTERM)
        late: list[int] = []
        _until(
            lambda: late.append(_post(sim, {"max_tokens": 1}).status_code) or late[-1] == 503, 10.0
        )
        assert t.is_alive(), "the in-flight request ended before the drain was seen"
        t.join(30)
        assert result and result[0].status_code == 200
        assert result[0].json()["usage"]["completion_tokens"] == 6000
        assert sim.popen.wait(10) == 0
    finally:
        sim.stop()


def test_sigterm_without_timeout_aborts(tmp_path: Path) -> None:
    sim = start_sim(str(tmp_path), extra=["--preset", "llama-3.1-8b-h200"])
    try:
        errors: list[BaseException] = []
        statuses: list[int] = []

        def run() -> None:
            try:
                statuses.append(_post(sim, {"max_tokens": 2000}).status_code)  # ~10 s
            except httpx.HTTPError as err:
                errors.append(err)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        sim.signal(signal.SIGTERM)
        assert sim.popen.wait(10) == 0
        t.join(10)
        # Aborted: vLLM answers the in-flight request with finish_reason "abort" or drops it.
        assert errors or statuses
    finally:
        sim.stop()
