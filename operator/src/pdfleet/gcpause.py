"""Short garbage-collector pauses for an operator that holds a large, long-lived heap.

Where it fits: `pdfleet operator run` calls `install()` once at start. Nothing else here is
operator logic.

The operator keeps every watched object in memory: every service's body and a small
projection of each child and pod. CPython's full collection walks every tracked object while
holding the GIL, and no pass and no watch event moves meanwhile. With a large fleet that heap
is hundreds of thousands of objects, so each full collection is a pause every pass and watch
feels, and full collections come often while many services are created (figures:
docs/benchmarks/scale).

So, after each full collection, the objects that survived it are moved to the permanent
generation (`gc.freeze()`), which later collections skip: they walk only what is newer.
Those survivors were just proven reachable, so no garbage is frozen. One that later
becomes garbage is still freed by its reference count; only one caught in a reference cycle
waits for the next thaw. Every THAW_S the frozen objects are handed back, so the next full
collection walks everything once and reclaims such cycles: one long pause an hour rather
than one every few minutes.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdfleet import metrics

THAW_S = 3600.0
FULL = 2  # the oldest generation: a full collection


@dataclass
class FreezeAfterFullCollections:
    """A `gc.callbacks` entry: times full collections and freezes their survivors."""

    thaw_s: float = THAW_S
    clock: Callable[[], float] = time.monotonic
    freeze: Callable[[], None] = gc.freeze
    unfreeze: Callable[[], None] = gc.unfreeze
    _thawed: float | None = None
    _started: float | None = field(default=None, repr=False)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != FULL:
            return
        now = self.clock()
        if phase == "start":
            self._started = now
            return
        if self._started is not None:
            metrics.GC_FULL_COLLECTION.observe(now - self._started)
        if self._thawed is None:
            self._thawed = now
        if now - self._thawed >= self.thaw_s:
            self.unfreeze()  # the next full collection walks everything once
            self._thawed = now
        else:
            self.freeze()


def install() -> FreezeAfterFullCollections:
    """Register the callback (once per process) and return it."""
    for callback in gc.callbacks:
        if isinstance(callback, FreezeAfterFullCollections):
            return callback
    callback = FreezeAfterFullCollections()
    gc.callbacks.append(callback)
    return callback
