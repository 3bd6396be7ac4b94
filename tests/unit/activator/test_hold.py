"""The activator's policy, rule by rule: forward or hold on arrival, release the oldest one at
a time, expire past maxWait, the oldest held, and idleness."""

from __future__ import annotations

import pytest

from pdfleet.activator.hold import (
    Activity,
    HoldQueue,
    Step,
    Ticket,
    Verdict,
    verdict,
)

MAX_WAIT = 300.0


@pytest.mark.parametrize(
    ("ready", "waited_s", "expected"),
    [
        (True, 0.0, Verdict.FORWARD),
        (True, 299.9, Verdict.FORWARD),
        (True, 900.0, Verdict.FORWARD),  # ready in the turn the deadline passed: still served
        (False, 0.0, Verdict.HOLD),
        (False, 299.9, Verdict.HOLD),
        (False, 300.0, Verdict.EXPIRE),
        (False, 301.0, Verdict.EXPIRE),
    ],
)
def test_verdict(ready: bool, waited_s: float, expected: Verdict) -> None:
    assert verdict(ready=ready, waited_s=waited_s, max_wait_s=MAX_WAIT) is expected


def test_a_ready_router_with_nobody_held_gets_the_request_at_once() -> None:
    queue = HoldQueue(MAX_WAIT)
    assert queue.arrive(ready=True, now_s=0.0) is None
    assert queue.held == 0
    assert not queue.busy


def test_requests_are_held_in_arrival_order_while_not_ready() -> None:
    queue = HoldQueue(MAX_WAIT)
    tickets = [queue.arrive(ready=False, now_s=float(t)) for t in range(3)]
    assert tickets == [Ticket(0, 0.0), Ticket(1, 1.0), Ticket(2, 2.0)]
    assert queue.held == 3
    assert queue.step(ready=False, now_s=10.0) == Step()  # nobody overdue
    assert queue.oldest() == Ticket(0, 0.0)
    assert queue.next_deadline_s() == MAX_WAIT


def test_the_oldest_goes_first_one_at_a_time_and_latecomers_queue_behind() -> None:
    queue = HoldQueue(MAX_WAIT)
    first = queue.arrive(ready=False, now_s=0.0)
    second = queue.arrive(ready=False, now_s=1.0)
    assert first is not None and second is not None

    assert queue.step(ready=True, now_s=5.0) == Step(release=first)
    assert queue.step(ready=True, now_s=5.0) == Step()  # the first is not on its way yet
    # The router is ready, but two are still ahead: a newcomer waits its turn.
    third = queue.arrive(ready=True, now_s=5.0)
    assert third == Ticket(2, 5.0)

    queue.sent(first)
    assert queue.step(ready=True, now_s=5.0) == Step(release=second)
    queue.sent(second)
    assert queue.step(ready=True, now_s=5.0) == Step(release=third)
    assert queue.busy  # released, not yet on its way
    queue.sent(third)
    assert not queue.busy
    assert queue.step(ready=True, now_s=5.0) == Step()
    assert queue.arrive(ready=True, now_s=6.0) is None


def test_past_max_wait_and_not_ready_the_overdue_expire_and_the_rest_wait() -> None:
    queue = HoldQueue(MAX_WAIT)
    old = queue.arrive(ready=False, now_s=0.0)
    younger = queue.arrive(ready=False, now_s=100.0)
    assert old is not None and younger is not None
    assert queue.step(ready=False, now_s=300.0) == Step(expired=(old,))
    assert queue.held == 1
    assert queue.next_deadline_s() == 400.0
    assert queue.step(ready=False, now_s=399.0) == Step()
    assert queue.step(ready=False, now_s=400.0) == Step(expired=(younger,))
    assert queue.held == 0
    assert queue.oldest() is None
    assert queue.next_deadline_s() is None


def test_a_ready_router_saves_a_request_whose_deadline_passed() -> None:
    queue = HoldQueue(MAX_WAIT)
    ticket = queue.arrive(ready=False, now_s=0.0)
    assert queue.step(ready=True, now_s=1000.0) == Step(release=ticket)


def test_a_client_that_leaves_is_taken_out_wherever_it_stands() -> None:
    queue = HoldQueue(MAX_WAIT)
    first, middle, last = (queue.arrive(ready=False, now_s=float(t)) for t in range(3))
    assert first is not None and middle is not None and last is not None
    queue.leave(middle)
    assert queue.held == 2
    assert queue.step(ready=True, now_s=3.0) == Step(release=first)
    queue.leave(first)  # gone while being released: the next may go
    assert queue.step(ready=True, now_s=3.0) == Step(release=last)
    queue.leave(last)
    assert not queue.busy


def test_sent_for_a_ticket_not_being_released_changes_nothing() -> None:
    queue = HoldQueue(MAX_WAIT)
    first = queue.arrive(ready=False, now_s=0.0)
    second = queue.arrive(ready=False, now_s=0.0)
    assert first is not None and second is not None
    assert queue.step(ready=True, now_s=1.0) == Step(release=first)
    queue.sent(second)
    assert queue.step(ready=True, now_s=1.0) == Step()


def test_the_oldest_held_is_the_first_arrival_still_waiting() -> None:
    queue = HoldQueue(MAX_WAIT)
    assert queue.oldest() is None
    first, middle, last = (queue.arrive(ready=False, now_s=float(t)) for t in range(3))
    assert first is not None and middle is not None and last is not None
    assert queue.oldest() == first
    queue.leave(first)  # its client went away
    assert queue.oldest() == middle
    assert queue.step(ready=True, now_s=3.0) == Step(release=middle)
    assert queue.oldest() == last  # being released is no longer held
    assert queue.held == 1
    queue.sent(middle)
    assert queue.step(ready=True, now_s=3.0) == Step(release=last)
    assert queue.oldest() is None


def test_idleness_counts_from_the_last_arrival_or_finish_and_not_while_in_flight() -> None:
    activity = Activity(last_s=1000.0)  # the process started
    assert activity.idle_for(1060.0) == 60.0
    activity.arrived(1100.0)
    activity.arrived(1101.0)
    assert activity.in_flight == 2
    assert activity.idle_for(5000.0) == 0.0
    activity.finished(1200.0)
    assert activity.idle_for(5000.0) == 0.0  # one long stream still going
    activity.finished(1500.0)
    assert activity.in_flight == 0
    assert activity.last_s == 1500.0
    assert activity.idle_for(1530.0) == 30.0
    assert activity.idle_for(1400.0) == 0.0  # a clock that went back counts no idle time
