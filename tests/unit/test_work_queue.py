"""The operator's work queue: one entry per service, in flight before new before resync."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pdfleet.handlers import CountDown, ServiceCache, _resync, _serve
from pdfleet.kube.errors import APIError
from pdfleet.kube.workqueue import NEW, RESYNC, URGENT, WorkQueue, retry_after
from tests.unit.operator_metrics import counted

Key = tuple[str, str]


def _drain(queue: WorkQueue) -> list[Key]:
    """Keys in the order workers would run them (stale entries skipped)."""
    order = []
    while not queue._queue.empty():
        key = queue.next_key(queue._queue.get_nowait())
        if key is not None:
            order.append(key)
    return order


async def test_urgent_keys_go_before_a_resync_sweep_and_each_key_runs_once() -> None:
    queue = WorkQueue(run=lambda _: None)
    for i in range(5):
        queue.put(("ns", f"svc-{i}"), RESYNC)
    queue.put(("ns", "changed"))  # a spec change right after the resync sweep
    queue.put(("ns", "svc-3"), URGENT)  # promoted: a pod of svc-3 turned ready
    queue.put(("ns", "svc-3"), RESYNC)  # already queued: coalesced
    queue.put(("ns", "changed"))
    assert _drain(queue) == [
        ("ns", "changed"),
        ("ns", "svc-3"),
        ("ns", "svc-0"),
        ("ns", "svc-1"),
        ("ns", "svc-2"),
        ("ns", "svc-4"),
    ]


async def test_services_in_flight_go_before_new_services_and_new_ones_before_resync() -> None:
    queue = WorkQueue(run=lambda _: None)
    queue.put(("ns", "idle"), RESYNC)
    for i in range(3):
        queue.put(("ns", f"created-{i}"), NEW)  # a burst of creations
    queue.put(("ns", "running"))  # a pod of a running service turned ready
    queue.put(("ns", "created-2"))  # promoted: its children showed up
    assert _drain(queue) == [
        ("ns", "running"),
        ("ns", "created-2"),
        ("ns", "created-0"),
        ("ns", "created-1"),
        ("ns", "idle"),
    ]


def test_a_service_event_asks_new_for_an_unseen_service_and_urgent_after() -> None:
    cache = ServiceCache()
    body = {"apiVersion": "v", "kind": "K", "metadata": {"name": "a"}, "spec": {"x": 1}}
    key = ("ns", "a")
    assert cache.service_event(key, "ADDED", body) == NEW
    assert cache.services[key]["spec"] == {"x": 1}
    assert cache.services[key]["status"] == {}
    assert cache.service_event(key, "MODIFIED", {**body, "spec": {"x": 2}}) == URGENT
    assert cache.services[key]["spec"] == {"x": 2}
    assert cache.service_event(key, "DELETED", body) == URGENT
    assert key not in cache.services
    assert cache.service_event(key, "ADDED", body) == NEW  # created again


async def test_a_key_queued_again_after_its_run_runs_again() -> None:
    ran: list[Key] = []
    queue = WorkQueue(run=ran.append, workers=1)
    queue.start()
    try:
        queue.put(("ns", "a"), RESYNC)
        for _ in range(50):
            if ran:
                break
            await asyncio.sleep(0.01)
        queue.put(("ns", "a"))
        for _ in range(50):
            if len(ran) == 2:
                break
            await asyncio.sleep(0.01)
    finally:
        await queue.stop()
    assert ran == [("ns", "a"), ("ns", "a")]


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_service_is_in_one_workers_hands_and_the_others_go_on() -> None:
    """A pass stuck on a slow dependency keeps one worker, not every worker its events and
    timers ask for; what was asked meanwhile runs once, after it."""
    release = threading.Event()
    ran: list[Key] = []

    def run(key: Key) -> None:
        ran.append(key)
        if key == ("ns", "stuck") and ran.count(key) == 1:
            release.wait(10)

    queue = WorkQueue(run=run, workers=4)
    queue.start()
    try:
        queue.put(("ns", "stuck"))
        await _until(lambda: ("ns", "stuck") in ran, "the stuck pass")
        for i in range(10):
            queue.put(("ns", "stuck"), RESYNC if i % 2 else URGENT)
            queue.put(("ns", f"other-{i}"))
            await asyncio.sleep(0.01)
        await _until(lambda: len(ran) == 11, "the other services' passes")
        assert ran.count(("ns", "stuck")) == 1
        release.set()
        await _until(lambda: ran.count(("ns", "stuck")) == 2, "the pass asked meanwhile")
        await asyncio.sleep(0.1)
    finally:
        release.set()
        await queue.stop()
    assert ran.count(("ns", "stuck")) == 2


def _api_error(status: int, headers: dict[str, str] | None = None) -> APIError:
    return APIError(status, "test", headers=headers)


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (_api_error(409), (1.0, True)),
        (_api_error(404), (1.0, True)),  # deleted during the pass: quiet, looked at again
        (_api_error(429, {"Retry-After": "3"}), (3.0, True)),
        (_api_error(429, {"Retry-After": "0"}), (1.0, True)),  # never a hot loop
        (_api_error(429, {"Retry-After": "3600"}), (60.0, True)),  # nor a stuck service
        (_api_error(429, {"Retry-After": "soon"}), (5.0, True)),
        (_api_error(429), (5.0, True)),
        (_api_error(500), (5.0, False)),
        (RuntimeError("bug"), (5.0, False)),
    ],
)
def test_retry_after(error: BaseException, want: tuple[float, bool]) -> None:
    assert retry_after(error) == want


async def test_passes_waiting_on_the_api_server_run_side_by_side() -> None:
    """`workers` passes run at once in the queue's own threads: a pass that waits for a
    status write must not hold up the services queued behind it (docs/operator.md)."""
    workers = min(32, (os.cpu_count() or 1) + 4) + 1  # one more than asyncio's default pool
    everyone_in = threading.Barrier(workers, timeout=5)
    ran: list[Key] = []

    def run(key: Key) -> None:
        everyone_in.wait()  # broken (and raising) unless `workers` passes are in at once
        ran.append(key)

    queue = WorkQueue(run=run, workers=workers)
    queue.start()
    try:
        for i in range(workers):
            queue.put(("ns", f"svc-{i}"))
        for _ in range(300):
            if len(ran) == workers:
                break
            await asyncio.sleep(0.01)
    finally:
        await queue.stop()
    assert sorted(ran) == [("ns", f"svc-{i}") for i in range(workers)]


async def test_no_pass_runs_until_every_informer_has_listed() -> None:
    """A restart lists thousands of children; a pass before that ends would see some as
    missing and write them again (docs/benchmarks/scale)."""
    ran: list[Key] = []
    queue = WorkQueue(run=ran.append, workers=1)
    cache = ServiceCache()
    cache.services[("ns", "svc")] = {}
    synced = CountDown(2)
    queue.put(("ns", "svc"))  # kopf's listing of the InferenceServices came first
    task = asyncio.create_task(_serve(queue, cache, synced.done, 0.01))
    try:
        synced.count()
        await asyncio.sleep(0.1)  # ten resync intervals
        assert ran == [] and not synced.done.is_set()
        synced.count()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(ran) >= 2:
                break
        assert ran[:2] == [("ns", "svc"), ("ns", "svc")]  # the queued event, then a resync
    finally:
        task.cancel()
        await queue.stop()


async def test_the_resync_spreads_every_service_over_the_interval() -> None:
    """One service every interval/N, not a sweep of N at once every interval."""
    queue = WorkQueue(run=lambda _: None)
    services: dict[tuple[str, str], dict[str, Any]] = {("ns", f"svc-{i}"): {} for i in range(4)}
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 6:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await _resync(queue, services, 60.0, sleep)
    assert slept == [15.0] * 6
    # A whole sweep, then the next sweep's first service: each in the queue once.
    assert _drain(queue) == list(services)


async def test_a_service_has_at_most_one_pass_pending_on_a_timer_the_latest_asked() -> None:
    queue = WorkQueue(run=lambda _: None)
    key = ("ns", "a")
    queue.come_back(key, 60.0)  # a resync pass: the preflight retry is a minute away
    queue.come_back(key, 0.01)  # the next pass knows better
    assert len(queue._later) == 1
    await asyncio.sleep(0.05)
    assert _drain(queue) == [key] and not queue._later
    queue.come_back(key, 0.01)
    queue.come_back(key, None)  # a later pass has nothing to come back for
    await asyncio.sleep(0.05)
    assert _drain(queue) == [] and not queue._later


async def test_the_wait_in_the_queue_is_measured_by_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [50.0]
    monkeypatch.setattr("pdfleet.kube.workqueue.time.monotonic", lambda: clock[0])
    queue = WorkQueue(run=lambda _: None)
    with counted("pdfleet_queue_wait_seconds_sum") as waited:
        queue.put(("ns", "created"), NEW)
        queue.put(("ns", "idle"), RESYNC)
        clock[0] += 2.0
        queue.put(("ns", "idle"), URGENT)  # promoted: it waits from now
        clock[0] += 0.5
        assert _drain(queue) == [("ns", "idle"), ("ns", "created")]
    assert waited == {
        frozenset({("priority", "urgent")}): pytest.approx(0.5),
        frozenset({("priority", "new")}): pytest.approx(2.5),
    }
