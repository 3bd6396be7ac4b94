"""Scale to zero: the sleep rule (autoscale/idle.py) as a table, and one service through the
controller from awake to asleep, woken by a held request, and awake again."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from pdfleet.autoscale.actuator import Autoscaler, WindowReads, read_activator_pages
from pdfleet.autoscale.idle import (
    ActivatorReading,
    ActivatorSample,
    Bounds,
    parse_sample,
    transition,
    wake_sizes,
    woken,
)
from pdfleet.controller import Controller
from pdfleet.reconcile.observed import Observed, PodInfo
from tests.spec_cases import merge_patch
from tests.unit.autoscale.test_actuator import NOW, Source, _body, _metrics, _observed
from tests.unit.fakes import Inline, Writer

T0 = NOW.timestamp()
BOUNDS = Bounds(
    minimum={"prefill": 0, "decode": 0},
    maximum={"prefill": 4, "decode": 4},
    gpus={"prefill": 1, "decode": 1},
    budget=6,
)
ONE_EACH = {"prefill": 1, "decode": 1}
ZERO = {"prefill": 0, "decode": 0}
BUSY = {"prefill": 3, "decode": 2}

PAGE = """\
# TYPE pdfleet_activator_requests_held gauge
pdfleet_activator_requests_held 3.0
# TYPE pdfleet_activator_oldest_held_timestamp_seconds gauge
pdfleet_activator_oldest_held_timestamp_seconds 1.7e+09
# TYPE pdfleet_activator_requests_in_flight gauge
pdfleet_activator_requests_in_flight 4.0
# TYPE pdfleet_activator_last_activity_timestamp_seconds gauge
pdfleet_activator_last_activity_timestamp_seconds 1.7000001e+09
"""


def reading(
    held: int = 0, in_flight: int = 0, quiet_s: float = 0.0, oldest_s: float = 0.0, pods: int = 2
) -> ActivatorReading:
    """Requests spread over `pods` activators, the last activity `quiet_s` before T0."""
    first = ActivatorSample(held, in_flight, oldest_s if held else 0.0, T0 - quiet_s)
    rest = ActivatorSample(0, 0, 0.0, T0 - quiet_s - 100)
    return ActivatorReading((first,) + (rest,) * (pods - 1))


def test_an_activator_page_is_read() -> None:
    sample = parse_sample(PAGE)
    assert (sample.held, sample.in_flight) == (3, 4)
    assert (sample.oldest_held_s, sample.last_activity_s) == (1.7e9, 1.7000001e9)
    with pytest.raises(ValueError, match="requests_held"):
        parse_sample("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")


@pytest.mark.parametrize(
    ("last_busy", "bounds", "sizes"),
    [
        ({"prefill": 3, "decode": 2}, BOUNDS, {"prefill": 3, "decode": 2}),
        (None, BOUNDS, ONE_EACH),  # never busy: one of each, not min 0
        ({"prefill": 9, "decode": 2}, BOUNDS, {"prefill": 4, "decode": 2}),  # max
        ({"prefill": 4, "decode": 4}, BOUNDS, {"prefill": 3, "decode": 3}),  # budget 6
        ({"prefill": 1, "decode": 1}, replace(BOUNDS, minimum={"prefill": 2, "decode": 1}),
         {"prefill": 2, "decode": 1}),
        ({"prefill": 2, "decode": 2}, replace(BOUNDS, gpus={"prefill": 1, "decode": 4}),
         {"prefill": 2, "decode": 1}),
        ({"prefill": 1, "decode": 1}, replace(BOUNDS, budget=1), ONE_EACH),  # placement says no
    ],
)  # fmt: skip
def test_a_wake_sizes_both_pools_from_the_last_busy_spell(
    last_busy: dict[str, int] | None, bounds: Bounds, sizes: dict[str, int]
) -> None:
    assert wake_sizes(last_busy, bounds) == sizes


AWAKE = {"state": "Awake", "since": "2026-11-29T11:00:00Z"}
IDLE = {"state": "Idle", "since": "2026-11-29T11:50:00Z", "lastBusy": BUSY}
WAKING = {"state": "Waking", "since": "2026-11-29T11:59:50Z", "lastBusy": BUSY}


@pytest.mark.parametrize(
    ("previous", "seen", "current", "state", "desired", "event"),
    [
        # awake: quiet for idleAfter (60 s) on every activator -> both pools to zero
        (AWAKE, reading(quiet_s=61), BUSY, "Idle", ZERO, "Idle"),
        (None, reading(quiet_s=61), ONE_EACH, "Idle", ZERO, "Idle"),
        (AWAKE, reading(quiet_s=59), ONE_EACH, "Awake", None, None),
        # a request in flight or held keeps it awake, however old the last arrival
        (AWAKE, reading(in_flight=1, quiet_s=600), ONE_EACH, "Awake", None, None),
        (AWAKE, reading(held=1, in_flight=1, quiet_s=600), ONE_EACH, "Awake", None, None),
        # an activator that could not be read may be carrying requests: stay awake
        (AWAKE, replace(reading(quiet_s=600), unread=("a-1: ConnectTimeout",)), ONE_EACH,
         "Awake", None, None),
        (AWAKE, ActivatorReading(()), ONE_EACH, "Awake", None, None),
        # asleep: stays at zero until a request is held, then wakes at the last busy sizes
        (IDLE, reading(quiet_s=3000), ZERO, "Idle", ZERO, None),
        (IDLE, reading(held=2, in_flight=2, oldest_s=T0 - 4), ZERO,
         "Waking", BUSY, "Waking"),
        # an activator that cannot be read does not wake it, one that holds does
        (IDLE, replace(reading(held=1, in_flight=1, pods=1), unread=("a-2: refused",)),
         ZERO, "Waking", BUSY, "Waking"),
        # waking: the pools start (the policy sizes them); a wake nothing could place goes
        # back to sleep once its held requests had their 503 and idleAfter passed
        (WAKING, reading(held=2, in_flight=2, oldest_s=T0 - 30), BUSY,
         "Waking", None, None),
        (WAKING, reading(quiet_s=61), BUSY, "Idle", ZERO, "Idle"),
    ],
)  # fmt: skip
def test_sleep_rule(
    previous: dict[str, Any] | None,
    seen: ActivatorReading,
    current: dict[str, int],
    state: str,
    desired: dict[str, int] | None,
    event: str | None,
) -> None:
    change = transition(previous, seen, current, 60.0, BOUNDS, T0)
    assert change.record["state"] == state
    assert change.desired == desired
    assert (change.event[0] if change.event else None) == event


def test_falling_asleep_remembers_the_last_busy_sizes() -> None:
    busy = transition(AWAKE, reading(in_flight=3), {"prefill": 3, "decode": 2}, 60.0, BOUNDS, T0)
    assert busy.record["lastBusy"] == {"prefill": 3, "decode": 2}
    # quiet, the policy shrank the pools to one each: the busy sizes are what a wake needs
    asleep = transition(busy.record, reading(quiet_s=61), ONE_EACH, 60.0, BOUNDS, T0 + 400)
    assert asleep.record["lastBusy"] == {"prefill": 3, "decode": 2}
    waking = transition(asleep.record, reading(held=1, oldest_s=T0 + 500), ONE_EACH, 60.0,
                        BOUNDS, T0 + 510)  # fmt: skip
    assert waking.desired == {"prefill": 3, "decode": 2}
    assert waking.record["since"] == "2026-11-29T12:08:20Z"  # the held request's arrival


def test_woken_once_both_pools_have_a_ready_pod() -> None:
    assert woken(WAKING, {"prefill": 1, "decode": 0}, T0) is None
    assert woken(AWAKE, ONE_EACH, T0) is None
    change = woken(WAKING, {"prefill": 2, "decode": 1}, T0)
    assert change is not None and change.record["state"] == "Awake"
    assert change.record["wakeSeconds"] == 10.0  # from the oldest held request's arrival


def test_activator_pages_are_read_and_failures_named() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.2":
            return httpx.Response(200, text="not an activator\n")
        return httpx.Response(200, text=PAGE)

    client = httpx.Client(transport=httpx.MockTransport(answer))
    pods = [("a-0", "10.0.0.1"), ("a-1", "10.0.0.2"), ("a-2", None)]
    seen = read_activator_pages(pods, 8000, client)
    assert [s.held for s in seen.samples] == [3]
    assert [u.split(":")[0] for u in seen.unread] == ["a-1", "a-2"]
    assert not seen.complete


SLEEPY = {"spec": {"autoscaling": {"scaleToZero": {"idleAfter": "1m", "maxWait": "30s"}}}}


class Activators:
    """What the service's activators answer (the test sets `now`)."""

    def __init__(self) -> None:
        self.now = ActivatorReading(())
        self.asked: list[list[tuple[str, str | None]]] = []

    def __call__(self, pods: Any, port: int) -> ActivatorReading:
        self.asked.append(list(pods))
        return self.now


