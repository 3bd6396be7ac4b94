"""Pure parts of the activator benchmark (the figures, the checks, the tables) and its TCP relay
on loopback; the run itself is `make bench-activator`."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from e2e.benchmarks.bench_activator import (
    Sample,
    Tap,
    added,
    arm_summary,
    checks,
    header_seqs,
    hold_figures,
    inversions,
    no_healthy_worker,
    render_markdown,
)


def sample(sent: float, ttfb: float = 0.01, total: float = 0.1, status: int = 200) -> Sample:
    return Sample(status, sent, ttfb, ttfb + 0.002, total, tokens=16, done=status == 200)


def test_header_seqs_reads_the_header_in_any_case_and_not_the_body() -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-bench-seq: 7\r\nX-BENCH-SEQ:12\r\n\r\n"
    assert header_seqs(head + b'{"prompt": "x-bench-seq: 3"}') == [7, 12]


def test_inversions_count_pairs_out_of_order() -> None:
    assert inversions([0, 1, 2, 3]) == 0
    assert inversions([1, 0, 2, 3]) == 1
    assert inversions([3, 2, 1, 0]) == 6


def test_added_is_the_difference_and_the_ratio_of_medians_and_p95s() -> None:
    direct = arm_summary([sample(0, ttfb=t / 1000) for t in range(1, 101)], wall_s=10.0)
    via = arm_summary([sample(0, ttfb=(t + 1) / 1000) for t in range(1, 101)], wall_s=10.0)
    assert direct["ttfb_ms"] == pytest.approx({"median": 50.5, "p95": 95.0})
    assert direct["requests_per_s"] == 10.0 and direct["ok"] == 100 and direct["tokens"] == [16, 16]
    got = added(direct, via)["ttfb"]
    assert got["median_ms"] == pytest.approx(1.0) and got["p95_ms"] == pytest.approx(1.0)
    assert got["median_ratio"] == pytest.approx(51.5 / 50.5)


def test_a_failed_request_is_counted_and_left_out_of_the_times() -> None:
    summary = arm_summary([sample(0), sample(0, ttfb=5.0, total=5.0, status=503)], wall_s=1.0)
    assert summary["ok"] == 1 and summary["failed"] == ["503 "]
    assert summary["ttfb_ms"]["median"] == pytest.approx(10.0)


def results(order: list[int], expiry_status: int = 503) -> dict[str, Any]:
    """A run's figures as the benchmark assembles them, 3 held requests."""
    samples = [sample(100 + i * 0.025, ttfb=3 - i * 0.025, total=3.2 - i * 0.025) for i in range(3)]
    reached = {seq: 102.5 + k * 0.001 for k, seq in enumerate(order)}
    wake = {"started": 101.0, "sims_up": 102.0, "router_ready": 102.3}
    level: dict[str, Any] = {
        "concurrency": 1,
        "direct": arm_summary([sample(0)], 1.0),
        "activator": arm_summary([sample(0, ttfb=0.011)], 1.0),
    }
    level["added"] = added(level["direct"], level["activator"])
    usage = {"rss_mb": 50.0, "hwm_mb": 52.0, "cpu_s": 1.0}
    proc = {"idle": usage, "after_load": usage, "requests": 2, "cpu_ms_per_request": 0.5}
    names = ("requests_total", "held_total", "forwarded_total")
    counters = {**dict.fromkeys(names, 3), "expired_total": 0, "upstream_errors_total": 0}
    out: dict[str, Any] = {
        "command": "python -m e2e.benchmarks.bench_activator",
        "date": "2026-12-03 00:00 UTC",
        "commit": "abc1234",
        "machine": "2 cores (x86_64), loopback only",
        "versions": {"vllm-router": "0.1.17", "aiohttp": "3.14.5", "python": "3.11.7"},
        "load_average": [1.0, 1.5],
        "setup": {
            "requests": 1,
            "concurrency": [1],
            "blocks": 1,
            "warmup": 0,
            "think_ms": 50.0,
            "prompt_tokens": 256,
            "max_tokens": 16,
            "time_scale": 1.0,
        },
        "awake": {"latency": [level], "activator": proc, "router": proc},
        "zero": {
            "readiness_503_after_s": 2.1,
            "no_healthy_worker_after_s": 3.0,
            "readiness_body": "{}",
            "direct": {"status": 503, "ms": 1.2, "body": "No available workers"},
        },
        "expiry": {
            "max_wait_s": 3.0,
            "status": expiry_status,
            "after_s": 3.01,
            "retry_after": "5",
            "expected_retry_after": "5",
            "error_type": "service_unavailable",
            "message": "m",
            "expired_total": 1,
        },
        "hold": {
            **hold_figures(samples, reached, wake),
            "activator_while_held": {"requests_held": 3, "upstream_ready": 0},
            "activator_counters": counters,
            "sims": {"prefill_requests": 3, "kv_pulls": 3, "kv_pull_failures": 0, "recomputed": 0},
            "activator_memory": {"idle": usage, "holding": usage, "after": usage},
        },
    }
    out["checks"] = checks(out)
    return out


def test_held_requests_in_arrival_order_pass_every_check_and_render() -> None:
    run = results([0, 1, 2])
    hold = run["hold"]
    assert hold["router_order_is_arrival_order"] and hold["answered_200"] == 3
    assert hold["held_ms"]["max"] == pytest.approx(2500.0)  # the first one sent waited longest
    assert hold["timeline_s"]["router_ready"] == pytest.approx(2.3)
    assert math.isclose(hold["rows"][2]["sent_s"], 0.05)
    assert all(c["ok"] for c in run["checks"]), run["checks"]
    table = render_markdown(run)
    assert "**arrival order**" in table and "| first byte | 10.00 ms | 11.00 ms | +1.00 ms" in table


def test_out_of_order_or_a_wrong_expiry_fails_its_check() -> None:
    failed = {c["check"] for c in results([1, 0, 2], expiry_status=502)["checks"] if not c["ok"]}
    assert failed == {
        "hold: they reached the router in arrival order",
        "maxWait: 503 with Retry-After, about maxWait after it came",
    }


async def test_the_tap_passes_bytes_both_ways_and_notes_the_order_they_passed() -> None:
    echoes: list[asyncio.Task[Any]] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        echoes.extend(t for t in [asyncio.current_task()] if t is not None)
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    tap = Tap(upstream.sockets[0].getsockname()[1])
    port = int((await tap.start()).rsplit(":", 1)[1])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = b""
        for part in (b"GET / HTTP/1.1\r\nX-Bench-", b"Seq: 4\r\n\r\n", b"GET / HTTP/1.1\r\n",
                     b"x-bench-seq: 2\r\n\r\n"):  # fmt: skip
            writer.write(part)
            await writer.drain()
            sent += part
            await asyncio.sleep(0.01)  # separate reads at the relay
        assert await asyncio.wait_for(reader.readexactly(len(sent)), 5) == sent
        assert list(tap.reached) == [4, 2]
        writer.close()
        await writer.wait_closed()
    finally:
        await tap.close()
        await asyncio.gather(*echoes)
        upstream.close()
        await upstream.wait_closed()


def test_at_zero_means_no_healthy_worker_of_either_role() -> None:
    body = '{"status":"not_ready","prefill":{"healthy":0,"total":1},"decode":{"healthy":%d}}'
    assert no_healthy_worker(body % 0)
    assert not no_healthy_worker(body % 1)
    assert not no_healthy_worker("not json")
