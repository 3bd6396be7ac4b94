"""The real vllm-router 0.1.17 in --vllm-pd-disaggregation mode in front of four simulators.

Two prefill and two decode `pdfleet-sim` processes on loopback; every request, streaming or
not, completions or chat, must go prefill -> decode with valid NIXL params: each decode pulled
its KV from the prefill named in the params (the prefill served the read and released its
blocks) and never took the recompute path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e.platform.loadgen import streamed_text
from pdfleet_worker.sim.procs import (
    QUICK_ROUTER_ARGS,
    Proc,
    SimProc,
    free_port,
    start_sim,
    static_router_argv,
    stopping,
    wait_http,
)

SIM_ARGS = ["--preset", "llama-3.1-8b-h200", "--time-scale", "0.1"]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, list[SimProc], list[SimProc]]]:
    procs: list[Proc] = []
    with stopping(procs):
        prefills = [start_sim(str(tmp_path), extra=SIM_ARGS, name=f"prefill{i}") for i in range(2)]
        procs.extend(prefills)
        decodes = [start_sim(str(tmp_path), extra=SIM_ARGS, name=f"decode{i}") for i in range(2)]
        procs.extend(decodes)
        port, prom = free_port(), free_port()
        argv = static_router_argv(
            port,
            prom,
            [p.url for p in prefills],
            [d.url for d in decodes],
            QUICK_ROUTER_ARGS,
        )
        router = Proc(argv, os.path.join(tmp_path, "router.log")).start()
        procs.append(router)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/readiness", 20.0, router.popen)
        except Exception:
            print(router.log())
            raise
        yield url, prefills, decodes


def _stream_text(client: httpx.Client, url: str, body: dict[str, Any], chat: bool) -> str:
    with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200, resp.read()
        return streamed_text(resp.iter_lines(), chat)


def _count_tokens(text: str) -> int:
    return len(text.split())


def test_every_request_goes_prefill_then_decode_with_valid_params(
    fleet: tuple[str, list[SimProc], list[SimProc]],
) -> None:
    url, prefills, decodes = fleet
    prompt = "the cat sat on the mat " * 50  # 300 tokens
    messages = [{"role": "user", "content": prompt}]
    n_each, max_tokens = 4, 12
    with httpx.Client(timeout=20.0) as client:
        for _ in range(n_each):
            r = client.post(
                f"{url}/v1/completions",
                json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens},
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["usage"]["completion_tokens"] == max_tokens
            assert body["choices"][0]["finish_reason"] == "length"
            assert _count_tokens(body["choices"][0]["text"]) == max_tokens

            text = _stream_text(
                client,
                f"{url}/v1/completions",
                {"model": "sim-model", "prompt": prompt, "stream": True, "max_tokens": max_tokens},
                chat=False,
            )
            assert _count_tokens(text) == max_tokens

            r = client.post(
                f"{url}/v1/chat/completions",
                json={"model": "sim-model", "messages": messages, "max_tokens": max_tokens},
            )
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]["content"]
            assert _count_tokens(msg) == max_tokens

            text = _stream_text(
                client,
                f"{url}/v1/chat/completions",
                {
                    "model": "sim-model",
                    "messages": messages,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "max_tokens": max_tokens,
                },
                chat=True,
            )
            assert _count_tokens(text) == max_tokens

    total = 4 * n_each
    p_stats = [p.stats() for p in prefills]
    d_stats = [d.stats() for d in decodes]
    # Prefill side: each request was a prefill half whose KV was held, read and released.
    assert sum(s["prefill_requests"] for s in p_stats) == total
    assert sum(s["kv_served_reads"] for s in p_stats) == total
    assert sum(s["kv_released"] for s in p_stats) == total
    assert all(s["held_now"] == 0 and s["kv_expired"] == 0 for s in p_stats)
    assert all(s["prefill_requests"] > 0 for s in p_stats), "round_robin uses both prefills"
    # Decode side: every request pulled its KV; none recomputed, none came without params.
    assert sum(s["kv_pulls"] for s in d_stats) == total
    assert all(s["kv_pull_failures"] == 0 for s in d_stats)
    assert all(s["recompute_invalid_params"] == 0 for s in d_stats)
    assert all(s["plain_requests"] == 0 and s["prefill_requests"] == 0 for s in d_stats)
    assert all(s["kv_pulls"] > 0 for s in d_stats), "round_robin uses both decodes"
    # And no prefill sim ever did a decode, nor a decode sim a prefill.
    assert all(s["kv_pulls"] == 0 for s in p_stats)
