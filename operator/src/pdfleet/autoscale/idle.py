"""Sleep and wake of a service that scales to zero: pure rules over what the activators say.

Where it fits: for a service with `autoscaling.scaleToZero`, the autoscaler reads every
activator pod's /metrics on its pass (`actuator.ActivatorReads`, the I/O) and `transition`
decides here whether the service sleeps (both pools to zero), stays asleep, wakes (both pools
back at the sizes they had the last time requests flowed) or stays awake (the policy sizes the
pools). The Waking -> Awake step needs no read: `woken` sees a Ready prefill and decode in
what the operator observes. The record lands in `status.scaleToZero`; the design is
docs/design/scale-to-zero.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pdfleet import labels
from pdfleet.api.types import format_duration
from pdfleet.reconcile.observed import parse_time

AWAKE, IDLE, WAKING = "Awake", "Idle", "Waking"
PREFIX = "pdfleet_activator_"


@dataclass(frozen=True)
class ActivatorSample:
    """One activator pod's gauges (server.py names them)."""

    held: int
    in_flight: int
    oldest_held_s: float
    """Unix time the oldest held request arrived; 0 when none is held."""
    last_activity_s: float


@dataclass(frozen=True)
class ActivatorReading:
    """Every activator pod of one service, read on one pass."""

    samples: tuple[ActivatorSample, ...]
    unread: tuple[str, ...] = ()
    """'pod: why' for each pod that could not be read."""

    @property
    def held(self) -> int:
        return sum(s.held for s in self.samples)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.samples)

    @property
    def oldest_held_s(self) -> float | None:
        held = [s.oldest_held_s for s in self.samples if s.held and s.oldest_held_s > 0]
        return min(held) if held else None

    @property
    def last_activity_s(self) -> float:
        return max((s.last_activity_s for s in self.samples), default=-math.inf)

    @property
    def complete(self) -> bool:
        """Every pod answered: only then can a quiet reading mean a quiet service."""
        return bool(self.samples) and not self.unread


def parse_sample(text: str) -> ActivatorSample:
    """An activator's /metrics page -> its gauges. A page without them is not an activator's
    (a wrong port, another process): ValueError."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(PREFIX):
                values[sample.name.removeprefix(PREFIX)] = sample.value
    needed = ("requests_held", "requests_in_flight", "last_activity_timestamp_seconds")
    missing = [name for name in needed if name not in values]
    if missing:
        raise ValueError(f"no {', '.join(PREFIX + m for m in missing)} on the page")
    return ActivatorSample(
        held=int(values["requests_held"]),
        in_flight=int(values["requests_in_flight"]),
        oldest_held_s=values.get("oldest_held_timestamp_seconds", 0.0),
        last_activity_s=values["last_activity_timestamp_seconds"],
    )


@dataclass(frozen=True)
class Transition:
    """What one pass does about sleep: the new `status.scaleToZero`, the pools' sizes when
    this rule sets them (None: the policy decides), and an Event to record."""

    record: dict[str, Any]
    desired: dict[str, int] | None
    event: tuple[str, str] | None = None
    """(reason, message) of a Normal Event."""


@dataclass(frozen=True)
class Bounds:
    """The pools' bounds and GPUs as the spec gives them (a wake stays inside them)."""

    minimum: Mapping[str, int]
    maximum: Mapping[str, int]
    gpus: Mapping[str, int]
    budget: int | None


def wake_sizes(last_busy: Mapping[str, int] | None, bounds: Bounds) -> dict[str, int]:
    """The sizes a wake starts both pools at: what they had when requests last flowed, at
    least one of each, within the bounds and the GPU budget (the pool holding more GPUs
    gives way first, one replica at a time, so that neither pool is left out)."""
    sizes = {}
    for role in labels.WORKER_ROLES:
        wanted = (last_busy or {}).get(role, 1)
        sizes[role] = max(1, bounds.minimum[role], min(wanted, bounds.maximum[role]))
    if bounds.budget is not None:
        while sum(sizes[r] * bounds.gpus[r] for r in sizes) > bounds.budget:
            larger = max(labels.WORKER_ROLES, key=lambda r: (sizes[r] * bounds.gpus[r], r))
            if sizes[larger] <= 1:
                break  # one of each does not fit: the scheduler's InsufficientCapacity says so
            sizes[larger] -= 1
    return sizes


