"""How the drain scenario pairs the operator's Drained Events with the drains it saw start,
including an Event the operator counted twice (same pod, same rounded duration)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from e2e.platform.closed_loop import Result
from e2e.scenarios.drain_scenario import match_drains

T0 = 1_800_000_000.0


@dataclass
class Event:
    message: str
    first_timestamp: datetime
    last_timestamp: datetime
    count: int = 1


def at(offset_s: float) -> datetime:
    return datetime.fromtimestamp(int(T0 + offset_s), UTC)


def mark(pod: str, since: float) -> tuple[tuple[str, str], dict[str, object]]:
    return (pod, f"stamp-{since}"), {"since": T0 + since, "url": pod, "deregistered": None}


def test_an_event_counted_twice_stands_for_both_drains() -> None:
    marks = dict(
        [mark("svc-decode-2", 0.0), mark("svc-decode-2", 20.0), mark("svc-decode-2", 40.0)]
    )
    events = [
        # Cycles 1 and 2 drained in the same 1.3 s: one Event, count 2.
        Event("svc-decode-2 (decode) drained in 1.3s", at(1.3), at(21.3), count=2),
        Event("svc-decode-2 (decode) drained in 1.1s", at(41.1), at(41.1)),
    ]
    drains = match_drains(events, marks, [Result(T0 - 1, T0 + 1, "ok")])
    assert [(d.since - T0, d.duration_s) for d in drains] == [(0.0, 1.3), (20.0, 1.3), (40.0, 1.1)]


def test_each_event_takes_the_mark_that_ended_nearest_it() -> None:
    marks = dict([mark("svc-prefill-1", 0.0), mark("svc-prefill-1", 30.0)])
    events = [
        Event("svc-prefill-1 (prefill) removed after 5.0s", at(35.0), at(35.0)),
        Event("svc-prefill-1 (prefill) drained in 0.7s", at(0.7), at(0.7)),
        Event("unrelated message", at(1.0), at(1.0)),
    ]
    drains = match_drains(events, marks, [])
    assert [(d.since - T0, d.forced) for d in drains] == [(0.0, False), (30.0, True)]


def test_an_event_for_a_pod_never_seen_marked_is_left_out() -> None:
    events = [Event("svc-decode-9 (decode) drained in 1.0s", at(1.0), at(1.0))]
    assert match_drains(events, dict([mark("svc-decode-1", 0.0)]), []) == []
