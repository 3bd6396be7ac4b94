"""The activator's policy, rule by rule: forward or hold on arrival, release the oldest one at
a time, expire past maxWait, hold again in its place a request the router turned away, the
oldest held, and idleness."""

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


def hold(queue: HoldQueue, now_s: float) -> Ticket:
    """A request that comes while the router is not ready: held."""
    ticket, now = queue.arrive(ready=False, now_s=now_s)
    assert now is Verdict.HOLD
    return ticket


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
    assert queue.arrive(ready=True, now_s=0.0) == (Ticket(0, 0.0), Verdict.FORWARD)
    assert queue.held == 0
    assert not queue.busy
    # Its place in the arrival order is taken all the same: the next one comes after it.
    assert queue.arrive(ready=False, now_s=1.0) == (Ticket(1, 1.0), Verdict.HOLD)


def test_requests_are_held_in_arrival_order_while_not_ready() -> None:
    queue = HoldQueue(MAX_WAIT)
    tickets = [hold(queue, float(t)) for t in range(3)]
    assert tickets == [Ticket(0, 0.0), Ticket(1, 1.0), Ticket(2, 2.0)]
    assert queue.held == 3
    assert queue.step(ready=False, now_s=10.0) == Step()  # nobody overdue
    assert queue.oldest() == Ticket(0, 0.0)
    assert queue.next_deadline_s() == MAX_WAIT


def test_the_oldest_goes_first_one_at_a_time_and_latecomers_queue_behind() -> None:
    queue = HoldQueue(MAX_WAIT)
    first = hold(queue, 0.0)
    second = hold(queue, 1.0)

    assert queue.step(ready=True, now_s=5.0) == Step(release=first)
    assert queue.step(ready=True, now_s=5.0) == Step()  # the first is not on its way yet
    # The router is ready, but two are still ahead: a newcomer waits its turn.
    third, now = queue.arrive(ready=True, now_s=5.0)
    assert (third, now) == (Ticket(2, 5.0), Verdict.HOLD)

    queue.sent(first)
    assert queue.step(ready=True, now_s=5.0) == Step(release=second)
    queue.sent(second)
    assert queue.step(ready=True, now_s=5.0) == Step(release=third)
    assert queue.busy  # released, not yet on its way
    queue.sent(third)
    assert not queue.busy
    assert queue.step(ready=True, now_s=5.0) == Step()
    assert queue.arrive(ready=True, now_s=6.0) == (Ticket(3, 6.0), Verdict.FORWARD)


def test_past_max_wait_and_not_ready_the_overdue_expire_and_the_rest_wait() -> None:
    queue = HoldQueue(MAX_WAIT)
    old = hold(queue, 0.0)
    younger = hold(queue, 100.0)
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
    ticket = hold(queue, 0.0)
    assert queue.step(ready=True, now_s=1000.0) == Step(release=ticket)


def test_a_client_that_leaves_is_taken_out_wherever_it_stands() -> None:
    queue = HoldQueue(MAX_WAIT)
    first, middle, last = (hold(queue, float(t)) for t in range(3))
    queue.leave(middle)
    assert queue.held == 2
    assert queue.step(ready=True, now_s=3.0) == Step(release=first)
    queue.leave(first)  # gone while being released: the next may go
    assert queue.step(ready=True, now_s=3.0) == Step(release=last)
    queue.leave(last)
    assert not queue.busy


def test_sent_for_a_ticket_not_being_released_changes_nothing() -> None:
    queue = HoldQueue(MAX_WAIT)
    first = hold(queue, 0.0)
    second = hold(queue, 0.0)
    assert queue.step(ready=True, now_s=1.0) == Step(release=first)
    queue.sent(second)
    assert queue.step(ready=True, now_s=1.0) == Step()


def test_the_oldest_held_is_the_first_arrival_still_waiting() -> None:
    queue = HoldQueue(MAX_WAIT)
    assert queue.oldest() is None
    first, middle, last = (hold(queue, float(t)) for t in range(3))
    assert queue.oldest() == first
    queue.leave(first)  # its client went away
    assert queue.oldest() == middle
    assert queue.step(ready=True, now_s=3.0) == Step(release=middle)
    assert queue.oldest() == last  # being released is no longer held
    assert queue.held == 1
    queue.sent(middle)
    assert queue.step(ready=True, now_s=3.0) == Step(release=last)
    assert queue.oldest() is None


def test_a_request_forwarded_at_once_and_turned_away_goes_back_ahead_of_later_ones() -> None:
    queue = HoldQueue(MAX_WAIT)
    early, now = queue.arrive(ready=True, now_s=0.0)
    assert now is Verdict.FORWARD
    # The pair left; the activator learned it from a poll before the router's 503 came back.
    later = hold(queue, 1.0)
    queue.rehold(early)
    assert queue.held == 2
    assert queue.oldest() == Ticket(0, 0.0)  # its own arrival, not the re-hold's
    assert queue.next_deadline_s() == MAX_WAIT
    assert queue.step(ready=True, now_s=2.0) == Step(release=early)
    queue.sent(early)
    assert queue.step(ready=True, now_s=2.0) == Step(release=later)


def test_a_released_request_turned_away_goes_back_to_its_place_in_the_middle() -> None:
    queue = HoldQueue(MAX_WAIT)
    first, second, third = (hold(queue, float(t)) for t in range(3))
    assert queue.step(ready=True, now_s=5.0) == Step(release=first)
    queue.sent(first)
    assert queue.step(ready=True, now_s=5.0) == Step(release=second)
    queue.sent(second)
    latecomer, _ = queue.arrive(ready=True, now_s=6.0)  # queues behind the third
    queue.rehold(second)  # the pair left: the router answered 503
    queue.rehold(first)
    assert queue.held == 4
    released = []
    for _ in range(4):
        step = queue.step(ready=True, now_s=7.0)
        assert step.release is not None
        released.append(step.release)
        queue.sent(step.release)
    assert released == [first, second, third, latecomer]
    assert not queue.busy


def test_a_request_turned_away_while_being_released_lets_the_next_go() -> None:
    """rehold() before sent(): it is no longer on its way, so nothing waits for it."""
    queue = HoldQueue(MAX_WAIT)
    first, second = hold(queue, 0.0), hold(queue, 1.0)
    assert queue.step(ready=True, now_s=2.0) == Step(release=first)
    queue.rehold(first)
    assert queue.step(ready=True, now_s=2.0) == Step(release=first)  # first again, in its place
    queue.sent(first)
    assert queue.step(ready=True, now_s=2.0) == Step(release=second)


def test_a_request_turned_away_expires_by_its_arrival_time() -> None:
    queue = HoldQueue(MAX_WAIT)
    ticket, _ = queue.arrive(ready=True, now_s=100.0)
    queue.rehold(ticket)  # at 350: waited 250 of its 300
    assert queue.step(ready=False, now_s=350.0) == Step()
    assert queue.next_deadline_s() == 400.0
    assert queue.step(ready=False, now_s=400.0) == Step(expired=(ticket,))
    assert queue.held == 0


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