def _stamp(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sizes(record: Mapping[str, Any] | None) -> dict[str, int] | None:
    if not record:
        return None
    return {role: int(record.get(role, 0)) for role in labels.WORKER_ROLES}


def transition(
    previous: Mapping[str, Any] | None,
    reading: ActivatorReading,
    current: Mapping[str, int],
    idle_after_s: float,
    bounds: Bounds,
    now_s: float,
) -> Transition:
    """One pass's rule. `previous` is the last `status.scaleToZero` (None: never recorded,
    i.e. awake), `current` the pools' sizes as last decided.

    - Idle: a held request on any activator wakes both pools (Waking, at `wake_sizes`);
      otherwise both stay at zero.
    - Awake or Waking: nothing held or in flight on every activator, and the last request
      ended `idle_after_s` ago or longer, puts both pools to sleep (a wake that could not
      be placed goes back to sleep too once its held requests have had their 503).
      Otherwise the policy sizes the pools; while requests are in flight their sizes are
      remembered as `lastBusy`.
    """
    was = dict(previous or {})
    state = was.get("state", AWAKE)
    last_busy = _sizes(was.get("lastBusy"))
    base = {"lastBusy": last_busy} if last_busy else {}
    held = reading.held
    if state == IDLE:
        if held:
            sizes = wake_sizes(last_busy, bounds)
            waited = now_s - (reading.oldest_held_s or now_s)
            message = (
                f"{held} request(s) held, the oldest for {format_duration(max(0.0, waited))}: "
                f"waking prefill {sizes[labels.ROLE_PREFILL]}, decode {sizes[labels.ROLE_DECODE]}"
            )
            record = {**base, "state": WAKING, "since": _stamp(reading.oldest_held_s or now_s),
                      "heldRequests": held, "message": message}  # fmt: skip
            return Transition(record, sizes, ("Waking", message))
        zero = {role: 0 for role in labels.WORKER_ROLES}
        return Transition({**was, "heldRequests": 0}, zero)
    quiet_s = now_s - reading.last_activity_s
    if reading.complete and not held and not reading.in_flight and quiet_s >= idle_after_s:
        if state == AWAKE and any(current.values()):
            base = {"lastBusy": last_busy or dict(current)}
        message = (
            f"no request for {format_duration(quiet_s)} (idleAfter "
            f"{format_duration(idle_after_s)}): both pools drain to zero; the activator holds "
            "the next request and wakes them"
        )
        record = {**base, "state": IDLE, "since": _stamp(now_s), "heldRequests": 0,
                  "message": message}  # fmt: skip
        if "wakeSeconds" in was:
            record["wakeSeconds"] = was["wakeSeconds"]
        return Transition(record, {role: 0 for role in labels.WORKER_ROLES}, ("Idle", message))
    record = {**was, "state": state, "heldRequests": held}
    record.setdefault("since", _stamp(now_s))
    if state == AWAKE:
        record["message"] = _awake_message(reading)
    if reading.in_flight and state == AWAKE and any(current.values()):
        record["lastBusy"] = dict(current)
    return Transition(record, None)


def _awake_message(reading: ActivatorReading) -> str:
    if reading.unread:
        return "activator pods not read: " + "; ".join(reading.unread)
    return f"{reading.in_flight} request(s) in flight"


def woken(
    previous: Mapping[str, Any] | None, ready: Mapping[str, int], now_s: float
) -> Transition | None:
    """Waking -> Awake once both pools have a Ready pod (the router then has a pair and the
    activator forwards what it holds); `wakeSeconds` counts from the oldest held request."""
    was = dict(previous or {})
    if was.get("state") != WAKING or not all(ready.get(r, 0) for r in labels.WORKER_ROLES):
        return None
    since = was.get("since")
    took = now_s - parse_time(since).timestamp() if since else math.nan
    message = f"awake: a prefill and a decode are Ready, {format_duration(took)} after the wake"
    record = {**was, "state": AWAKE, "since": _stamp(now_s), "message": message}
    if not math.isnan(took):
        record["wakeSeconds"] = round(took, 3)
    return Transition(record, None, ("Awake", message))
