"""The SLO-driven autoscaler on the local cluster: a load shift, no lost request, Prometheus down.

One run of the demo's load (e2e/scenarios/demo.py: a warm-up, a long-prompt surge, long outputs, a
cool-down) drives the demo fleet (e2e/scenarios/demo-fleet.yaml: 4-GPU budget, prefill and decode
1..3, TTFT 500 ms and ITL 6 ms at p90) through the real router while the service's status is sampled
every 2 s. The surge must grow prefill to three replicas within a few intervals, leaving decode one
GPU (the budget binds; an idle decode pool has usually shrunk to one before the surge), and TTFT
measured at the client must be back under target once the new replicas serve; the long outputs must
do the opposite for decode and ITL (the median at the client under target, the p90 lower than on one
decode: the policy's ITL signal is the mean). Every request, through all the scale-downs, must
complete, the manifest as applied must show no drift in a server-side diff after those decisions,
and the operator must have counted them by its fixed reasons (its SLO series are printed). Then,
under a light load, Prometheus is stopped: the autoscaler holds with `MetricsAvailable=False`, and
once Prometheus is back (same port and TSDB) the condition turns True and decisions resume.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from e2e.platform.cluster import Cluster
from e2e.platform.fleet import (
    METRICS_AVAILABLE,
    Drive,
    Fleet,
    Sample,
    condition,
    drive,
    p90,
    phase_starts,
    slo_targets,
)
from e2e.platform.loadgen import OK, Phase, Record, arrivals
from e2e.scenarios.demo import demo_phases
from pdfleet.labels import WORKER_ROLES as ROLES
from tests.e2e.autoscale.conftest import TIME_SCALE

pytestmark = pytest.mark.timeout(1200)

#: The demo's load with more time for decode to settle, and a cool-down long enough for
#: decode to shrink again while requests still stream (20 s stabilization, then a drain).
SHIFT: list[Phase] = [
    *demo_phases()[:2],
    replace(demo_phases()[2], duration_s=200.0),
    replace(demo_phases()[3], duration_s=60.0),
]
#: A steady light load while Prometheus goes away and comes back.
STEADY = [Phase("steady", 110.0, 0.5, 1000, 64)]
#: How long after a phase starts the autoscaler may take to answer it: a few 5 s intervals,
#: one worker start-up (10 s) and, for decode, the time the long streams take to pile up.
PREFILL_GRACE_S = 60.0
DECODE_GRACE_S = 90.0
#: After the last new replica turned ready, latencies are judged on requests started this
#: much later (the backlog of the violating period is gone by then).
SETTLE_S = 15.0
BUDGET = 4
DECISIONS = "pdfleet_autoscaler_decisions_total{"


def first(samples: Sequence[Sample], predicate: Callable[[Sample], bool]) -> Sample | None:
    return next((s for s in samples if predicate(s)), None)


def between(samples: Sequence[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.t <= end]


def ok_after(records: Sequence[Record], phase: str, start_s: float) -> list[Record]:
    return [r for r in records if r.phase == phase and r.outcome == OK and r.start_s >= start_s]


def timeline(samples: Sequence[Sample]) -> str:
    return "\n".join(
        f"{s.t:6.1f} {s.phase:<13} P {s.prefill['desired']}/{s.prefill['ready']} "
        f"D {s.decode['desired']}/{s.decode['ready']} ttft {s.ttft_s * 1000:5.0f}ms "
        f"itl {s.itl_s * 1000:5.2f}ms {s.metrics_available} {s.decision}"
        for s in samples
    )


@pytest.fixture(scope="module")
def shift(fleet: Fleet) -> Drive:
    state = asyncio.run(drive(fleet, SHIFT, TIME_SCALE))
    print(timeline(state.samples))
    return state


def test_long_prompt_surge_grows_prefill_then_ttft_recovers(shift: Drive, fleet: Fleet) -> None:
    start = phase_starts(SHIFT)["long prompts"]
    end = start + SHIFT[1].duration_s
    samples = between(shift.samples, start, end)
    grown = first(samples, lambda s: s.prefill["desired"] >= 3)
    assert grown is not None, timeline(samples)
    assert grown.t - start <= PREFILL_GRACE_S, timeline(samples)
    # The budget binds: three prefill replicas leave one GPU to decode.
    for s in shift.samples:
        assert s.prefill["desired"] + s.decode["desired"] <= BUDGET, timeline(shift.samples)
    assert grown.decode["desired"] == 1, timeline(samples)
    ready = first(samples, lambda s: s.t >= grown.t and s.prefill["ready"] >= 3)
    assert ready is not None, timeline(samples)
    late = ok_after(shift.run.records, "long prompts", ready.t + SETTLE_S)
    assert len(late) >= 20, (ready.t, len(late))
    ttft_target, _ = slo_targets(fleet.manifest)
    measured = p90([r.ttft_s for r in late])
    print(f"TTFT p90 of {len(late)} requests from t={ready.t + SETTLE_S:.0f}s: {measured:.3f}s")
    assert measured <= ttft_target


def test_long_outputs_grow_decode_then_itl_recovers(shift: Drive, fleet: Fleet) -> None:
    start = phase_starts(SHIFT)["long outputs"]
    samples = between(shift.samples, start, start + SHIFT[2].duration_s)
    grown = first(samples, lambda s: s.decode["desired"] >= 2)
    assert grown is not None, timeline(samples)
    assert grown.t - start <= DECODE_GRACE_S, timeline(samples)
    # The GPUs come from prefill, which the short-prompt load no longer needs.
    peak_prefill = max(s.prefill["desired"] for s in shift.samples)
    assert min(s.prefill["desired"] for s in samples) < peak_prefill, timeline(samples)
    top = max(s.decode["ready"] for s in samples)
    reached = first(samples, lambda s: s.decode["ready"] == top)
    assert reached is not None and top >= 2, timeline(samples)
    records = shift.run.records
    one = [r for r in ok_after(records, "long outputs", 0.0) if r.end_s <= grown.t]
    assert one, timeline(samples)
    late = ok_after(records, "long outputs", reached.t + SETTLE_S)
    assert len(late) >= 15, (reached.t, top, len(late))
    _, itl_target = slo_targets(fleet.manifest)
    before, after = p90([r.itl_s for r in one]), p90([r.itl_s for r in late])
    median = sorted(r.itl_s for r in late)[len(late) // 2]
    print(f"ITL of {len(late)} requests from t={reached.t + SETTLE_S:.0f}s at {top} decode: "
          f"p50 {median * 1000:.2f}ms, p90 {after * 1000:.2f}ms "
          f"(p90 {before * 1000:.2f}ms on one decode)")  # fmt: skip
    # The policy's ITL signal is the window mean (promql.py), so the pool it settles on holds
    # the target for the typical request; the p90 moves towards it from above.
    assert median <= itl_target
    assert after < before


def test_scale_downs_under_load_lose_no_request(shift: Drive) -> None:
    records = shift.run.records
    assert len(records) == len(arrivals(SHIFT))
    lost = [r for r in records if r.outcome != OK]
    assert not lost, lost[:5]
    downs = [
        (b.t, role)
        for a, b in zip(shift.samples, shift.samples[1:], strict=False)
        for role in ("prefill", "decode")
        if getattr(b, role)["desired"] < getattr(a, role)["desired"]
    ]
    assert {role for _, role in downs} == {"prefill", "decode"}, downs


def test_the_applied_manifest_shows_no_drift_after_the_autoscaler_acted(
    shift: Drive, fleet: Fleet, bridge_cluster: Cluster
) -> None:
    # What a GitOps tool checks: the user's manifest, as applied, against the live object
    # once the autoscaler has moved both pools away from the manifest's `initial` counts
    # (tests/integration/cluster/test_gitops.py does it after a status patch standing in for it).
    initial = {role: fleet.manifest["spec"][role]["replicas"]["initial"] for role in ROLES}
    moved = {r for s in shift.samples for r in ROLES if getattr(s, r)["desired"] != initial[r]}
    assert moved == set(ROLES), timeline(shift.samples)
    status = fleet.status()
    print(f"desired now {({r: status[r]['desired'] for r in ROLES})}, initial {initial}; "
          f"last decision {status['autoscaler']['lastDecision']!r}")  # fmt: skip
    print(f"status.slo {status.get('slo')}")
    diff = bridge_cluster.server_side_diff([fleet.manifest])
    assert diff.returncode == 0, f"drift after the autoscaler acted:\n{diff.stdout}{diff.stderr}"


def test_the_operator_counts_decisions_by_a_fixed_reason(shift: Drive, fleet: Fleet) -> None:
    # The exposition sorts labels by name, so each one is looked for on its own.
    service = (f'namespace="{fleet.namespace}"', f'pdfleet_service="{fleet.name}"')
    series = {
        k: v for k, v in fleet.operator.metrics().items() if all(label in k for label in service)
    }
    for key in sorted(k for k in series if k.startswith("pdfleet_slo_")):
        print(f"{key} {series[key]:g}")  # the SLO figures of the last decision
    decisions = {k: v for k, v in series.items() if k.startswith(DECISIONS)}
    reasons = {reason for k in decisions for reason in re.findall(r'reason="([^"]*)"', k)}
    print(f"decision reasons: {sorted(reasons)}")
    assert reasons <= {"OverTarget", "GPUBudget", "Load", "MetricsMissing", "MetricsStale",
                       "MetricsNaN"}, sorted(decisions)  # fmt: skip
    for role in ROLES:
        for direction in ("up", "down"):
            moved = [k for k in decisions if f'"{role}"' in k and f'direction="{direction}"' in k]
            assert sum(decisions[k] for k in moved) > 0, (role, direction, sorted(decisions))


def test_prometheus_down_holds_then_decisions_resume(shift: Drive, fleet: Fleet) -> None:
    marks: dict[str, Any] = {}

    def outage(state: Drive) -> None:
        def now() -> float:
            return time.monotonic() - state.started

        def wait_for(predicate: Callable[[Sample], bool], after: float, timeout_s: float) -> Sample:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                found = first([s for s in state.samples if s.t >= after], predicate)
                if found is not None:
                    return found
                time.sleep(0.5)
            raise TimeoutError(f"nothing like that within {timeout_s:.0f}s after t={after:.0f}s")

        time.sleep(15)
        marks["before"] = fleet.status()
        marks["stop"] = now()
        fleet.prometheus.stop()
        marks["held"] = wait_for(
            lambda s: s.metrics_available.startswith("False"), marks["stop"], 30
        )
        marks["held_status"] = fleet.status()
        time.sleep(25)
        marks["restart"] = now()
        fleet.prometheus.restart()
        marks["back"] = wait_for(
            lambda s: s.metrics_available.startswith("True"), marks["restart"], 60
        )
        last = marks["back"].decision_time
        marks["resumed"] = wait_for(lambda s: s.decision_time > last, marks["back"].t, 30)

    state = asyncio.run(drive(fleet, STEADY, TIME_SCALE, during=outage))
    print(timeline(state.samples))
    held = condition(marks["held_status"], METRICS_AVAILABLE)
    assert held is not None and held["status"] == "False", held
    assert held["reason"] == "MetricsMissing", held
    print(f"Prometheus down at t={marks['stop']:.0f}s: {held}")
    # The autoscaler holds: nothing changes from the stop until Prometheus is back.
    before = {role: marks["before"][role]["desired"] for role in ("prefill", "decode")}
    down = between(state.samples, marks["stop"], marks["back"].t - 0.01)
    assert down and all(
        (s.prefill["desired"], s.decode["desired"]) == (before["prefill"], before["decode"])
        for s in down
    ), timeline(down)
    # Back: the condition is True again and decisions are the policy's, not a hold.
    back = fleet.status()
    available = condition(back, METRICS_AVAILABLE)
    assert available is not None and available["status"] == "True", available
    assert available["reason"] == "MetricsFresh", available
    assert not back["autoscaler"]["reason"].startswith("holding"), back["autoscaler"]
    lost = [r for r in state.run.records if r.outcome != OK]
    assert not lost and len(state.run.records) == len(arrivals(STEADY)), lost[:5]
