"""The drain code against the real vllm-router 0.1.17: two router replicas, simulators behind.

No Kubernetes here: the sims stand for pods (`PodInfo`s built by hand), and "lowering the
StatefulSet" is stopping the removed sim with `--shutdown-timeout 0`, which aborts whatever it
still holds, so a request the drain left behind shows up as a failure at the client. The
planner (drain/plan.py), the readings and router admin client (drain/io.py) and the executor
(drain/executor.py) are the operator's own code.

Static P/D mode cannot add a worker back over HTTP, so scale-up (reclaim) is shown on the
local cluster, where the router's Kubernetes discovery is in play (docs/drain.md).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e.platform.closed_loop import Load, Shape
from pdfleet import labels
from pdfleet.drain.executor import execute
from pdfleet.drain.io import RouterFleet, RouterReplica, read_loads
from pdfleet.drain.plan import needs_io, plan_drain
from pdfleet.reconcile.observed import PodInfo
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

# Real time (the drain waits on real streams); shutdown-timeout 0: stopping aborts in-flight.
SIM_ARGS = ["--preset", "llama-3.1-8b-h200", "--time-scale", "1.0", "--shutdown-timeout", "0"]


@dataclass
class Fleet:
    routers: list[RouterReplica]
    prefills: list[SimProc]
    decodes: list[SimProc]
    procs: list[Proc]
    stopped: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Final /sim/stats of the sims the drain removed."""


def _start_router(tmp: Path, i: int, prefills: list[SimProc], decodes: list[SimProc]) -> Proc:
    port, prom = free_port(), free_port()
    argv = static_router_argv(
        port,
        prom,
        [p.url for p in prefills],
        [d.url for d in decodes],
        QUICK_ROUTER_ARGS,
    )
    proc = Proc(argv, str(tmp / f"router{i}.log")).start()
    proc.admin = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    proc.prom = f"http://127.0.0.1:{prom}"  # type: ignore[attr-defined]
    return proc


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    procs: list[Proc] = []
    with stopping(procs):
        prefills = [start_sim(str(tmp_path), extra=SIM_ARGS, name=f"prefill{i}") for i in range(2)]
        procs.extend(prefills)
        decodes = [start_sim(str(tmp_path), extra=SIM_ARGS, name=f"decode{i}") for i in range(3)]
        procs.extend(decodes)
        routers = [_start_router(tmp_path, i, prefills, decodes) for i in range(2)]
        procs.extend(routers)
        for r in routers:
            try:
                wait_http(f"{r.admin}/readiness", 20.0, r.popen)  # type: ignore[attr-defined]
            except Exception:
                print(r.log())
                raise
        replicas = [RouterReplica(r.admin, r.prom) for r in routers]  # type: ignore[attr-defined]
        yield Fleet(replicas, prefills, decodes, procs)


# ----- load ---------------------------------------------------------------------------------


def sim_load(routers: list[str], clients: int, limit: int = 2000) -> Load:
    """Streams to the sims (their model name), as long as the drain must hold."""
    shape = Shape(prompt=(200, 4000), output=(40, 240))
    return Load(routers, clients, shape, limit, model="sim-model", timeout_s=30.0)


# ----- a stand-in for the Kubernetes side -----------------------------------------------------


