"""The thin kopf shell: watches feed in-memory caches and a work queue; one reconcile() runs.

Every trigger lands in the same place, `Controller.reconcile()`:
- the InferenceService's own events (created, changed, and the initial listing when the
  operator starts, i.e. resume), through `on.event`;
- events of its children and pods (a pod became ready, someone deleted a StatefulSet);
- a periodic resync of every service.

Low-level `on.event` handlers are used instead of kopf's on.create/on.update/on.resume because
those keep per-object bookkeeping in annotations on the user's object: that would be a write
per change and per restart, which neither GitOps tools nor a 1,000-service cluster want.
The InferenceServices come through kopf's watch; children and pods through the operator's
own informers (pdfleet.kube.informer, which says why not kopf indexes). A pass reads only
these caches, so it costs no API reads.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from pdfleet import labels, metrics
from pdfleet.controller import Controller, PassResult
from pdfleet.kube.informer import Informer, OwnedStore, Projection
from pdfleet.kube.informer import start as informer_threads
from pdfleet.kube.networks import NetworkCache
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo, child_ref, pod_info
from pdfleet.reconcile.plan import OWNED_KINDS

log = logging.getLogger(__name__)

Key = tuple[str, str]

# Work queue priorities, served strictly in this order:
# - URGENT: a watch event of a service the operator already runs (a spec change, a pod turning
#   ready, a deleted child);
# - NEW: a service seen for the first time (created, or listed when the operator starts). Its
#   first pass writes a dozen children, so under a burst of creations these passes wait
#   behind the services already in flight: with one queue in arrival order, the first of
#   1,000 services created at once had its children 6 s in and showed Ready 395 s in, once
#   every later service had its children (docs/benchmarks/scale);
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
    passes in flight, not the CPU, sets how long a queued service waits: with 4 (asyncio's
    default pool on a 2-core node has 6 threads) the operator took 557 s to make 1,000
    services Ready, with 16 it took 422-538 s (docs/benchmarks/scale)."""

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
        Scheduling each request on its own multiplied passes: every pass of a service whose
        KV preflight had failed asked to come back in 60 s, and so did the pass that ran
        then, so each resync started a chain that never ended: 12 minutes after it started,
        the operator of an idle fleet of 1,000 services ran 167 passes a second where the
        resync asks for 17 (docs/benchmarks/scale)."""
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


class ServiceCache:
    """What a pass reads: each InferenceService's body (from kopf's watch) and its children
    and pods (from the operator's informers, pdfleet.kube.informer)."""

    def __init__(self) -> None:
        self.services: dict[Key, dict[str, Any]] = {}
        # Every child kind the operator writes is watched.
        self.children = {kind: OwnedStore(child_projection(kind)) for kind in OWNED_KINDS}
        self.pods: OwnedStore[PodInfo] = OwnedStore(Projection(owner=owner_of, value=pod_info))
        self.networks = NetworkCache()

    def service_event(self, key: Key, event_type: str | None, body: Mapping[str, Any]) -> int:
        """Keep (or, when deleted, drop) the service's body; the priority of the pass it needs:
        NEW for a service not seen before, URGENT for one the operator already runs."""
        priority = URGENT if key in self.services else NEW
        if event_type == "DELETED":
            self.services.pop(key, None)
        else:
            self.services[key] = {
                "apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                "metadata": dict(body["metadata"]), "spec": dict(body.get("spec") or {}),
                "status": dict(body.get("status") or {}),
            }  # fmt: skip
        return priority

    def observed_for(self, key: Key) -> Observed:
        children: dict[tuple[str, str], ChildRef] = {}
        for store in self.children.values():
            for ref in store.owned_by(key):
                children[(ref.kind, ref.name)] = ref
        return Observed(
            children=children, pods=self.pods.owned_by(key), networks=self.networks.names(key[0])
        )

    def fabric_services(self, namespace: str) -> list[Key]:
        """The services of `namespace` whose fabric names Multus networks: those a change of
        its NetworkAttachmentDefinitions concerns. Called from a watch thread: it reads a
        copy of the services."""
        return [
            key
            for key, body in list(self.services.items())
            if key[0] == namespace
            and ((body["spec"].get("kvTransfer") or {}).get("fabric") or {}).get("networks")
        ]

    def informers(
        self,
        api: client.ApiClient,
        namespaces: Sequence[str],
        on_change: Callable[[Key], None],
        on_synced: Callable[[], None],
    ) -> list[Informer[Any]]:
        """One informer per kind and watched namespace (one per kind cluster-wide), and the
        NetworkAttachmentDefinitions' (not counted in `on_synced`: their CRD may be absent)."""
        watched: list[tuple[str, str, OwnedStore[Any]]] = [
            (kind, OWNED_SELECTOR, store) for kind, store in self.children.items()
        ]
        watched.append(("Pod", labels.SERVICE, self.pods))
        scopes: Sequence[str | None] = [*namespaces] if namespaces else [None]

        def on_networks(namespace: str) -> None:
            for key in self.fabric_services(namespace):
                on_change(key)

        return [
            Informer(api, kind, namespace, selector, store, on_change, on_synced)
            for kind, selector, store in watched
            for namespace in scopes
        ] + self.networks.informers(api, scopes, on_networks)


OWNED_SELECTOR = f"{labels.SERVICE},{labels.APP_MANAGED_BY}={labels.FIELD_MANAGER}"


def owner_of(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    service = (meta.get("labels") or {}).get(labels.SERVICE)
    return None if service is None else (str(meta.get("namespace")), str(service))


def child_projection(kind: str) -> Projection[ChildRef]:
    return Projection(owner=owner_of, value=lambda obj: child_ref({**obj, "kind": kind}))


def watch_client(api: client.ApiClient, watches: int) -> client.ApiClient:
    """A client of its own for the watches: each holds a pooled connection for minutes, and
    sharing the writers' pool would leave the passes opening and discarding connections."""
    configuration = copy.deepcopy(api.configuration)
    configuration.connection_pool_maxsize = watches + 2
    return client.ApiClient(configuration)


def register(
    controller: Controller,
    registry: kopf.OperatorRegistry,
    resync_s: float,
    api: client.ApiClient,
    namespaces: Sequence[str] = (),
    passes: int = WorkQueue.workers,
) -> None:
    """Register every handler on `registry`, bound to `controller`; children and pods are
    watched through `api` in `namespaces` (all when empty); up to `passes` run at once."""
    cache = ServiceCache()
    stop = threading.Event()
    tasks: list[asyncio.Task[None]] = []

    def reconcile_key(key: Key) -> PassResult | None:
        body = cache.services.get(key)
        if body is None:
            controller.forget(*key)
            return None
        return controller.reconcile(body, cache.observed_for(key))

    queue = WorkQueue(run=reconcile_key, workers=passes)

    # The handler is a coroutine on purpose: kopf runs plain functions in its thread pool,
    # which costs a thread hop per watch event and would call the asyncio work queue from
    # another thread (not safe, and it does not wake the event loop).
    @kopf.on.event(labels.GROUP, labels.VERSION, labels.PLURAL, registry=registry)
    async def isvc_event(
        event: Mapping[str, Any], namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        key = (str(namespace), name)
        queue.put(key, cache.service_event(key, event.get("type"), body))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has no default login handlers: the pod's ServiceAccount in a
        # cluster, else $KUBECONFIG (read now, after `--kubeconfig` has set it).
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def start(**_: Any) -> None:
        loop = asyncio.get_running_loop()

        scopes = max(1, len(namespaces))
        watches = (len(cache.children) + 1) * scopes
        synced = CountDown(watches)

        # Both are called from the informers' threads.
        def on_change(key: Key) -> None:
            loop.call_soon_threadsafe(queue.put, key)

        def on_synced() -> None:
            loop.call_soon_threadsafe(synced.count)

        # And one watch per scope for the NetworkAttachmentDefinitions.
        client_ = watch_client(api, watches + scopes)
        informers = cache.informers(client_, namespaces, on_change, on_synced)
        informer_threads(informers, stop)
        tasks.append(asyncio.create_task(_serve(queue, cache, synced.done, resync_s)))

    @kopf.on.cleanup(registry=registry)
    async def stop_all(**_: Any) -> None:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await queue.stop()


@dataclass
class CountDown:
    """Set `done` after `remaining` calls of `count` (the informers' first listings)."""

    remaining: int
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def count(self) -> None:
        self.remaining -= 1
        if self.remaining <= 0:
            self.done.set()


async def _serve(
    queue: WorkQueue, cache: ServiceCache, synced: asyncio.Event, interval_s: float
) -> None:
    """Start the passes once the children are known, then resync every service periodically
    (a level-based safety net for missed events). A pass before the first listings end would
    take a listed-later child for a missing one and write it again."""
    await synced.wait()
    children = sum(len(store) for store in cache.children.values())
    log.info("listed %d children and %d pods; reconciling", children, len(cache.pods))
    queue.start()
    await _resync(queue, cache.services, interval_s)


async def _resync(
    queue: WorkQueue,
    services: Mapping[Key, Any],
    interval_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Every service once per interval, spread evenly across it. A sweep of a large fleet
    queued at once would keep every worker busy for a while each interval, and a spec change
    arriving then would wait behind it for the GIL (p99 latency, docs/benchmarks/scale)."""
    while True:
        keys = list(services)
        if not keys:
            await sleep(interval_s)
        for key in keys:
            await sleep(interval_s / len(keys))
            queue.put(key, RESYNC)
