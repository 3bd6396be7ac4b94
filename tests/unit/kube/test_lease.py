"""Leader lease renewal: what ends leadership and what is only retried."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from pdfleet.kube.lease import LeaderElector, renewal_verdict


@pytest.mark.parametrize(
    ("renewed", "other", "since_ok", "verdict"),
    [
        (True, False, 0.0, "renewed"),
        (True, False, 30.0, "renewed"),
        (False, True, 0.0, "lost"),  # another replica holds it: stop at once
        (False, False, 5.0, "retry"),  # a conflict or no answer: try again
        (False, False, 10.0, "lost"),  # past the renew deadline
    ],
)
def test_renewal_verdict(renewed: bool, other: bool, since_ok: float, verdict: str) -> None:
    assert renewal_verdict(renewed, other, since_ok, deadline_s=10.0) == verdict


class Scripted(LeaderElector):
    """Renewal attempts play a script (True, False or an exception); the clock advances by
    what the loop waits before each attempt (`NoWait`), without sleeping."""

    def __init__(self, script: list[Any], holder_other: bool = False) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        super().__init__(None, "ns", "lease", "me", clock=lambda: self.now)  # type: ignore[arg-type]
        self.script: Iterator[Any] = iter(script)
        self.holder_other = holder_other
        self.attempts = 0

    def try_acquire_or_renew(self) -> bool:
        self.attempts += 1
        step = next(self.script)
        if isinstance(step, BaseException):
            raise step
        return bool(step)

    def _held_by_other(self) -> bool:
        return self.holder_other


class NoWait(threading.Event):
    def __init__(self, rounds: int, elector: Scripted) -> None:
        super().__init__()
        self.rounds, self.elector = rounds, elector
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.rounds -= 1
        self.waits.append(timeout or 0.0)
        self.elector.now += timedelta(seconds=timeout or 0.0)
        return self.rounds < 0


def run(elector: Scripted, rounds: int) -> bool:
    lost: list[bool] = []
    elector.keep_renewing(NoWait(rounds, elector), lambda: lost.append(True))
    return bool(lost)


def refused() -> urllib3.exceptions.MaxRetryError:
    return urllib3.exceptions.MaxRetryError(None, "/lease", "Connection refused")  # type: ignore[arg-type]


def test_an_unreachable_api_server_is_retried_not_fatal_to_the_renewal_loop() -> None:
    # A restarting API server refuses connections for a moment; renewal resumes after.
    elector = Scripted([True, refused(), True, True])
    assert not run(elector, 4)
    assert elector.attempts == 4


def test_a_conflict_on_our_own_lease_is_retried() -> None:
    elector = Scripted([True, False, True], holder_other=False)
    assert not run(elector, 3)


def test_another_holder_ends_leadership_at_once() -> None:
    elector = Scripted([True, False, True], holder_other=True)
    assert run(elector, 3)
    assert elector.attempts == 2


def test_no_renewal_until_the_deadline_ends_leadership_before_the_lease_expires() -> None:
    error = ApiException(status=503)
    elector = Scripted([error] * 10)
    assert run(elector, 10)
    # Renew period 5 s, lease 15 s, retries every 1 s: the deadline (10 s) is reached at the
    # sixth attempt (5 + 5 x 1 s), 5 s before the lease expires.
    assert elector.attempts == 6


def test_a_refused_renewal_is_retried_soon_not_a_renew_period_later() -> None:
    # Two refused writes in a row (409 on a stale read, 429 from API priority and fairness)
    # are retried every second: they cost 2 s, not the whole 10 s renew deadline.
    stop = NoWait(5, elector := Scripted([True, False, False, True, True]))
    lost: list[bool] = []
    elector.keep_renewing(stop, lambda: lost.append(True))
    assert not lost
    assert stop.waits[:5] == [5.0, 5.0, 1.0, 1.0, 5.0]
