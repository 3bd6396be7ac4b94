"""The operator's work queue: which service a pass runs for next, and when it comes back.

Where it fits: `pdfleet.handlers` puts a service's key here on every watch event and resync;
the queue's worker threads call the controller's pass for one key at a time and schedule the
next pass the result or the failure asks for. It knows keys and priorities, not services.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pdfleet import metrics

log = logging.getLogger(__name__)

Key = tuple[str, str]

# Work queue priorities, served strictly in this order:
# - URGENT: a watch event of a service the operator already runs (a spec change, a pod turning
#   ready, a deleted child);
# - NEW: a service seen for the first time (created, or listed when the operator starts). Its
#   first pass writes a dozen children, so under a burst of creations these passes wait
#   behind the services already in flight: with one queue in arrival order, the first of
#   many services created at once would show Ready only once every later service had its
#   children (docs/benchmarks/scale);
# - RESYNC: the periodic safety net, so a change never waits behind resync passes.
# A lower tier waits only while every pass thread has higher work, which a fleet's bounded
# pod events cannot sustain.
URGENT, NEW, RESYNC = 0, 1, 2
PRIORITY_NAMES = {URGENT: "urgent", NEW: "new", RESYNC: "resync"}


@dataclass
class WorkQueue:
    """Coalescing priority queue of services to reconcile: a burst of pod events is one pass,
    and passes go in the order of the priorities above.

    Passes run in `workers` threads of their own. A pass spends most of its time waiting for
    the API server (a status patch, an Event), so while a large fleet converges the number of
    passes in flight, not the CPU, sets how long a queued service waits; asyncio's default
    pool is sized by the node's CPUs, a few threads on a small node (docs/benchmarks/scale)."""

    run: Callable[[Key], Any]
    workers: int = 16
    _queue: asyncio.PriorityQueue[tuple[int, int, Key]] = field(
        default_factory=asyncio.PriorityQueue
    )
    _queued: dict[Key, int] = field(default_factory=dict)
    # When each queued key was put at its priority (monotonic): pdfleet_queue_wait_seconds.
    _queued_at: dict[Key, float] = field(default_factory=dict)
    _seq: int = 0
    _later: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    # Keys whose pass is running, and the priority each was asked for again meanwhile. A
    # service is in one worker's hands at a time: a pass held up by a slow dependency must
    # not draw the other workers into waiting on the same service (client-go's workqueue
    # keeps its "processing" and "dirty" sets for the same reason).
    _running: set[Key] = field(default_factory=set)
    _asked_while_running: dict[Key, int] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _threads: ThreadPoolExecutor | None = None

    def put(self, key: Key, priority: int = URGENT) -> None:
        """Queue `key` once; a queued resync entry is promoted by an urgent put."""
        if self._queued.get(key, priority + 1) <= priority:
            return
        self._queued[key] = priority
        self._queued_at[key] = time.monotonic()
        self._seq += 1  # FIFO within a priority
        self._queue.put_nowait((priority, self._seq, key))

    def next_key(self, entry: tuple[int, int, Key]) -> Key | None:
        """The key to run for a dequeued entry, now marked running; None for the stale copy
        of a promoted key, or for a key whose pass is running (it runs again after that)."""
        priority, _, key = entry
        if self._queued.get(key) != priority:
            return None
        del self._queued[key]
        queued_at = self._queued_at.pop(key)
        if key in self._running:
            asked = self._asked_while_running.get(key, priority)
            self._asked_while_running[key] = min(asked, priority)
            return None
        self._running.add(key)
        waited = time.monotonic() - queued_at
        metrics.QUEUE_WAIT.labels(priority=PRIORITY_NAMES[priority]).observe(waited)
        return key

    def done(self, key: Key) -> None:
        """The pass of `key` ended: queue it again if it was asked for meanwhile."""
        self._running.discard(key)
        asked = self._asked_while_running.pop(key, None)
        if asked is not None:
            self.put(key, asked)

    def come_back(self, key: Key, delay_s: float | None) -> None:
        """What the latest pass of `key` asked: a pass in `delay_s` (None: none). It replaces
        what an earlier pass asked, so a service has at most one pass pending on a timer.
        Scheduling each request on its own would multiply passes: every pass of a service
        whose KV preflight failed asks to come back in 60 s, and so does the pass that runs
        then, so each resync would start a chain that never ends, and an idle fleet would
        run ever more passes than the resync asks for (docs/benchmarks/scale)."""
        pending = self._later.pop(key, None)
        if pending is not None:
            pending.cancel()
        if delay_s:
            loop = asyncio.get_running_loop()
            self._later[key] = loop.call_later(delay_s, self._timer_fired, key)

    def _timer_fired(self, key: Key) -> None:
        del self._later[key]
        self.put(key)

    def start(self) -> None:
        self._threads = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="pass")
        self._tasks = [asyncio.create_task(self._work(self._threads)) for _ in range(self.workers)]

    async def stop(self) -> None:
        for pending in self._later.values():
            pending.cancel()
        self._later.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    async def _work(self, threads: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = self.next_key(await self._queue.get())
            if key is None:
                continue
            try:
                result = await loop.run_in_executor(threads, self.run, key)
                # A pass can ask to come back (a drain waiting on in-flight requests, a
                # preflight retry, the autoscaler's next step).
                self.come_back(key, getattr(result, "requeue_after_s", None))
            except Exception as error:  # one bad object must never stop the others
                delay, expected = retry_after(error)
                if getattr(error, "status", None) == 404:
                    # The service or a pod went while the pass ran (a deletion during a
                    # drain): the next pass sees it gone, there is nothing to warn about.
                    gone = getattr(error, "reason", "")
                    log.info("reconcile of %s/%s: %s; looking again", *key, gone)
                elif expected:
                    log.warning("reconcile of %s/%s: %s; retrying in %.0fs", *key, error, delay)
                else:
                    log.exception("reconcile of %s/%s failed; retrying in %.0fs", *key, delay)
                self.come_back(key, delay)
            finally:
                self.done(key)


RETRY_S = 5.0
MAX_RETRY_AFTER_S = 60.0


def retry_after(error: BaseException) -> tuple[float, bool]:
    """(seconds until the next pass, whether the failure is an expected API answer).

    A 409 (someone wrote the object in between) or a 404 (it went meanwhile) is retried at
    once, since the next pass reads the newer state; a 429 waits what the API server's
    Retry-After asks (its priority and fairness sets it), within bounds. Anything else waits
    a fixed delay and is logged with its traceback."""
    status = getattr(error, "status", None)
    if status in (404, 409):
        return 1.0, True
    if status == 429:
        headers = getattr(error, "headers", None) or {}
        try:
            asked = float(headers.get("Retry-After", RETRY_S))
        except (TypeError, ValueError):
            asked = RETRY_S
        return min(max(asked, 1.0), MAX_RETRY_AFTER_S), True
    return RETRY_S, False
