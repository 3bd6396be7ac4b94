"""Revision-paired rollouts on the local cluster: operator, process bridge, real vllm-router,
simulated workers (docs/upgrade.md).

A KV-incompatible change (the model, the engine image) brings up both pools of the new revision
beside the old, moves the router in one step and retires the old revision through the drain,
under streaming load. Each simulator refuses KV from an engine of another model as vLLM does (its
NIXL handshake compares a compatibility hash), and logs the refusal: a request paired across
revisions would show in the workers' own logs as a failed KV load, and at the client as an
error. A revision that never becomes Ready stalls the rollout while the old one serves, and
reverting the spec removes it without touching the old pods.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from e2e.platform.closed_loop import Load, Shape, count
from e2e.platform.cluster import wait_until
from e2e.platform.fleet import condition as find_condition
from e2e.platform.service import Service
from e2e.scenarios.drain_scenario import sim_log_counters
from pdfleet import labels
from tests.e2e.rollout.conftest import POOLS

pytestmark = pytest.mark.timeout(900)

#: Requests of a second or two: several are in flight whenever the router moves.
SHORT = Shape(prompt=(50, 400), output=(20, 80))


def pods_by_revision(service: Service) -> dict[str, dict[str, list[str]]]:
    """revision -> role -> live pod names, for the worker pools."""
    found: dict[str, dict[str, list[str]]] = {}
    for pod in service.pods():
        meta = pod["metadata"]
        role = meta["labels"].get(labels.ROLE)
        if role not in labels.WORKER_ROLES or meta.get("deletionTimestamp"):
            continue
        revision = meta["labels"].get(labels.KV_REVISION, "")
        found.setdefault(revision, {}).setdefault(role, []).append(meta["name"])
    return found


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return find_condition(status, type_) or {}


def live_pods(service: Service) -> dict[str, str]:
    """name -> uid of the pods not leaving."""
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in service.pods()
        if not p["metadata"].get("deletionTimestamp")
    }


def router_revisions(service: Service) -> set[str]:
    return {
        p["metadata"]["labels"].get(labels.KV_REVISION, "")
        for p in service.role_pods(labels.ROLE_ROUTER)
        if not p["metadata"].get("deletionTimestamp")
    }


def watch_rollout(
    service: Service, done: Callable[[dict[str, Any]], bool], timeout_s: float
) -> list[str]:
    """Poll the status until `done`; the rollout phases seen, in order."""
    phases: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        status = service.status()
        phase = (status.get("rollout") or {}).get("phase", "")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if done(status):
            return phases
        if time.monotonic() > deadline:
            raise TimeoutError(f"rollout not done after {timeout_s:.0f}s: {json.dumps(status)}")
        time.sleep(0.5)


def finished(revision: str) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        return (
            status.get("revision") == revision
            and "rollout" not in status
            and [r["revision"] for r in status.get("revisions", [])] == [revision]
        )

    return check


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            {"model": {"source": {"hub": {"id": "meta-llama/Llama-3.1-8B-Instruct-v2"}}}},
            id="model",
        ),
        pytest.param({"engine": {"image": "ghcr.io/pdfleet/worker:0.1.1-vllm0.33.0"}}, id="image"),
    ],
)
def test_a_kv_change_under_load_pairs_one_revision_and_loses_nothing(
    service: Service, change: dict[str, Any]
) -> None:
    old = service.status()["revision"]
    old_pods = pods_by_revision(service)
    assert list(old_pods) == [old], old_pods
    logs_before = sim_log_counters(service.log_dir, service.namespace)
    with Load(service.routers, clients=4, shape=SHORT, timeout_s=60) as load:
        time.sleep(3)
        service.patch({"spec": change})
        new = wait_until(
            lambda: (r := service.status().get("revision")) != old and r, 30, "a new revision"
        )
        assert isinstance(new, str)

        def both_revisions() -> dict[str, dict[str, list[str]]] | None:
            found = pods_by_revision(service)
            return found if found.get(new, {}).get(labels.ROLE_DECODE) else None

        mid = wait_until(both_revisions, 120, "new decode pods beside the old")
        assert mid[old] == old_pods[old], "the old revision's pods stay while the new start"
        phases = watch_rollout(service, finished(new), 300)
        time.sleep(2)
    results = load.snapshot()
    logs = sim_log_counters(service.log_dir, service.namespace)
    print(json.dumps({"change": change, "phases": phases, "sent": len(results), "logs": logs}))
    bad = [r for r in results if r.outcome != "ok"]
    assert not bad, bad[:5]
    assert len(results) >= 20, "the load ran all along"
    # The workers' own record: no KV load refused or failed, nothing recomputed.
    assert logs == logs_before, (logs_before, logs)
    # The old revision's pods can retire between two polls of the status: the operator's
    # Event for the new revision records the phase as well.
    retired = [
        e.message
        for e in service.events(("RolloutRetiring",))
        if f"revision {new} " in (e.message or "")
    ]
    assert phases[:1] == ["Surging"] and ("Retiring" in phases or retired), (phases, retired)
    now = pods_by_revision(service)
    assert list(now) == [new], now
    assert {role: len(names) for role, names in now[new].items()} == POOLS
    assert router_revisions(service) == {new}
    reasons = {e.reason for e in service.events(("RolloutSurging", "RolloutComplete"))}
    assert reasons == {"RolloutSurging", "RolloutComplete"}, reasons


@pytest.mark.parametrize(
    ("change", "revert", "waits_for"),
    [
        # vLLM refuses an unknown dtype at start, as the simulator does: every new pod exits.
        pytest.param(
            {"engine": {"extraArgs": ["--dtype=no-such-dtype"]}},
            {"engine": {"extraArgs": None}},
            "ready",
            id="never-ready",
        ),
        # Ready pods, but UCX has no device to move KV over: the preflight fails between them.
        pytest.param(
            {"kvTransfer": {"fabric": {"ucx": {"netDevices": "pdfleet-no-such-nic"}}}},
            {"kvTransfer": {"fabric": None}},
            "preflight",
            id="preflight-fails",
        ),
    ],
)
def test_a_revision_that_cannot_serve_stalls_and_a_revert_removes_it(
    service: Service, change: dict[str, Any], revert: dict[str, Any], waits_for: str
) -> None:
    """The rollout stalls past spec.progressDeadline with the old revision serving, and
    reverting the spec removes the new pods and leaves the old alone."""
    old = service.status()["revision"]
    before = live_pods(service)
    service.patch({"spec": {"progressDeadline": "30s"}})
    with Load(service.routers, clients=2, shape=SHORT, timeout_s=60) as load:
        service.patch({"spec": change})
        stalled = wait_until(
            lambda: (
                c if (c := condition(service.status(), "Stalled")).get("status") == "True" else None
            ),
            180,
            "Stalled=True",
        )
        status = service.status()
        assert stalled["reason"] == "RolloutStalled", stalled
        assert waits_for in stalled["message"], stalled["message"]
        assert status["rollout"]["servingRevision"] == old, status["rollout"]
        assert condition(status, "Ready").get("status") == "True", "the old revision serves"
        assert router_revisions(service) == {old}
        served_while_stalled = count(load.snapshot(), "ok")
        service.patch({"spec": {**revert, "progressDeadline": None}})
        phases = watch_rollout(service, finished(old), 240)
        time.sleep(2)
    results = load.snapshot()
    print(json.dumps({"phases": phases, "sent": len(results), "stalled": stalled}))
    assert not [r for r in results if r.outcome != "ok"], results[:5]
    assert served_while_stalled > 0
    assert live_pods(service) == before, "the old revision's pods (and the router) stayed"
    assert condition(service.status(), "Stalled").get("status") == "False"
