"""Graceful scale-down on the local cluster: operator, process bridge, real vllm-router.

The tests run in file order on one service (3 prefill, 4 decode, one router): scale cycles
under streaming load, a scale-up that arrives during a drain, and `kubectl delete pod` of a
busy decode. A lost request is any client error, cut stream, KV recompute, failed KV pull,
expired KV lease or router error. The 20-cycle run is `python -m e2e.scenarios.drain_scenario`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
import pytest

from e2e.platform.closed_loop import Load, Shape, count, stream_once
from e2e.platform.cluster import wait_until
from e2e.platform.service import HIGH, Service, pod_url, router_workers, settled
from e2e.scenarios.drain_scenario import (
    cycles_under_load,
    router_error_counters,
    router_gauges,
    sim_log_counters,
)
from pdfleet import labels

pytestmark = pytest.mark.timeout(900)

#: Cycles in the default run, a few to keep it short; PDFLEET_DRAIN_CYCLES=20 for the full one.
CYCLES = int(os.environ.get("PDFLEET_DRAIN_CYCLES", "3"))
#: Streams long enough (several seconds) that a drained worker is still busy for a while.
LONG = Shape(prompt=(200, 600), output=(800, 1200))
DECODE = labels.ROLE_DECODE


def assert_nothing_lost(
    results: list[Any], log_counters: dict[str, int], errors: dict[str, float]
) -> None:
    bad = [r for r in results if r.outcome != "ok"]
    assert not bad, bad[:5]
    assert not any(log_counters.values()), log_counters
    assert not any(errors.values()), errors


def sim_stats(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{url}/sim/stats", timeout=5).json()
    return stats


def test_scale_cycles_under_load_lose_nothing(service: Service) -> None:
    report = cycles_under_load(service, CYCLES, progress=print)
    figures = report.figures()
    print(json.dumps(figures))
    assert report.stopped is None, report.stopped
    for drain in report.drains:
        print(f"  drain {drain.pod}: {drain.duration_s:.1f}s, could hold {drain.holdable_s:.2f}s")
    assert_nothing_lost(report.results, report.sim, report.router_errors)
    assert figures["sent"] >= 20 * CYCLES, figures  # load ran all along
    # Every scale-down drained its pods (2 prefill + 3 decode per cycle), none forced.
    assert len(report.drains) == 5 * CYCLES, [d.pod for d in report.drains]
    assert figures["drain"]["forced"] == 0
    # Each drain ended within what its pod could still hold, plus 2 s.
    for drain in report.drains:
        assert drain.duration_s <= drain.holdable_s + 2.0, drain


def _marked_and_deregistered(service: Service) -> dict[str, str]:
    """Decode pods (name -> uid) marked draining and gone from the router's list."""
    listed = router_workers(service.router())
    if listed is None:  # the router did not answer: unknown, not deregistered
        return {}
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in service.role_pods(DECODE)
        if labels.DRAINING in (p["metadata"].get("annotations") or {})
        and not p["metadata"].get("deletionTimestamp")
        and pod_url(p) not in listed
    }


def test_scale_up_during_a_drain_takes_the_pods_back(service: Service) -> None:
    errors_before = router_error_counters(service.router_ip())
    counters_before = sim_log_counters(service.log_dir, service.namespace)
    with Load(service.router(), clients=8, shape=LONG) as load:
        time.sleep(2.0)  # eight long streams spread over the four decodes
        service.scale({DECODE: 1})
        try:
            taken = wait_until(
                lambda: _marked_and_deregistered(service) or None, 20, "a deregistered pod"
            )
        except TimeoutError:
            seen = [
                (p["metadata"]["name"], p["status"].get("podIP"),
                 (p["metadata"].get("annotations") or {}).get(labels.DRAINING),
                 p["metadata"].get("deletionTimestamp"))
                for p in service.role_pods(DECODE)
            ]  # fmt: skip
            raise AssertionError((router_workers(service.router()), seen)) from None
        service.scale(HIGH)
        wait_until(lambda: settled(service, HIGH), 120, "all pods back and listed")
    cancelled = [e.message for e in service.events(("DrainCancelled",))]
    assert any("recreating it" in m for m in cancelled), cancelled
    pods = {p["metadata"]["name"]: p for p in service.role_pods(DECODE)}
    for name, uid in taken.items():
        assert pods[name]["metadata"]["uid"] != uid, f"{name} was not recreated"
    # The router lists every decode again, and the recreated ones serve.
    listed = router_workers(service.router()) or {}
    assert all(listed.get(pod_url(p)) == (DECODE, True) for p in pods.values()), listed
    before = {name: sim_stats(pod_url(p))["kv_pulls"] for name, p in pods.items()}
    with httpx.Client(timeout=30) as http:
        extra = [stream_once(http, f"{service.router()}/v1/completions", 100, 8) for _ in range(40)]
    served = {name: sim_stats(pod_url(p))["kv_pulls"] - before[name] for name, p in pods.items()}
    print(
        json.dumps({"recreated": sorted(taken), "served_after": served, "sent": len(load.results)})
    )
    assert count(extra, "ok") == len(extra)
    assert all(served[name] > 0 for name in taken), served
    counters = sim_log_counters(service.log_dir, service.namespace)
    assert_nothing_lost(
        load.snapshot(),
        {k: counters[k] - counters_before[k] for k in counters},
        {
            k: v - errors_before.get(k, 0.0)
            for k, v in router_error_counters(service.router_ip()).items()
        },
    )


def test_deleting_a_busy_decode_loses_nothing(service: Service) -> None:
    errors_before = router_error_counters(service.router_ip())
    counters_before = sim_log_counters(service.log_dir, service.namespace)
    with (
        Load(service.router(), clients=4) as load,
        Load(service.router(), clients=4, shape=LONG) as long,
    ):
        time.sleep(3.0)
        gauges = router_gauges(service.router_ip())
        pods = {pod_url(p): p for p in service.role_pods(DECODE)}
        url = max(pods, key=lambda u: gauges.get(u, 0.0))
        victim = pods[url]
        busy = gauges.get(url, 0.0)
        service.core.delete_namespaced_pod(victim["metadata"]["name"], service.namespace)
        started = time.monotonic()

        def replaced() -> bool:
            names = {p["metadata"]["uid"] for p in service.role_pods(DECODE)}
            return victim["metadata"]["uid"] not in names and settled(service, HIGH)

        wait_until(replaced, 120, "the deleted decode replaced and listed")
        took = time.monotonic() - started
        time.sleep(1.0)
    results = load.snapshot() + long.snapshot()
    log = service.log_dir / (
        f"{service.namespace}_{victim['metadata']['name']}_{victim['metadata']['uid'][:8]}"
    )
    events = (log / "vllm.events.log").read_text()
    print(json.dumps({"busy_at_delete": busy, "sent": len(results), "replaced_s": round(took, 1)}))
    print(events)
    assert busy >= 1, "the deleted decode held requests"
    assert "preStop exited 0" in events and '"drained": true' in events, events
    counters = sim_log_counters(service.log_dir, service.namespace)
    assert_nothing_lost(
        results,
        {k: counters[k] - counters_before[k] for k in counters},
        {
            k: v - errors_before.get(k, 0.0)
            for k, v in router_error_counters(service.router_ip()).items()
        },
    )
