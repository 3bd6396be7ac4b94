"""List-then-watch caches of the objects each InferenceService owns, grouped by service.

The operator plans every pass from these caches, so a pass costs no API reads. They replace
kopf indexes: kopf holds all handlers until every index has taken in its initial listing, and
tracks that with one readiness toggle per listed object in a set whose every change wakes
every waiter, so a restart next to a large fleet costs CPU and memory that grow with the
square of its children and pods (docs/benchmarks/scale). Here each kind is one thread and
one `synced` flag.

`OwnedStore` is the pure part (unit-tested); `Informer` is the thin I/O loop around it, in the
manner of client-go's reflector: list in pages, then watch from the listing's
resourceVersion with bookmarks, and list again when the watch falls out of the API server's
window (410 Gone) or the connection breaks.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes import client

from pdfleet import metrics
from pdfleet.kube.api import KINDS, send

log = logging.getLogger(__name__)

OwnerKey = tuple[str, str]
"""(namespace, name) of the owning InferenceService."""
ObjectKey = tuple[str, str]
"""(namespace, name) of a cached object."""

V = TypeVar("V")

# Small pages: a page of whole objects (a StatefulSet with its pod template is tens of KB
# once parsed) is garbage once projected, and every kind lists at once at start.
PAGE_SIZE = 100
WATCH_TIMEOUT_S = 300
# The API server sends a bookmark about once a minute, so a silent socket for longer than
# this is dead (a node or a load balancer dropped it without a reset).
READ_TIMEOUT_S = WATCH_TIMEOUT_S + 30
RETRY_S = 2.0
MAX_RETRY_S = 30.0


class WatchExpiredError(Exception):
    """The watch's resourceVersion has left the API server's window: list again."""


@dataclass(frozen=True)
class Projection(Generic[V]):
    """How to cache one kind: its owner key and the small value kept per object (None for an
    object that carries no owner, e.g. a missing label)."""

    owner: Callable[[Mapping[str, Any]], OwnerKey | None]
    value: Callable[[Mapping[str, Any]], V]


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name"))


class OwnedStore(Generic[V]):
    """Projected objects by owner, safe to read from the reconcile threads while the watch
    thread writes. Every mutation answers which owners' views changed, so an event that
    changes nothing a pass reads (a pod's status heartbeat) triggers no pass."""

    def __init__(self, projection: Projection[V]):
        self.projection = projection
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, tuple[OwnerKey, V]] = {}
        self._by_owner: dict[OwnerKey, dict[ObjectKey, V]] = {}

    def owned_by(self, owner: OwnerKey) -> tuple[V, ...]:
        with self._lock:
            return tuple(self._by_owner.get(owner, {}).values())

    def owners(self) -> set[OwnerKey]:
        with self._lock:
            return set(self._by_owner)

    def __len__(self) -> int:
        return len(self._objects)

    def upsert(self, obj: Mapping[str, Any]) -> set[OwnerKey]:
        owner = self.projection.owner(obj)
        if owner is None:  # lost its owner label: it is no one's any more
            return self.remove(obj)
        key, value = object_key(obj), self.projection.value(obj)
        with self._lock:
            return self._put(key, owner, value)

    def remove(self, obj: Mapping[str, Any]) -> set[OwnerKey]:
        with self._lock:
            return self._drop(object_key(obj))

    def replace(
        self, objects: Iterable[Mapping[str, Any]], namespace: str | None = None
    ) -> set[OwnerKey]:
        """Take a fresh listing of `namespace` (None: the cluster) as the whole truth there;
        objects of it not in the listing were deleted. Other namespaces' objects stay: one
        store serves the informers of every watched namespace."""
        return self.replace_projected(self.project(objects), namespace)

    def project(self, objects: Iterable[Mapping[str, Any]]) -> dict[ObjectKey, tuple[OwnerKey, V]]:
        """What the store would keep of `objects`: a listing is projected page by page, so
        the whole listing is never in memory at once."""
        projected: dict[ObjectKey, tuple[OwnerKey, V]] = {}
        for obj in objects:
            owner = self.projection.owner(obj)
            if owner is not None:
                projected[object_key(obj)] = (owner, self.projection.value(obj))
        return projected

    def replace_projected(
        self, fresh: Mapping[ObjectKey, tuple[OwnerKey, V]], namespace: str | None = None
    ) -> set[OwnerKey]:
        changed: set[OwnerKey] = set()
        with self._lock:
            gone = [
                key for key in self._objects if key not in fresh and namespace in (None, key[0])
            ]
            for key in gone:
                changed |= self._drop(key)
            for key, (owner, value) in fresh.items():
                changed |= self._put(key, owner, value)
        return changed

    def _put(self, key: ObjectKey, owner: OwnerKey, value: V) -> set[OwnerKey]:
        previous = self._objects.get(key)
        if previous == (owner, value):
            return set()
        changed = self._drop(key) if previous is not None and previous[0] != owner else set()
        self._objects[key] = (owner, value)
        self._by_owner.setdefault(owner, {})[key] = value
        return changed | {owner}

    def _drop(self, key: ObjectKey) -> set[OwnerKey]:
        previous = self._objects.pop(key, None)
        if previous is None:
            return set()
        owner = previous[0]
        siblings = self._by_owner.get(owner, {})
        siblings.pop(key, None)
        if not siblings:
            self._by_owner.pop(owner, None)
        return {owner}


