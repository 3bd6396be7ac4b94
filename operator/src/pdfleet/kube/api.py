"""The only code that writes to the API server: server-side apply, delete, status, Events.

A thin layer over the `kubernetes` client's raw REST calls (no discovery round-trips at start:
the kinds pdfleet writes are known). Every write goes out under one field manager.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

from pdfleet import labels
from pdfleet.kube.errors import APIError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResourceKind:
    group_version: str
    plural: str

    @property
    def group(self) -> str:
        return self.group_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.group_version.rpartition("/")[2]

    def collection(self, namespace: str | None) -> str:
        """The collection's path in `namespace`, or across the cluster for None."""
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        scope = f"/namespaces/{namespace}" if namespace is not None else ""
        return f"{prefix}{scope}/{self.plural}"


KINDS: dict[str, ResourceKind] = {
    "ServiceAccount": ResourceKind("v1", "serviceaccounts"),
    "Service": ResourceKind("v1", "services"),
    "ConfigMap": ResourceKind("v1", "configmaps"),
    "Pod": ResourceKind("v1", "pods"),
    "Event": ResourceKind("v1", "events"),
    "PodDisruptionBudget": ResourceKind("policy/v1", "poddisruptionbudgets"),
    "StatefulSet": ResourceKind("apps/v1", "statefulsets"),
    "Deployment": ResourceKind("apps/v1", "deployments"),
    "Role": ResourceKind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ResourceKind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": ResourceKind("networking.k8s.io/v1", "networkpolicies"),
    # Read only: the Multus networks a fabric names (kube/networks.py).
    "NetworkAttachmentDefinition": ResourceKind(
        "k8s.cni.cncf.io/v1", "network-attachment-definitions"
    ),
    labels.KIND: ResourceKind(labels.API_VERSION, labels.PLURAL),
}


# Connections kept to the API server: the passes' status writes (16 passes at once by default,
# kube.workqueue.WorkQueue), their concurrent child writes (controller.WRITES_IN_FLIGHT), the Event
# posters and the lease. The client's default (5 per CPU) would open and discard connections
# on a small node.
POOL_SIZE = 32

# Events are posted beside the passes: a pass that waited for its Events would take longer,
# and while a large fleet converges every queued service would wait that much longer too
# (docs/benchmarks/scale). As client-go's recorder does, a bounded backlog drops new Events
# rather than grow without end.
EVENT_POSTERS = 2
EVENT_BACKLOG = 1000
# An Event repeated (same object, type, reason and message) within this long counts up on the
# one already posted, as client-go's event correlator does, instead of adding another: a
# condition that flaps or a Warning re-sent on a retry stays one line in `kubectl describe`.
EVENT_SERIES_S = 600.0
# Series remembered at once (least recently repeated forgotten first).
EVENT_SERIES_KEPT = 4096


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient from the given kubeconfig, $KUBECONFIG, ~/.kube/config or in-cluster."""
    configuration = client.Configuration()
    loaded = False
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            loaded = True
        except config.ConfigException:
            pass
    if not loaded:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(configuration)


def send(
    api: client.ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, Any]],
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    timeout: tuple[float, float] | None = None,
) -> rest.RESTResponse:
    """One raw request with the client's credentials; the undecoded response (`.response`
    is urllib3's, for streaming). The caller checks the status."""
    method, url, all_headers, payload, post = api.param_serialize(
        method,
        path,
        query_params=query,
        header_params={"Accept": "application/json", **(headers or {})},
        body=body,
        auth_settings=["BearerToken"],
    )
    return api.call_api(method, url, all_headers, payload, post, _request_timeout=timeout)


# Characters that YAML may not carry literally or reads as line breaks (C0 and C1 controls,
# DEL, NEL, the Unicode line and paragraph separators, the byte-order mark, U+FFFE and U+FFFF).
_YAML_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def apply_body(manifest: Mapping[str, Any]) -> bytes:
    """A server-side apply body: JSON, which the API server reads as YAML. ensure_ascii would
    write a character beyond the Basic Multilingual Plane (an emoji in a model name) as a
    surrogate pair, which JSON allows and YAML refuses, so the child would be refused with a
    YAML error naming no field. Here every character goes as UTF-8, except those YAML cannot
    take literally, which go as \\u escapes of the character itself."""
    text = json.dumps(manifest, ensure_ascii=False)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