class SimPods:
    """Pods of one role backed by sims (a `pdfleet.kube.writer.Writer`): annotations kept in
    PodInfos, Events recorded."""

    def __init__(self, fleet: Fleet, role: str, sims: list[SimProc]):
        self.fleet, self.role, self.sims = fleet, role, sims
        self.pods = [
            PodInfo(name=f"svc-{role}-{i}", role=role, ordinal=i, phase="Running", ready=True,
                    pod_ip="127.0.0.1")
            for i in range(len(sims))
        ]  # fmt: skip
        self.events: list[tuple[str, str, str]] = []
        self.reported: set[tuple[str, str]] = set()
        self.urls = {p.name: s.url for p, s in zip(self.pods, self.sims, strict=True)}

    def patch_merge(
        self, kind_name: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> None:
        value = patch["metadata"]["annotations"][labels.DRAINING]
        self.pods = [replace(p, draining_since=value) if p.name == name else p for p in self.pods]

    def apply(self, manifest: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        raise AssertionError("a drain applies no child")

    def delete(self, kind_name: str, name: str, namespace: str) -> None:
        raise AssertionError("no pod is recreated in this test")

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        raise AssertionError("a drain writes no status")

    def event(
        self, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        self.events.append((type_, reason, message))

    def scale_to(self, replicas: int) -> None:
        """What the StatefulSet controller does: stop the pods at ordinals >= replicas."""
        for pod in self.pods[replicas:]:
            sim = self.sims[pod.ordinal]
            self.fleet.stopped[pod.name] = sim.stats()
            sim.signal(signal.SIGTERM)
            sim.popen.wait(10)
        self.pods = self.pods[:replicas]


def drain(fleet: Fleet, pods: SimPods, desired: int, timeout_s: float = 60.0) -> float:
    """Drive plan -> execute the way the controller does, one pass every 0.2 s."""
    router_fleet = RouterFleet(fleet.routers)
    current = len(pods.pods)
    started = time.monotonic()
    try:
        while current > desired:
            assert time.monotonic() - started < timeout_s + 10, "drain did not finish"
            loads = {}
            if needs_io(desired, current, pods.pods):
                marked = {
                    p.name: (pods.urls[p.name], p.role) for p in pods.pods if p.draining_since
                }
                loads = read_loads(router_fleet, marked)
            plan = plan_drain(
                pods.role, desired, current, pods.pods, loads, datetime.now(UTC), timeout_s,
                port=0, url_of=lambda p: pods.urls[p.name], finished=pods.reported,
            )  # fmt: skip
            outcome = execute(plan, pods.role, "test", {}, pods, router_fleet)
            pods.reported |= {(a.pod, a.since or "") for a in outcome.finished}
            assert not outcome.failed, outcome
            if plan.replicas < current:
                pods.scale_to(plan.replicas)
                current = plan.replicas
            time.sleep(0.2)
    finally:
        router_fleet.close()
    return time.monotonic() - started


# ----- tests -----------------------------------------------------------------------------------


def _router_counters(fleet: Fleet) -> dict[str, float]:
    totals: dict[str, float] = {}
    for replica in fleet.routers:
        for line in httpx.get(f"{replica.metrics_url}/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm_router_pd_") and "_errors_total" in line:
                name = line.split("{")[0]
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def test_admin_client_removes_confirms_and_sums_gauges(fleet: Fleet) -> None:
    router_fleet = RouterFleet(fleet.routers)
    try:
        listed, complete = router_fleet.registered()
        assert complete
        assert listed == {s.url for s in fleet.prefills + fleet.decodes}
        # A slow request on each router, both pinned to decode 0 once the others are removed.
        for d in fleet.decodes[1:]:
            router_fleet.deregister(d.url)
        for replica in fleet.routers:
            assert fleet.decodes[1].url not in router_fleet.workers(replica)
        with sim_load([r.admin_url for r in fleet.routers], clients=2, limit=2) as load:
            deadline = time.monotonic() + 10
            best = 0.0
            while time.monotonic() < deadline and best < 2:
                pages, complete = router_fleet.gauges()
                assert complete and len(pages) == 2
                per_replica = [p[labels.ROLE_DECODE].get(fleet.decodes[0].url, 0) for p in pages]
                best = max(best, sum(per_replica))
                time.sleep(0.05)
            assert best == 2, "one request in flight on each replica, summed"
        assert load.count("ok") == 2
        # An unknown URL answers 200 at the router; the client confirms with GET /workers.
        router_fleet.deregister("http://127.0.0.1:1")
        listed, _ = router_fleet.registered()
        assert fleet.decodes[0].url in listed
    finally:
        router_fleet.close()


def test_drain_under_streaming_load_loses_nothing(fleet: Fleet) -> None:
    routers = [r.admin_url for r in fleet.routers]
    decode_pods = SimPods(fleet, labels.ROLE_DECODE, fleet.decodes)
    prefill_pods = SimPods(fleet, labels.ROLE_PREFILL, fleet.prefills)
    durations: dict[str, float] = {}
    with sim_load(routers, clients=4) as load:
        time.sleep(3.0)
        durations["decode 3->1"] = drain(fleet, decode_pods, desired=1)
        time.sleep(1.0)
        durations["prefill 2->1"] = drain(fleet, prefill_pods, desired=1)
        time.sleep(2.0)
    results = load.results
    longest = max(r.ended - r.started for r in results)
    summary: dict[str, Any] = {
        "sent": len(results),
        "ok": load.count("ok"),
        "failed": load.count("failed"),
        "truncated": load.count("truncated"),
        "longest_request_s": round(longest, 2),
        "drain_s": {k: round(v, 2) for k, v in durations.items()},
    }
    decode_stats = [*(fleet.stopped[f"svc-decode-{i}"] for i in (1, 2)), fleet.decodes[0].stats()]
    prefill_stats = [fleet.stopped["svc-prefill-1"], fleet.prefills[0].stats()]
    summary["recomputed"] = sum(
        s["recompute_invalid_params"] + s["kv_pull_failures"] for s in decode_stats
    )
    summary["kv_expired"] = sum(s["kv_expired"] for s in prefill_stats)
    summary["router_errors"] = _router_counters(fleet)
    print(json.dumps(summary))
    bad = [r for r in results if r.outcome != "ok"]
    assert not bad, bad[:5]
    assert summary["recomputed"] == 0 and summary["kv_expired"] == 0
    assert not any(summary["router_errors"].values()), summary["router_errors"]
    # Every request of the run pulled its KV from a prefill: none was served any other way.
    assert sum(s["kv_pulls"] for s in decode_stats) == len(results)
    # Both removed decodes served traffic before the drain (the test is not vacuous).
    assert all(s["kv_pulls"] > 0 for s in decode_stats)
    # Each drain took about as long as the longest request still running, not the timeout.
    for took in durations.values():
        assert took <= longest + 2.0 + 1.0, summary
    reasons = [reason for _, reason, _ in decode_pods.events + prefill_pods.events]
    assert reasons.count("Drained") == 3 and "DrainForced" not in reasons


def test_removal_without_drain_is_seen_as_lost_requests(fleet: Fleet) -> None:
    """The control: the same load and stop, no drain. The test above would catch a loss."""
    with sim_load([r.admin_url for r in fleet.routers], clients=4) as load:
        time.sleep(2.0)
        fleet.decodes[2].signal(signal.SIGTERM)
        fleet.decodes[2].popen.wait(10)
        time.sleep(3.0)
    lost = load.count("failed") + load.count("truncated")
    print(json.dumps({"sent": len(load.results), "lost": lost}))
    assert lost > 0