def apply_event(store: OwnedStore[Any], event: Mapping[str, Any]) -> tuple[set[OwnerKey], str]:
    """Apply one watch event; answer the owners it changed and the resourceVersion to resume
    from. Raises WatchExpiredError for the API server's 410 (an ERROR event)."""
    kind, obj = event.get("type"), event.get("object") or {}
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise WatchExpiredError(str(obj.get("message") or "resourceVersion too old"))
        raise RuntimeError(f"watch error: {obj.get('message') or obj}")
    if kind in ("ADDED", "MODIFIED"):
        return store.upsert(obj), version
    if kind == "DELETED":
        return store.remove(obj), version
    return set(), version  # BOOKMARK: only the resourceVersion moves


def json_lines(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Watch events from a chunked response: one JSON document per line, lines split
    anywhere across chunks."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


class Informer(Generic[V]):
    """One kind in one namespace (None: across the cluster), kept in `store`.

    Both callbacks run in this informer's thread: `on_change` with each owner whose view
    changed after the first listing (that listing is what passes start from, not a change),
    `on_synced` once that listing is in the store.
    """

    def __init__(
        self,
        api: client.ApiClient,
        kind: str,
        namespace: str | None,
        label_selector: str,
        store: OwnedStore[V],
        on_change: Callable[[OwnerKey], None],
        on_synced: Callable[[], None] = lambda: None,
    ):
        self.api, self.kind, self.namespace = api, kind, namespace
        self.path = KINDS[kind].collection(namespace)
        self.label_selector = label_selector
        self.store = store
        self.on_change, self.on_synced = on_change, on_synced
        self.synced = False

    def run(self, stop: threading.Event) -> None:
        """List and watch until `stop`; errors are logged and retried with backoff, never
        raised (one flaky connection must not take the operator down)."""
        delay = RETRY_S
        while not stop.is_set():
            try:
                version = self.sync()
                delay = RETRY_S
                while not stop.is_set():
                    version = self.watch(version)
            except WatchExpiredError as gone:
                log.info("%s watch expired (%s); listing again", self.kind, gone)
            except Exception as error:
                log.warning("%s watch failed: %s; listing again in %.0fs", self.kind, error, delay)
                stop.wait(delay)
                delay = min(delay * 2, MAX_RETRY_S)

    def sync(self) -> str:
        """List every object in pages into the store; the listing's resourceVersion."""
        fresh: dict[ObjectKey, tuple[OwnerKey, V]] = {}
        token = ""
        while True:
            query = [("labelSelector", self.label_selector), ("limit", PAGE_SIZE)]
            page = self._get(query + ([("continue", token)] if token else []))
            items = page.get("items") or ()
            # List items carry no kind; the projections read it.
            fresh |= self.store.project({**item, "kind": self.kind} for item in items)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                break
        changed = self.store.replace_projected(fresh, self.namespace)
        metrics.WATCH_LISTS.labels(kind=self.kind).inc()
        metrics.WATCHED_OBJECTS.labels(kind=self.kind).set(len(self.store))
        if self.synced:
            self._notify(changed)
        else:
            self.synced = True
            self.on_synced()
        return str(meta.get("resourceVersion") or "")

    def watch(self, version: str) -> str:
        """Follow the watch from `version` until the server ends it; the version to go on
        from."""
        query = [
            ("labelSelector", self.label_selector),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", WATCH_TIMEOUT_S),
        ]
        response = self._open(query)
        try:
            for event in json_lines(response.stream(64 * 1024)):
                changed, seen = apply_event(self.store, event)
                version = seen or version
                self._notify(changed)
            metrics.WATCHED_OBJECTS.labels(kind=self.kind).set(len(self.store))
        finally:
            response.release_conn()
        return version

    def _notify(self, owners: Iterable[OwnerKey]) -> None:
        for owner in owners:
            self.on_change(owner)

    def _open(self, query: list[tuple[str, Any]]) -> Any:
        response = send(self.api, "GET", self.path, query, timeout=(10, READ_TIMEOUT_S)).response
        if response.status == 410:
            response.release_conn()
            raise WatchExpiredError("resourceVersion too old")
        if not 200 <= response.status <= 299:
            body = response.read().decode(errors="replace")
            response.release_conn()
            raise client.ApiException(status=response.status, reason=body[:500])
        return response

    def _get(self, query: list[tuple[str, Any]]) -> dict[str, Any]:
        response = self._open(query)
        try:
            loaded: dict[str, Any] = json.loads(response.read())
        finally:
            response.release_conn()
        return loaded


def start(informers: Iterable[Informer[Any]], stop: threading.Event) -> list[threading.Thread]:
    """Run each informer in its own daemon thread (a watch blocks on its socket)."""
    threads = [
        threading.Thread(target=i.run, args=(stop,), name=f"watch-{i.kind}", daemon=True)
        for i in informers
    ]
    for thread in threads:
        thread.start()
    return threads