class KubeWriter:
    """Server-side apply and friends for one field manager."""

    def __init__(self, api: client.ApiClient, field_manager: str = labels.FIELD_MANAGER):
        self.api = api
        self.field_manager = field_manager
        self._events: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=EVENT_BACKLOG)
        self._posters: list[threading.Thread] = []
        self._posters_guard = threading.Lock()
        self._series = EventSeries()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One REST call; raises APIError for any answer but a success. The kubernetes
        client's own exceptions stop here: nothing above pdfleet.kube handles them."""
        headers = {"Content-Type": content_type}
        try:
            response = send(self.api, method, path, query or [], headers, body)
        except ApiException as error:  # the client's own checks, before any answer
            raise APIError(error.status or 0, str(error.reason or ""), str(error.body or ""),
                           dict(error.headers or {})) from error  # fmt: skip
        data: bytes | None = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise APIError(
                response.status,
                str(response.reason or ""),
                data.decode(errors="replace") if data else "",
                dict(response.getheaders() or {}),  # type: ignore[no-untyped-call]
            )
        loaded: dict[str, Any] = json.loads(data) if data else {}
        return loaded

    def apply(
        self, manifest: Mapping[str, Any], namespace: str, dry_run: bool = False
    ) -> dict[str, Any]:
        """Server-side apply; force: pdfleet owns the fields it sets on its children.
        `dry_run`: the API server validates and answers, and persists nothing."""
        kind = KINDS[str(manifest["kind"])]
        name = manifest["metadata"]["name"]
        query = [("fieldManager", self.field_manager), ("force", "true")]
        return self._call(
            "PATCH",
            f"{kind.collection(namespace)}/{name}",
            body=apply_body(manifest),
            query=query + ([("dryRun", "All")] if dry_run else []),
            content_type="application/apply-patch+yaml",
        )

    def delete(self, kind_name: str, name: str, namespace: str) -> None:
        kind = KINDS[kind_name]
        try:
            self._call(
                "DELETE",
                f"{kind.collection(namespace)}/{name}",
                body={"propagationPolicy": "Background"},
            )
        except APIError as error:
            if error.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Replace the whole status in one merge patch on the status subresource. Keys that
        disappeared are nulled so the merge removes them."""
        kind = KINDS[labels.KIND]
        self._call(
            "PATCH",
            f"{kind.collection(namespace)}/{name}/status",
            body={"status": dict(status)},
            query=[("fieldManager", self.field_manager)],
            content_type="application/merge-patch+json",
        )

    def patch_merge(
        self, kind_name: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> None:
        kind = KINDS[kind_name]
        self._call(
            "PATCH",
            f"{kind.collection(namespace)}/{name}",
            body=dict(patch),
            query=[("fieldManager", self.field_manager)],
            content_type="application/merge-patch+json",
        )

    def event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Record a core/v1 Event about an object. It is posted by threads of their own, so
        a pass never waits for it; failures are logged, never raised (an Event must not fail
        a reconcile). When EVENT_BACKLOG are waiting, new ones are dropped and logged."""
        body = event_body(involved, reason, message, type_, self.field_manager)
        try:
            self._events.put_nowait(body)
        except queue.Full:
            log.warning("event backlog full; dropped %s on %s", reason, _involved_name(body))
            return
        with self._posters_guard:
            while len(self._posters) < EVENT_POSTERS:
                poster = threading.Thread(target=self._post_events, name="events", daemon=True)
                poster.start()
                self._posters.append(poster)

    def _post_events(self) -> None:
        while True:
            body = self._events.get()
            try:
                self._record(body)
            except Exception as error:  # a poster outlives any one failure
                log.warning(
                    "could not record event %s on %s: %s",
                    body["reason"], _involved_name(body), getattr(error, "reason", None) or error,
                )  # fmt: skip
            finally:
                self._events.task_done()

    def _record(self, body: dict[str, Any]) -> None:
        """Post the Event, or count it on the one already posted for its series. (Two
        posters that take two Events of one series at once post both: a rare second line,
        not worth serializing every post for.)"""
        collection = KINDS["Event"].collection(body["metadata"]["namespace"])
        key = series_key(body)
        repeat = self._series.repeat(key, time.monotonic())
        if repeat is not None:
            name, count = repeat
            patch = {"count": count, "lastTimestamp": body["lastTimestamp"]}
            try:
                self._call("PATCH", f"{collection}/{name}", body=patch,
                           content_type="application/merge-patch+json")  # fmt: skip
                return
            except APIError as error:
                if error.status != 404:  # an Event past its TTL: a new one below
                    raise
        posted = self._call("POST", collection, body=body)
        self._series.posted(key, str(posted.get("metadata", {}).get("name", "")), time.monotonic())


SeriesKey = tuple[str, str, str, str]


def series_key(body: Mapping[str, Any]) -> SeriesKey:
    """What makes two Events one series: the object (by uid), type, reason and message."""
    involved = body["involvedObject"]
    return (str(involved.get("uid")), body["type"], body["reason"], body["message"])


class EventSeries:
    """Events posted lately, by series: their name, count and when last seen (monotonic)."""

    def __init__(self, window_s: float = EVENT_SERIES_S, kept: int = EVENT_SERIES_KEPT):
        self.window_s, self.kept = window_s, kept
        self._seen: OrderedDict[SeriesKey, tuple[str, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def repeat(self, key: SeriesKey, now: float) -> tuple[str, int] | None:
        """(name, new count) when `key` was posted within the window, counted; else None."""
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or not seen[0] or now - seen[2] > self.window_s:
                return None
            name, count = seen[0], seen[1] + 1
            self._seen[key] = (name, count, now)
            self._seen.move_to_end(key)
            return name, count

    def posted(self, key: SeriesKey, name: str, now: float) -> None:
        with self._lock:
            self._seen[key] = (name, 1, now)
            self._seen.move_to_end(key)
            while len(self._seen) > self.kept:
                self._seen.popitem(last=False)


def _involved_name(event: Mapping[str, Any]) -> str:
    return str(event["involvedObject"]["name"])


def event_body(
    involved: Mapping[str, Any], reason: str, message: str, type_: str, component: str
) -> dict[str, Any]:
    """The core/v1 Event for `involved`, stamped now."""
    meta = involved.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