def _sleepy_observed(ready_pools: bool) -> Observed:
    observed = _observed(_sleepy_isvc())
    children = dict(observed.children)
    for front in ("llama-8b-activator", "llama-8b-router"):
        children[("Deployment", front)] = replace(children[("Deployment", front)],
                                                  available_replicas=2)  # fmt: skip
    activators = tuple(
        PodInfo(name=f"llama-8b-activator-{i}", role="activator", ordinal=i, phase="Running",
                ready=True, pod_ip=f"10.244.0.{10 + i}")
        for i in range(2)
    )  # fmt: skip
    workers = observed.pods if ready_pools else ()
    return replace(observed, children=children, pods=workers + activators)


def _sleepy_isvc() -> Any:
    from pdfleet.api.v1alpha1 import InferenceService

    return InferenceService.model_validate(merge_patch(_body(), SLEEPY))


def test_a_service_sleeps_wakes_on_a_held_request_and_says_so() -> None:
    activators, clock = Activators(), [T0]
    source = Source(_metrics(0.2, 0.01), _metrics(0.2, 0.01))
    writer = Writer()
    autoscaler = Autoscaler(
        source_for=lambda url: source,
        clock_s=lambda: clock[0],
        wall_clock_s=lambda: clock[0],
        reads=WindowReads(executor_for=lambda url: Inline()),
        activator_reads=WindowReads(executor_for=lambda url: Inline()),
        read_activators=activators,
    )
    at = [NOW]
    controller = Controller(writer, clock=lambda: at[0], autoscaler=autoscaler)
    body = merge_patch(_body(), SLEEPY)

    def tick(seconds: float, reading_now: ActivatorReading, ready_pools: bool) -> dict[str, Any]:
        clock[0] += seconds
        at[0] += timedelta(seconds=seconds)
        activators.now = reading_now
        controller.reconcile({**body, "status": writer.last_status},
                             _sleepy_observed(ready_pools))  # fmt: skip
        return dict(writer.last_status)

    busy = ActivatorReading((ActivatorSample(0, 2, 0.0, clock[0]),) * 2)
    status = tick(0, busy, True)
    assert status["scaleToZero"]["state"] == "Awake" and source.calls == 1
    assert activators.asked[-1] == [("llama-8b-activator-0", "10.244.0.10"),
                                    ("llama-8b-activator-1", "10.244.0.11")]  # fmt: skip
    ready = next(c for c in status["conditions"] if c["type"] == "RouterReady")
    assert ready["status"] == "True" and "2 activator replica(s)" in ready["message"]

    quiet = ActivatorReading((ActivatorSample(0, 0, 0.0, clock[0]),) * 2)
    status = tick(75, quiet, True)
    assert status["scaleToZero"]["state"] == "Idle", status["scaleToZero"]
    assert (status["prefill"]["desired"], status["decode"]["desired"]) == (0, 0)
    assert source.calls == 1  # asleep, the policy does not read Prometheus
    assert ("event", "Idle") in writer.calls

    status = tick(15, quiet, False)  # the pools are gone
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Idle")
    assert status["prefill"]["summary"] == "0/0"

    held = ActivatorReading((ActivatorSample(3, 3, clock[0] + 10, clock[0] + 12),) * 2)
    status = tick(15, held, False)
    assert status["scaleToZero"]["state"] == "Waking"
    assert status["scaleToZero"]["heldRequests"] == 6
    assert (status["prefill"]["desired"], status["decode"]["desired"]) == (1, 1)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"

    status = tick(3, held, True)  # not due: the wake is seen on the pass its pods turn Ready
    assert status["scaleToZero"]["state"] == "Awake"
    assert status["scaleToZero"]["wakeSeconds"] == 8.0
    assert ("event", "Awake") in writer.calls


def test_turning_scale_to_zero_off_wakes_the_service() -> None:
    from pdfleet.api.v1alpha1 import InferenceService
    from pdfleet.reconcile.plan import desired_replicas

    asleep = {"scaleToZero": {"state": "Idle"}, "prefill": {"desired": 0}, "decode": {"desired": 0}}
    assert desired_replicas(_sleepy_isvc(), asleep) == {"prefill": 0, "decode": 0}
    plain = InferenceService.model_validate(_body())
    assert desired_replicas(plain, asleep) == ONE_EACH  # min 1 applies again
