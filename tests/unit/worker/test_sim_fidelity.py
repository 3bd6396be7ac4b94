"""The simulator's latencies, seen by a client, match the PerfModel formulas.

A real `pdfleet-sim` process at time scale 1; TTFT and inter-token latency are measured from
the client's own timestamps on a streaming request, and from the sim's /metrics histograms.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdfleet_worker.perfmodel import preset
from pdfleet_worker.sim.procs import SimProc, start_sim

PRESET = "llama-3.1-70b-h100-tp4"  # long steps (~15 ms) keep scheduler noise under 5 %
# Over the 8192-token budget: two chunked-prefill steps, ~0.83 s of TTFT, which keeps the
# fixed HTTP overhead of a loaded machine well inside the 5 % tolerance.
PROMPT_TOKENS = 12000
OUTPUT_TOKENS = 40


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProc]:
    p = start_sim(str(tmp_path), extra=["--preset", PRESET, "--time-scale", "1"])
    try:
        yield p
    finally:
        p.stop()


def _stream_timestamps(client: httpx.Client, url: str, body: dict[str, object]) -> list[float]:
    stamps: list[float] = []
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    stamps.append(time.perf_counter() - t0)
    return stamps


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_single_request_ttft_and_itl_match_model(sim: SimProc) -> None:
    model = preset(PRESET)
    body = {
        "model": "sim-model",
        "prompt": "tok " * PROMPT_TOKENS,
        "max_tokens": OUTPUT_TOKENS,
        "stream": True,
    }
    with httpx.Client(timeout=30.0) as client:
        # Warm the connection and the server's first streaming path (lazy imports), then
        # measure.
        _stream_timestamps(client, sim.url, {**body, "max_tokens": 2})
        before = client.get(f"{sim.url}/metrics").text
        stamps = _stream_timestamps(client, sim.url, body)
        # Two more requests: the client's clock runs on a shared, noisy machine, so the
        # medians of three are compared (one request's figures are kept for the engine's
        # own histograms below).
        between = client.get(f"{sim.url}/metrics").text
        runs = [stamps, *(_stream_timestamps(client, sim.url, body) for _ in range(2))]
    assert all(len(run) == OUTPUT_TOKENS for run in runs)

    chunk = model.max_num_batched_tokens
    want_ttft = model.step_seconds([(chunk, 0)], 0, 0) + model.step_seconds(
        [(PROMPT_TOKENS - chunk, chunk)], 0, 0
    )
    # Chunking only adds one step's intercept to the single-pass formula.
    assert want_ttft == pytest.approx(
        model.prefill_seconds(PROMPT_TOKENS) + model.prefill_a_ms / 1e3
    )
    want_itl = sum(
        model.decode_step_seconds(1, PROMPT_TOKENS + k + 1) for k in range(OUTPUT_TOKENS - 1)
    ) / (OUTPUT_TOKENS - 1)
    got_ttft = statistics.median(run[0] for run in runs)
    got_itl = statistics.median(
        statistics.fmean(b - a for a, b in itertools.pairwise(run)) for run in runs
    )
    print(
        f"TTFT client {got_ttft * 1e3:.2f} ms vs model {want_ttft * 1e3:.2f} ms; "
        f"ITL client {got_itl * 1e3:.3f} ms vs model {want_itl * 1e3:.3f} ms (medians of 3)"
    )
    assert got_ttft == pytest.approx(want_ttft, rel=0.05)
    assert got_itl == pytest.approx(want_itl, rel=0.05)

    # The engine's own histograms carry the same figures (simulated seconds).
    name = "vllm:time_to_first_token_seconds_sum"
    assert _metric(between, name) - _metric(before, name) == pytest.approx(want_ttft, rel=0.02)
    assert _metric(between, "vllm:generation_tokens_total") == OUTPUT_TOKENS + 2
    assert _metric(between, "vllm:prompt_tokens_total") == 2 * PROMPT_TOKENS
