"""What the operator remembers about one InferenceService between its passes.

Where it fits: the controller keeps one `ServiceMemory` per service in `Memories` and nothing
else per service, so forgetting a deleted service is one removal. Everything here stands in
for something the watch indexes show a moment late (the operator's own writes: children,
drain marks, the status) or that no Kubernetes object records (a preflight in flight, a drain
already reported). The level-based pass never needs it to be right after a restart: it only
keeps a pass from undoing or repeating what the last one did.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo
from pdfleet_wire.preflight import PreflightResult

Key = tuple[str, str]

# How long a child we wrote stands in for the watch index's copy (which lags by a moment);
# long enough for any watch event, short enough that a child deleted meanwhile comes back.
RECENT_WRITE_S = 10.0
# How long a written workload is remembered: its generation tells a lagging index from a
# newer object (reconcile/observed.index_lags), so it can stand in for as long as the lag.
WRITTEN_KEEP_S = 300.0


def monotonic() -> float:
    """time.monotonic, looked up at each call (a test may move the clock by hand)."""
    return time.monotonic()


@dataclass(frozen=True)
class PreflightRun:
    """A preflight run in flight for one service: which spec and pods it measures."""

    fingerprint: str
    pair: tuple[PodInfo, PodInfo]
    result: Future[PreflightResult]


@dataclass
class ServiceMemory:
    """One service's memory; its `lock` is held by the pass that uses it."""

    clock: Callable[[], float] = monotonic
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Children this operator wrote, by (kind, name), with when (monotonic).
    written: dict[tuple[str, str], tuple[ChildRef, float]] = field(default_factory=dict)
    # The last status this operator wrote, with when; it stands in for the watch index's copy
    # for RECENT_WRITE_S. `status_at` stays: how long a start-up's progress waits counts from it.
    status_written: tuple[dict[str, Any], float] | None = None
    status_at: float = -math.inf
    # Drain marks this operator wrote on pods: pod -> (since or None for removed, expiry).
    marks: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    # Drains already reported (Event + metric), by (pod, drain start): the StatefulSet's
    # lowered count may reach the watch index a pass late, and the report must not repeat.
    reported: dict[tuple[str, str], float] = field(default_factory=dict)
    # The last KV transport preflight started: (fingerprint, when), and the run in flight.
    preflight_tried: tuple[str, float] | None = None
    preflight_run: PreflightRun | None = None

    def remember(self, ref: ChildRef) -> None:
        self.written[(ref.kind, ref.name)] = (ref, self.clock())

    def recent_writes(self) -> dict[tuple[str, str], tuple[ChildRef, float]]:
        """Children this operator wrote, with their age (see observed.overlay)."""
        now = self.clock()
        self.written = {k: v for k, v in self.written.items() if now - v[1] < WRITTEN_KEEP_S}
        return {k: (ref, now - at) for k, (ref, at) in self.written.items()}

    def remember_marks(self, marks: Mapping[str, str | None]) -> None:
        """Drain marks this operator just wrote on pods, pod -> since (None: removed). The
        pod index shows them late, and a pass that missed its own mark would mark again and
        restart the drain clock."""
        expires = self.clock() + RECENT_WRITE_S
        self.marks.update((pod, (since, expires)) for pod, since in marks.items())

    def recent_marks(self) -> dict[str, str | None]:
        now = self.clock()
        self.marks = {pod: v for pod, v in self.marks.items() if v[1] > now}
        return {pod: since for pod, (since, _) in self.marks.items()}

    def recent_status(self) -> dict[str, Any] | None:
        if self.status_written is None or self.clock() - self.status_written[1] > RECENT_WRITE_S:
            self.status_written = None
            return None
        return self.status_written[0]

    def since_preflight(self, fingerprint: str | None = None) -> float | None:
        """Seconds since this operator last started a preflight of the service (of that
        fingerprint, when given); None when it has not."""
        tried = self.preflight_tried
        if tried is None or (fingerprint is not None and tried[0] != fingerprint):
            return None
        return self.clock() - tried[1]


class Memories:
    """Every service's memory, made on first use and dropped when the service goes; and the
    services whose last written status is not Ready (how long a start-up's progress waits)."""

    def __init__(self, clock: Callable[[], float] = monotonic) -> None:
        self._clock = clock
        self._memories: dict[Key, ServiceMemory] = {}
        self._unready: set[Key] = set()
        self._guard = threading.Lock()

    def of(self, key: Key) -> ServiceMemory:
        with self._guard:
            memory = self._memories.get(key)
            if memory is None:
                memory = self._memories[key] = ServiceMemory(clock=self._clock)
            return memory

    def forget(self, key: Key) -> None:
        with self._guard:
            self._memories.pop(key, None)
            self._unready.discard(key)

    def status_written(self, key: Key, status: dict[str, Any], ready: bool) -> None:
        memory = self.of(key)
        now = self._clock()
        memory.status_written, memory.status_at = (status, now), now
        with self._guard:
            if ready:
                self._unready.discard(key)
            else:
                self._unready.add(key)

    def unready(self) -> int:
        with self._guard:
            return len(self._unready)


@dataclass(frozen=True)
class Pass:
    """What each step of one reconcile pass works on: the service as stored and as a model,
    what the indexes show of its children, the pass's time and the service's memory."""

    body: Mapping[str, Any]
    isvc: InferenceService
    observed: Observed
    now: datetime
    memory: ServiceMemory
