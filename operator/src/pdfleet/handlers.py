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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from pdfleet import labels
from pdfleet.controller import Controller, PassResult
from pdfleet.kube.informer import Informer, OwnedStore, Projection
from pdfleet.kube.informer import start as informer_threads
from pdfleet.kube.networks import NetworkCache
from pdfleet.kube.workqueue import NEW, RESYNC, URGENT, Key, WorkQueue
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo, child_ref, pod_info
from pdfleet.reconcile.plan import OWNED_KINDS

log = logging.getLogger(__name__)


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
