"""The drain planner, rule by rule: which pods, mark -> deregister -> wait -> remove, cancel on
scale-up, force on timeout, prefill waits for KV pulls, decode waits for the router's gauges."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from pdfleet.drain.plan import (
    Action,
    ActionKind,
    Stage,
    WorkerLoad,
    needs_io,
    plan_drain,
    rfc3339,
)
from pdfleet.reconcile.observed import PodInfo

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PORT = 8000
TIMEOUT = 300.0


def ago(seconds: float) -> str:
    return rfc3339(NOW - timedelta(seconds=seconds))


def pod(role: str, ordinal: int, draining: float | None = None, **fields: object) -> PodInfo:
    base = PodInfo(
        name=f"svc-{role}-{ordinal}",
        role=role,
        ordinal=ordinal,
        phase="Running",
        ready=True,
        pod_ip=f"10.244.0.{ordinal + 10}",
        draining_since=None if draining is None else ago(draining),
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def url(role: str, ordinal: int) -> str:
    return f"http://10.244.0.{ordinal + 10}:{PORT}"


IDLE = WorkerLoad(registered=False, router_in_flight=0, engine_in_flight=0, kv_pending=0)
LISTED = replace(IDLE, registered=True)
BUSY_ROUTER = replace(IDLE, router_in_flight=2)  # e.g. decode still "pending" at the router
BUSY_ENGINE = replace(IDLE, engine_in_flight=1)
KV_HELD = replace(IDLE, kv_pending=3)
UNKNOWN = WorkerLoad(registered=None, router_in_flight=None, engine_in_flight=None)
ROUTER_DOWN = replace(IDLE, router_in_flight=None)

D, P = "decode", "prefill"


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    return [(a.kind.value, a.pod) for a in actions]


@pytest.mark.parametrize(
    ("case", "role", "desired", "current", "pods", "loads", "replicas", "expected", "stages"),
    [
        # --- nothing to do -------------------------------------------------------------------
        ("steady", D, 4, 4, [pod(D, i) for i in range(4)], {}, 4, [], {}),
        ("plain scale-up", D, 4, 2, [pod(D, 0), pod(D, 1)], {}, 4, [], {}),
        # --- top ordinals are chosen, first pass marks them and holds the count -------------
        ("4 -> 1 marks 1, 2, 3", D, 1, 4, [pod(D, i) for i in range(4)], {}, 4,
         [("Mark", "svc-decode-1"), ("Mark", "svc-decode-2"), ("Mark", "svc-decode-3")],
         {f"svc-decode-{i}": Stage.MARKED for i in (1, 2, 3)}),
        # --- marked -> deregister (also when the routers' view is unknown) -------------------
        ("marked, still listed: deregister", D, 1, 2, [pod(D, 0), pod(D, 1, draining=1)],
         {"svc-decode-1": LISTED}, 2, [("Deregister", "svc-decode-1")],
         {"svc-decode-1": Stage.MARKED}),
        ("marked, routers unknown: deregister", D, 1, 2, [pod(D, 0), pod(D, 1, draining=1)],
         {"svc-decode-1": UNKNOWN}, 2, [("Deregister", "svc-decode-1")],
         {"svc-decode-1": Stage.MARKED}),
        # --- ... but only while every pod that stays serves (else it keeps serving) ---------
        ("marked, a stayer NotReady: keep serving", D, 1, 2,
         [pod(D, 0, ready=False), pod(D, 1, draining=1)], {"svc-decode-1": LISTED}, 2, [],
         {"svc-decode-1": Stage.MARKED}),
        ("marked, a stayer terminating: keep serving", D, 2, 3,
         [pod(D, 0), pod(D, 1, terminating=True), pod(D, 2, draining=1)],
         {"svc-decode-2": LISTED}, 3, [], {"svc-decode-2": Stage.MARKED}),
        ("marked, a stayer missing: keep serving", P, 2, 3, [pod(P, 0), pod(P, 2, draining=1)],
         {"svc-prefill-2": LISTED}, 3, [], {"svc-prefill-2": Stage.MARKED}),
        ("marked, stayer NotReady past the timeout: forced", D, 1, 2,
         [pod(D, 0, ready=False), pod(D, 1, draining=TIMEOUT + 1)], {"svc-decode-1": LISTED}, 1,
         [("Deregister", "svc-decode-1"), ("Finished", "svc-decode-1")],
         {"svc-decode-1": Stage.DONE}),
        ("deregistered, a stayer NotReady: drains on", D, 1, 2,
         [pod(D, 0, ready=False), pod(D, 1, draining=5)], {"svc-decode-1": IDLE}, 1,
         [("Finished", "svc-decode-1")], {"svc-decode-1": Stage.DONE}),
        # --- deregistered -> wait while anything is in flight --------------------------------
        ("decode waits for router pending+active", D, 1, 2, [pod(D, 0), pod(D, 1, draining=5)],
         {"svc-decode-1": BUSY_ROUTER}, 2, [], {"svc-decode-1": Stage.DEREGISTERED}),
        ("waits for the engine's running+waiting", D, 1, 2, [pod(D, 0), pod(D, 1, draining=5)],
         {"svc-decode-1": BUSY_ENGINE}, 2, [], {"svc-decode-1": Stage.DEREGISTERED}),
        ("an unreadable router replica means wait", D, 1, 2,
         [pod(D, 0), pod(D, 1, draining=5)], {"svc-decode-1": ROUTER_DOWN}, 2, [],
         {"svc-decode-1": Stage.DEREGISTERED}),
        ("prefill waits for KV not yet pulled", P, 1, 2, [pod(P, 0), pod(P, 1, draining=5)],
         {"svc-prefill-1": KV_HELD}, 2, [], {"svc-prefill-1": Stage.DEREGISTERED}),
        ("decode ignores kv_pending", D, 1, 2, [pod(D, 0), pod(D, 1, draining=5)],
         {"svc-decode-1": KV_HELD}, 1, [("Finished", "svc-decode-1")],
         {"svc-decode-1": Stage.DONE}),
        # --- idle -> remove: the count goes down past DONE pods only -------------------------
        ("idle: lower the count", P, 1, 2, [pod(P, 0), pod(P, 1, draining=5)],
         {"svc-prefill-1": IDLE}, 1, [("Finished", "svc-prefill-1")],
         {"svc-prefill-1": Stage.DONE}),
        ("top done, middle busy: lower to keep the busy one", D, 1, 3,
         [pod(D, 0), pod(D, 1, draining=5), pod(D, 2, draining=5)],
         {"svc-decode-1": BUSY_ROUTER, "svc-decode-2": IDLE}, 2,
         [("Finished", "svc-decode-2")],
         {"svc-decode-1": Stage.DEREGISTERED, "svc-decode-2": Stage.DONE}),
        ("top busy, middle done: nothing can go yet", D, 1, 3,
         [pod(D, 0), pod(D, 1, draining=5), pod(D, 2, draining=5)],
         {"svc-decode-1": IDLE, "svc-decode-2": BUSY_ENGINE}, 3,
         [("Finished", "svc-decode-1")],
         {"svc-decode-1": Stage.DONE, "svc-decode-2": Stage.DEREGISTERED}),
        ("missing, pending or terminating victims need no drain", D, 1, 4,
         [pod(D, 0), pod(D, 2, pod_ip=None, phase="Pending", ready=False),
          pod(D, 3, terminating=True)], {}, 1, [],
         {"svc-decode-2": Stage.DONE, "svc-decode-3": Stage.DONE}),
        # --- timeout: forced, deregistered anyway ---------------------------------------------
        ("past the timeout: forced", D, 1, 2, [pod(D, 0), pod(D, 1, draining=TIMEOUT + 1)],
         {"svc-decode-1": BUSY_ROUTER}, 1, [("Finished", "svc-decode-1")],
         {"svc-decode-1": Stage.DONE}),
        ("past the timeout, still listed: deregister and force", D, 1, 2,
         [pod(D, 0), pod(D, 1, draining=TIMEOUT + 1)], {"svc-decode-1": LISTED}, 1,
         [("Deregister", "svc-decode-1"), ("Finished", "svc-decode-1")],
         {"svc-decode-1": Stage.DONE}),
        # --- scale-up during a drain -----------------------------------------------------------
        ("only marked: unmark, free, then grow", D, 4, 4,
         [pod(D, 0), pod(D, 1, draining=1), pod(D, 2, draining=1), pod(D, 3, draining=1)],
         {f"svc-decode-{i}": LISTED for i in (1, 2, 3)}, 4,
         [("Unmark", "svc-decode-1"), ("Unmark", "svc-decode-2"), ("Unmark", "svc-decode-3")],
         {f"svc-decode-{i}": Stage.SERVING for i in (1, 2, 3)}),
        ("deregistered: recreate, hold the count", D, 4, 2,
         [pod(D, 0), pod(D, 1, draining=3)], {"svc-decode-1": IDLE}, 2,
         [("Recreate", "svc-decode-1")], {"svc-decode-1": Stage.DEREGISTERED}),
        ("being recreated: hold the count, no second delete", D, 4, 2,
         [pod(D, 0), pod(D, 1, draining=3, terminating=True)], {}, 2, [],
         {"svc-decode-1": Stage.DEREGISTERED}),
        ("partial scale-up: reclaim the needed, keep draining the rest", D, 2, 3,
         [pod(D, 0), pod(D, 1, draining=3), pod(D, 2, draining=3)],
         {"svc-decode-1": LISTED, "svc-decode-2": BUSY_ROUTER}, 3,
         [("Unmark", "svc-decode-1")],
         {"svc-decode-1": Stage.SERVING, "svc-decode-2": Stage.DEREGISTERED}),
    ],
)  # fmt: skip
def test_plan_drain(
    case: str,
    role: str,
    desired: int,
    current: int,
    pods: list[PodInfo],
    loads: dict[str, WorkerLoad],
    replicas: int,
    expected: list[tuple[str, str]],
    stages: dict[str, Stage],
) -> None:
    plan = plan_drain(role, desired, current, pods, loads, NOW, TIMEOUT, PORT)
    assert plan.replicas == replicas, case
    assert kinds(plan.actions) == expected, case
    assert plan.stages == stages, case


def test_actions_carry_the_router_url_and_the_start_time() -> None:
    plan = plan_drain(D, 1, 2, [pod(D, 0), pod(D, 1)], {}, NOW, TIMEOUT, PORT)
    assert plan.actions == [Action(ActionKind.MARK, "svc-decode-1", url(D, 1), since=rfc3339(NOW))]
    plan = plan_drain(
        D, 1, 2, [pod(D, 0), pod(D, 1, draining=7)], {"svc-decode-1": IDLE}, NOW, TIMEOUT, PORT
    )
    (done,) = plan.actions
    assert done.duration_s == pytest.approx(7.0) and not done.forced


def test_forced_drain_says_why() -> None:
    plan = plan_drain(
        P, 0, 1, [pod(P, 0, draining=400)], {"svc-prefill-0": KV_HELD}, NOW, TIMEOUT, PORT
    )
    (done,) = plan.actions
    assert done.forced and done.duration_s == pytest.approx(400.0)
    assert done.reason == "timeout (KV awaiting a pull 3)"


@pytest.mark.parametrize(
    ("role", "load", "reason"),
    [
        (D, BUSY_ROUTER, "timeout (router in-flight 2)"),
        (
            D,
            replace(BUSY_ENGINE, router_in_flight=None),
            "timeout (router in-flight unknown, engine in-flight 1)",
        ),
        (D, LISTED, "timeout (still registered)"),
        (D, None, "timeout (no reading)"),
    ],
)
def test_forced_drain_names_the_signal_that_held_it(
    role: str, load: WorkerLoad | None, reason: str
) -> None:
    loads = {} if load is None else {f"svc-{role}-1": load}
    pods = [pod(role, 0), pod(role, 1, draining=TIMEOUT + 1)]
    done = plan_drain(role, 1, 2, pods, loads, NOW, TIMEOUT, PORT).actions[-1]
    assert done.kind is ActionKind.FINISHED and done.forced and done.reason == reason


def test_a_worker_idle_at_the_timeout_drained() -> None:
    pods = [pod(D, 0), pod(D, 1, draining=TIMEOUT + 1)]
    (done,) = plan_drain(D, 1, 2, pods, {"svc-decode-1": KV_HELD}, NOW, TIMEOUT, PORT).actions
    assert done.kind is ActionKind.FINISHED and not done.forced  # a decode holds no KV for anyone


def test_full_cycle_mark_deregister_wait_remove() -> None:
    """Pass after pass, the way the controller drives it."""
    pods = [pod(D, 0), pod(D, 1)]
    step1 = plan_drain(D, 1, 2, pods, {}, NOW, TIMEOUT, PORT)
    assert kinds(step1.actions) == [("Mark", "svc-decode-1")] and step1.replicas == 2
    pods = [pod(D, 0), pod(D, 1, draining=0)]
    step2 = plan_drain(D, 1, 2, pods, {"svc-decode-1": LISTED}, NOW, TIMEOUT, PORT)
    assert kinds(step2.actions) == [("Deregister", "svc-decode-1")] and step2.replicas == 2
    step3 = plan_drain(D, 1, 2, pods, {"svc-decode-1": BUSY_ROUTER}, NOW, TIMEOUT, PORT)
    assert step3.actions == [] and step3.replicas == 2 and step3.active
    step4 = plan_drain(D, 1, 2, pods, {"svc-decode-1": IDLE}, NOW, TIMEOUT, PORT)
    assert kinds(step4.actions) == [("Finished", "svc-decode-1")] and step4.replicas == 1
    assert not step4.active
    # The StatefulSet now says 1: pod 1 terminates and the drain has nothing left to do.
    step5 = plan_drain(D, 1, 1, [pod(D, 0), pod(D, 1, draining=9, terminating=True)], {},
                       NOW, TIMEOUT, PORT)  # fmt: skip
    assert step5.actions == [] and step5.replicas == 1


@pytest.mark.parametrize(
    ("desired", "current", "pods", "expected"),
    [
        (2, 2, [pod(D, 0), pod(D, 1)], False),  # idle service: no router or worker I/O
        (3, 2, [pod(D, 0), pod(D, 1)], False),
        (2, None, [], False),
        (1, 2, [pod(D, 0), pod(D, 1)], True),
        (2, 2, [pod(D, 0), pod(D, 1, draining=1)], True),  # a mark to clear
        (2, 2, [pod(D, 0), pod(D, 1, draining=1, terminating=True)], False),
    ],
)
def test_needs_io_only_while_draining(
    desired: int, current: int | None, pods: list[PodInfo], expected: bool
) -> None:
    assert needs_io(desired, current, pods) is expected


def test_a_finished_drain_stays_done_whatever_a_later_reading_says() -> None:
    """The pod index may still show the pool at 4 after it was lowered to 1 while a router
    read fails (the worker counts as registered again). Without the memory of finished
    drains the pool would grow back to 4 and drain the same pods twice."""
    pods = [pod(D, 0), pod(D, 1, draining=5), pod(D, 2, draining=5), pod(D, 3, draining=5)]
    since = pods[1].draining_since or ""
    finished = {(f"svc-decode-{i}", since) for i in (1, 2, 3)}
    loads = {f"svc-decode-{i}": UNKNOWN for i in (1, 2, 3)}
    plan = plan_drain(D, 1, 4, pods, loads, NOW, TIMEOUT, PORT, finished=finished)
    assert plan.replicas == 1 and plan.actions == [] and not plan.active
    # The same reading without that memory holds the pool, which is what finished= prevents.
    assert plan_drain(D, 1, 4, pods, loads, NOW, TIMEOUT, PORT).replicas == 4
    # A later drain of the same pod (another start time) is a new drain.
    again = [pod(D, 0), pod(D, 1, draining=1)]
    step = plan_drain(D, 1, 2, again, {"svc-decode-1": IDLE}, NOW, TIMEOUT, PORT, finished=finished)
    assert kinds(step.actions) == [("Finished", "svc-decode-1")]


def test_positions_count_from_the_statefulsets_start() -> None:
    """After a paired rollout the first ordinal is no longer 0: 4 -> 2 drains the top two."""
    pods = [pod(D, ordinal) for ordinal in range(5, 9)]
    plan = plan_drain(D, 2, 4, pods, {}, NOW, TIMEOUT, PORT, start=5)
    assert kinds(plan.actions) == [("Mark", "svc-decode-7"), ("Mark", "svc-decode-8")]
    assert plan.replicas == 4 and not plan.retired


def test_retiring_pods_drain_from_the_bottom_and_report_when_all_have_gone() -> None:
    """A rollout's old revision: positions below `retire` drain like any removed pod (no router
    lists them any more), the pool keeps its size, and `retired` says when the start may move."""
    old = [pod(D, 0, draining=5), pod(D, 1)]
    new = [pod(D, 2), pod(D, 3)]
    loads = {"svc-decode-0": IDLE}
    plan = plan_drain(D, 4, 4, [*old, *new], loads, NOW, TIMEOUT, PORT, retire=2)
    assert plan.stages == {"svc-decode-0": Stage.DONE, "svc-decode-1": Stage.MARKED}
    assert plan.replicas == 4 and not plan.retired
    marked = [pod(D, 0, draining=5), pod(D, 1, draining=3)]
    loads = {"svc-decode-0": IDLE, "svc-decode-1": BUSY_ENGINE}
    assert not plan_drain(D, 4, 4, [*marked, *new], loads, NOW, TIMEOUT, PORT, retire=2).retired
    loads["svc-decode-1"] = IDLE
    done = plan_drain(D, 4, 4, [*marked, *new], loads, NOW, TIMEOUT, PORT, retire=2)
    assert done.retired and done.replicas == 4
    assert needs_io(4, 4, new, retire=2)
