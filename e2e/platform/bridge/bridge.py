"""``Bridge``: the watch on the pods it owns, the API calls, one ``PodWorker`` per pod.

Where it fits: pytest fixtures and the fleet helpers use ``Bridge`` (or ``running``) as a
context manager, the command line (``__main__``) runs one until a signal; it starts a worker
(``worker``) for each owned pod on a kwok node and serves the workers' reads and writes of
nodes, pods, Secrets and ConfigMaps, and the Services (their EndpointSlices) a container names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.platform.bridge.commands import StartError, select_runner, service_endpoint
from e2e.platform.bridge.environment import Lookup
from e2e.platform.bridge.pods import Manifest, is_kwok_node, pod_key
from e2e.platform.bridge.settings import BridgeSettings
from e2e.platform.bridge.worker import PodWorker

log = logging.getLogger("pdfleet.bridge")


@dataclass(frozen=True)
class PodProcess:
    """What tests see of a running pod: its IP, main process and files."""

    pod_ip: str
    pid: int | None
    log_path: Path
    events_path: Path
    timeline: Mapping[str, float]


class Bridge:
    """Watches the pods it owns and plays kubelet for those on kwok nodes.

    ``with Bridge(settings) as bridge: ...`` starts the watch and stops every process on
    exit (the pods themselves are left as they are, as when a kubelet stops).
    """

    def __init__(self, settings: BridgeSettings, api_client: Any = None) -> None:
        from kubernetes import client, config

        self.settings = settings
        self.api = api_client or config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(settings.kubeconfig)
        )
        self.core = client.CoreV1Api(self.api)
        self.discovery = client.DiscoveryV1Api(self.api)
        self._workers: dict[str, PodWorker] = {}
        self._finished: dict[str, PodWorker] = {}
        self._failed: set[str] = set()  # uids whose worker crashed: not retried
        self._ignored: set[str] = set()  # uids with a container no rule maps to a runner
        self._nodes: dict[str, Manifest] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, name="bridge-watch", daemon=True)
        self.synced = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Bridge:
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self._watcher.start()
        if not self.synced.wait(30):
            raise TimeoutError("bridge: first pod list did not complete in 30s")
        return self

    def stop(self) -> None:
        """Stop watching and kill every process (SIGTERM, then SIGKILL after 2 s)."""
        self._stop.set()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.join(15)
        self._watcher.join(2)

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries for tests and the CLI ----------------------------------------------------

    def process(self, namespace: str, name: str) -> PodProcess | None:
        """The live (or last finished) pod of that name, None if never seen."""
        key = f"{namespace}/{name}"
        with self._lock:
            worker = self._workers_by_key().get(key) or self._finished.get(key)
        if worker is None or not worker.containers:
            return None
        main = worker.containers[0]
        return PodProcess(
            pod_ip=worker.pod_ip,
            pid=main.popen.pid if main.popen is not None else None,
            log_path=main.log_path,
            events_path=main.events_path,
            timeline=dict(worker.timeline),
        )

    def stop_container(self, namespace: str, name: str) -> None:
        """Stop the pod's main container as kubelet does for a restart (see
        ``PodWorker.stop_main_container``): the way to SIGTERM an engine mid-request
        without its liveness probe killing it while it drains."""
        with self._lock:
            worker = self._workers_by_key().get(f"{namespace}/{name}")
        if worker is None:
            raise LookupError(f"no live pod {namespace}/{name}")
        worker.stop_main_container()

    def _workers_by_key(self) -> dict[str, PodWorker]:
        return {w.key: w for w in self._workers.values()}

    # -- API helpers used by pod workers ---------------------------------------------------

    def node(self, name: str) -> Manifest:
        with self._lock:
            cached = self._nodes.get(name)
        if cached is not None:
            return cached
        resp: Any = self.core.read_node(name, _preload_content=False)
        node: Manifest = json.loads(resp.data)
        with self._lock:
            self._nodes[name] = node
        return node

    def pod_ips_on(self, node_name: str) -> set[str]:
        """Every pod IP on a node (all pods, not only the bridge's), for allocation."""
        resp: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}", _preload_content=False
        )
        ips: set[str] = set()
        for pod in json.loads(resp.data).get("items", []):
            status = pod.get("status", {})
            ips.update(str(p["ip"]) for p in status.get("podIPs") or [])
            if status.get("podIP"):
                ips.add(str(status["podIP"]))
        return ips

    def lookup(self, pod: Mapping[str, Any]) -> Lookup:
        namespace = str(pod["metadata"]["namespace"])

        def read(kind: str, name: str) -> Mapping[str, str] | None:
            from kubernetes.client.exceptions import ApiException

            try:
                if kind == "secret":
                    import base64

                    secret = self.core.read_namespaced_secret(name, namespace)
                    data = secret.data or {}
                    return {k: base64.b64decode(v).decode() for k, v in data.items()}
                return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
            except ApiException as err:
                if err.status == 404:
                    return None
                raise

        return read

    def resolve_service(
        self,
        namespace: str,
        name: str,
        port: int,
        *,
        wait_s: float,
        abandoned: Callable[[], bool] = lambda: False,
    ) -> tuple[str, int]:
        """An endpoint ``(address, port)`` of Service ``namespace/name`` for its port ``port``
        (``commands.service_endpoint``: ready first, else not ready), what cluster DNS and
        kube-proxy would connect to. The Service may have none yet: the activator's pod is
        created with the router's, whose IP, then EndpointSlice, come a moment later. So this
        looks again every half second for ``wait_s``, or until ``abandoned()``, then raises
        StartError with the last reason."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return service_endpoint(
                    namespace,
                    name,
                    self._read_service(namespace, name),
                    self._endpoint_slices(namespace, name),
                    port,
                )
            except StartError as err:
                reason = str(err)
            except Exception as err:  # the API server restarting, ...: look again
                reason = f"Service {namespace}/{name}: {err}"
            if abandoned():
                raise StartError(f"{reason} (the pod is going away)")
            if time.monotonic() >= deadline:
                raise StartError(f"{reason} after {wait_s:g}s")
            time.sleep(0.5)

    def _read_service(self, namespace: str, name: str) -> Manifest | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp: Any = self.core.read_namespaced_service(name, namespace, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        service: Manifest = json.loads(resp.data)
        return service

    def _endpoint_slices(self, namespace: str, name: str) -> list[Manifest]:
        resp: Any = self.discovery.list_namespaced_endpoint_slice(
            namespace,
            label_selector=f"kubernetes.io/service-name={name}",
            _preload_content=False,
        )
        items: list[Manifest] = json.loads(resp.data).get("items", [])
        return items

    def patch_status(self, pod: Mapping[str, Any], body: Manifest) -> bool:
        """Patch ``pods/status``; False when the pod changed (conflict) or is gone."""
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"],
                meta["namespace"],
                body,
                _content_type="application/strategic-merge-patch+json",
            )
        except ApiException as err:
            if err.status in (404, 409, 422):
                log.debug("%s: status patch refused (%s)", pod_key(pod), err.status)
                return False
            raise
        return True

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        """Remove the pod object now (kubelet's final delete), only if it is still this uid."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], body=options, grace_period_seconds=0
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def failed(self, worker: PodWorker) -> None:
        with self._lock:
            self._failed.add(worker.uid)

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]
            self._finished[worker.key] = worker

    # -- the watch -------------------------------------------------------------------------

    def _list_pods(self, **kwargs: Any) -> Any:
        if self.settings.namespace:
            return self.core.list_namespaced_pod(self.settings.namespace, **kwargs)
        return self.core.list_pod_for_all_namespaces(**kwargs)

    def _watch_loop(self) -> None:
        from kubernetes import watch

        selector = self.settings.owned_label
        while not self._stop.is_set():
            try:
                resp = self._list_pods(label_selector=selector, _preload_content=False)
                listing = json.loads(resp.data)
                version = listing["metadata"]["resourceVersion"]
                live = {p["metadata"]["uid"] for p in listing.get("items", [])}
                for pod in listing.get("items", []):
                    self._observe("ADDED", pod)
                with self._lock:
                    vanished = [w for uid, w in self._workers.items() if uid not in live]
                for w in vanished:
                    w.gone.set()
                    w.changed.set()
                self.synced.set()
                while not self._stop.is_set():
                    stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                        self._list_pods,
                        label_selector=selector,
                        resource_version=version,
                        timeout_seconds=10,
                        allow_watch_bookmarks=True,
                    )
                    for event in stream:
                        obj = event["raw_object"]
                        if event["type"] == "ERROR":
                            raise RuntimeError(f"watch error: {obj}")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._observe(str(event["type"]), obj)
                        if self._stop.is_set():
                            break
            except Exception as err:  # relist: expired version, API restart, ...
                if self._stop.is_set():
                    break
                log.warning("pod watch restarting: %s", err)
                time.sleep(0.5)

    def _observe(self, kind: str, pod: Manifest) -> None:
        uid = str(pod["metadata"]["uid"])
        with self._lock:
            worker = self._workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.update(pod)
                worker.gone.set()
                worker.changed.set()
            return
        if worker is not None:
            worker.update(pod)
            return
        node_name = pod.get("spec", {}).get("nodeName")
        if not node_name or self._stop.is_set():
            return  # not scheduled yet
        terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if terminal and not pod["metadata"].get("deletionTimestamp"):
            return
        with self._lock:
            if uid in self._failed or uid in self._ignored:
                return
        try:
            if not is_kwok_node(self.node(str(node_name))):
                return
        except Exception as err:
            log.warning("%s: cannot read node %s: %s", pod_key(pod), node_name, err)
            return
        unknown = [
            str(c.get("name"))
            for c in pod["spec"].get("containers") or []
            if select_runner(pod, c, self.settings.rules) is None
        ]
        if unknown:
            # Like an image kubelet cannot pull: left as kwok reported it (ContainerCreating).
            log.warning("%s: no runner for container(s) %s; not run", pod_key(pod), unknown)
            with self._lock:
                self._ignored.add(uid)
            return
        worker = PodWorker(self, pod)
        with self._lock:
            if self._stop.is_set() or uid in self._workers:
                return
            self._workers[uid] = worker
        worker.start()


@contextlib.contextmanager
def running(settings: BridgeSettings) -> Iterator[Bridge]:
    """A started bridge, stopped on exit (for pytest fixtures)."""
    bridge = Bridge(settings).start()
    try:
        yield bridge
    finally:
        bridge.stop()
