"""The thin kopf shell: watches feed in-memory indexes and a work queue; one reconcile() runs.

Every trigger lands in the same place, `Controller.reconcile()`:
- the InferenceService's own events (created, changed, and the initial listing when the
  operator starts, i.e. resume), through `on.event`;
- events of its children and pods (a pod became ready, someone deleted a StatefulSet);
- a periodic resync of every service.

Low-level `on.event` handlers are used instead of kopf's on.create/on.update/on.resume because
those keep per-object bookkeeping in annotations on the user's object: that would be a write
per change and per restart, which neither GitOps tools nor a 1,000-service cluster want.
Children are observed through kopf indexes, so a pass costs no API reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from pdfleet import labels
from pdfleet.controller import Controller, PassResult
from pdfleet.kube.api import KINDS
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo, child_ref, pod_info
from pdfleet.reconcile.plan import OWNED_KINDS

log = logging.getLogger(__name__)

Key = tuple[str, str]

# Every child kind the operator writes is watched into an index.
CHILD_RESOURCES: dict[str, tuple[str, str, str]] = {
    kind: (KINDS[kind].group, KINDS[kind].version, KINDS[kind].plural) for kind in OWNED_KINDS
}
OWNED: dict[str, Any] = {labels.SERVICE: kopf.PRESENT, labels.APP_MANAGED_BY: labels.FIELD_MANAGER}


# Work queue priorities: a watch event (a spec change, a pod turning ready) goes ahead of the
# periodic resync, which puts every service in the queue at once; with 1,000 services a
# change that arrived just after a resync otherwise waited behind all of them.
URGENT, RESYNC = 0, 1


@dataclass
class WorkQueue:
    """Coalescing priority queue of services to reconcile: a burst of pod events is one pass,
    and event-triggered passes go before resync passes."""

    run: Callable[[Key], Any]
    workers: int = 4
    _queue: asyncio.PriorityQueue[tuple[int, int, Key]] = field(
        default_factory=asyncio.PriorityQueue
    )
    _queued: dict[Key, int] = field(default_factory=dict)
    _seq: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def put(self, key: Key, priority: int = URGENT) -> None:
        """Queue `key` once; a queued resync entry is promoted by an urgent put."""
        if self._queued.get(key, priority + 1) <= priority:
            return
        self._queued[key] = priority
        self._seq += 1  # FIFO within a priority
        self._queue.put_nowait((priority, self._seq, key))

    def next_key(self, entry: tuple[int, int, Key]) -> Key | None:
        """The key to run for a dequeued entry; None for the stale copy of a promoted key."""
        priority, _, key = entry
        if self._queued.get(key) != priority:
            return None
        del self._queued[key]
        return key

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self.workers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            key = self.next_key(await self._queue.get())
            if key is None:
                continue
            try:
                result = await asyncio.to_thread(self.run, key)
                # A pass can ask to come back soon (a drain waiting on in-flight requests).
                delay = getattr(result, "requeue_after_s", None)
                if delay:
                    asyncio.get_running_loop().call_later(delay, self.put, key)
            except Exception as error:  # one bad object must never stop the others
                delay, expected = retry_after(error)
                if expected:
                    log.warning("reconcile of %s/%s: %s; retrying in %.0fs", *key, error, delay)
                else:
                    log.exception("reconcile of %s/%s failed; retrying in %.0fs", *key, delay)
                asyncio.get_running_loop().call_later(delay, self.put, key)


RETRY_S = 5.0
MAX_RETRY_AFTER_S = 60.0


def retry_after(error: BaseException) -> tuple[float, bool]:
    """(seconds until the next pass, whether the failure is an expected API answer).

    A 409 (someone wrote the object in between) is retried at once, since the next pass reads
    the newer state; a 429 waits what the API server's Retry-After asks (its priority and
    fairness sets it), within bounds. Anything else waits a fixed delay and is logged with
    its traceback."""
    status = getattr(error, "status", None)
    if status == 409:
        return 1.0, True
    if status == 429:
        headers = getattr(error, "headers", None) or {}
        try:
            asked = float(headers.get("Retry-After", RETRY_S))
        except (TypeError, ValueError):
            asked = RETRY_S
        return min(max(asked, 1.0), MAX_RETRY_AFTER_S), True
    return RETRY_S, False


def observed_for(key: Key, indices: Mapping[str, Any]) -> Observed:
    children: dict[tuple[str, str], ChildRef] = {}
    for kind in CHILD_RESOURCES:
        for ref in indices[index_name(kind)].get(key, ()):
            children[(ref.kind, ref.name)] = ref
    pods: Iterable[PodInfo] = indices["pods_index"].get(key, ())
    return Observed(children=children, pods=tuple(pods))


def index_name(kind: str) -> str:
    return f"{kind.lower()}_index"


def register(controller: Controller, registry: kopf.OperatorRegistry, resync_s: float) -> None:
    """Register every handler on `registry`, bound to `controller`."""
    state: dict[str, Any] = {}

    def reconcile_key(key: Key) -> PassResult | None:
        indices = state["indices"]
        bodies = list(indices["isvc_index"].get(key, ()))
        if not bodies:
            controller.forget(*key)
            return None
        return controller.reconcile(bodies[0], observed_for(key, indices))

    queue = WorkQueue(run=reconcile_key)
    # kopf calls on.event handlers only once every index has taken in its kind's initial
    # listing; the first call therefore tells the resync that the indexes are whole. Without
    # it, a resync due while a restart still lists thousands of children (minutes at 1,000
    # services) ran passes that saw a service's Services as missing, re-applied them, and
    # recorded Created Events and status writes for unchanged services.
    indexed = asyncio.Event()

    def owner_key(namespace: str | None, meta_labels: Mapping[str, str]) -> Key:
        return str(namespace), str(meta_labels[labels.SERVICE])

    # Index and trigger functions are coroutines on purpose: kopf runs plain functions in its
    # thread pool, which cost a thread hop per watch event (thousands with 1,000 services) and
    # would call the asyncio work queue from another thread, which is not safe and does not
    # wake the event loop (a spec change then waited for unrelated I/O before its pass began).
    @kopf.index(labels.GROUP, labels.VERSION, labels.PLURAL, id="isvc_index", registry=registry)
    async def isvc_index(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[Key, dict[str, Any]]:
        return {(str(namespace), name): {
            "apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": dict(body.metadata), "spec": dict(body.spec),
            "status": dict(body.status),
        }}  # fmt: skip

    for kind, (group, version, plural) in CHILD_RESOURCES.items():

        async def child_index(
            namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
        ) -> dict[Key, ChildRef]:
            return {owner_key(namespace, labels): child_ref({**body, "kind": body.get("kind")})}

        child_index.__name__ = index_name(kind)
        kopf.index(group, version, plural, labels=OWNED, id=index_name(kind), registry=registry)(
            child_index
        )
        kopf.on.event(
            group, version, plural, labels=OWNED, id=f"{kind.lower()}_event", registry=registry
        )(_trigger_owner(queue, owner_key, indexed))

    @kopf.index(
        "", "v1", "pods", labels={labels.SERVICE: kopf.PRESENT}, id="pods_index", registry=registry
    )
    async def pods_index(
        namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
    ) -> dict[Key, PodInfo]:
        return {owner_key(namespace, labels): pod_info(body)}

    kopf.on.event(
        "", "v1", "pods", labels={labels.SERVICE: kopf.PRESENT}, id="pod_event", registry=registry
    )(_trigger_owner(queue, owner_key, indexed))

    @kopf.on.event(labels.GROUP, labels.VERSION, labels.PLURAL, registry=registry)
    async def isvc_event(namespace: str | None, name: str, **_: Any) -> None:
        indexed.set()
        queue.put((str(namespace), name))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has no default login handlers: the pod's ServiceAccount in a
        # cluster, else $KUBECONFIG (read now, after `--kubeconfig` has set it).
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def start(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        state["indices"] = {key: value for key, value in kwargs.items() if key.endswith("_index")}
        queue.start()
        state["resync"] = asyncio.create_task(_resync(queue, state["indices"], resync_s, indexed))

    @kopf.on.cleanup(registry=registry)
    async def stop(**_: Any) -> None:
        state["resync"].cancel()
        await queue.stop()


def _trigger_owner(
    queue: WorkQueue,
    owner_key: Callable[[str | None, Mapping[str, str]], Key],
    indexed: asyncio.Event,
) -> Callable[..., Awaitable[None]]:
    async def trigger(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        indexed.set()
        queue.put(owner_key(namespace, labels))

    return trigger


async def _resync(
    queue: WorkQueue, indices: Mapping[str, Any], interval_s: float, indexed: asyncio.Event
) -> None:
    """Reconcile every service periodically: level-based safety net for missed events. The
    first sweep waits until kopf has filled every index (`indexed`): a pass on a partial
    index would take a listed-later child for a missing one."""
    await indexed.wait()
    while True:
        await asyncio.sleep(interval_s)
        for key in list(indices["isvc_index"].keys()):
            queue.put(key, RESYNC)
