"""One service's dead dependency costs that service, not the fleet.

A Prometheus that accepts connections and never answers is the worst case for an operator
that reads it inside its passes: each read waits out its timeouts while the pass holds the
service. Here one autoscaled service points at such a Prometheus (a loopback listener that
never writes a byte) while other services are created and changed; their latency, from the
spec change to the StatefulSet carrying it (watched), must stay at the level of the same
changes without the stuck service, and within the scale benchmark's p99 target (1 s).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.benchmarks.bench_scale import Watched, template_image
from e2e.platform.cluster import Cluster
from e2e.platform.operator_process import OperatorProcess
from e2e.platform.stats import percentile
from pdfleet import labels
from tests.integration.cluster.kube_helpers import (
    condition,
    create_isvc,
    get_isvc,
    patch_isvc,
    wait_for,
)
from tests.spec_cases import merge_patch, sample

SERVICES = 50
# As many as the scale benchmark makes: p99 is then the second slowest, not the slowest.
CHANGES = 100
P99_LIMIT_S = 1.0


@contextlib.contextmanager
def silent_prometheus() -> Iterator[str]:
    """A loopback listener that accepts every connection, reads, and never answers."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def _service(name: str) -> dict[str, Any]:
    body: dict[str, Any] = merge_patch(sample("minimal"), {"metadata": {"name": name}})
    return body


def _stuck(name: str, prometheus_url: str) -> dict[str, Any]:
    autoscaled = {
        "metadata": {"name": name},
        "spec": {
            "slo": {"ttft": {"target": "1s"}, "itl": {"target": "50ms"}},
            "autoscaling": {
                "enabled": True,
                "gpuBudget": 8,
                "interval": "5s",
                "prometheus": {"url": prometheus_url},
            },
        },
    }
    body: dict[str, Any] = merge_patch(sample("minimal"), autoscaled)
    return body


def _change_latencies(api_client: Any, namespace: str, names: list[str], tag: str) -> list[float]:
    """Seconds from each of CHANGES image changes (one at a time, the services in turn) to
    its decode StatefulSet carrying it."""
    apps = client.AppsV1Api(api_client)
    stss = Watched(
        apps.list_namespaced_stateful_set,
        template_image,
        namespace,
        label_selector=f"{labels.ROLE}=decode",
    )
    stss.start()
    try:
        stss.wait(lambda w: len(w.values) >= len(names), 120, "decode StatefulSets listed")
        latencies = []
        for i in range(CHANGES):
            name = names[i % len(names)]
            image = f"registry.example/pdfleet-worker:{tag}-{i}"
            started = time.monotonic()
            patch_isvc(api_client, namespace, name, {"spec": {"engine": {"image": image}}})
            key = (namespace, f"{name}-decode")

            def carries(w: Watched, key: tuple[str, str] = key, image: str = image) -> bool:
                return bool(w.values.get(key) == image)

            done = stss.wait(carries, 60, f"{key} image")
            latencies.append(done - started)
        return latencies
    finally:
        stss.stop()


def _first_status_s(api_client: Any, namespace: str, names: list[str]) -> list[float]:
    """Create the services one after another; seconds from each create to its first status
    (observedGeneration): until then kstatus reads a custom resource as Current."""
    custom = client.CustomObjectsApi(api_client)
    statuses = Watched(
        custom.list_namespaced_custom_object,
        lambda obj: (obj.get("status") or {}).get("observedGeneration"),
        labels.GROUP,
        labels.VERSION,
        namespace,
        labels.PLURAL,
    )
    keys = [(namespace, name) for name in names]
    seen: dict[tuple[str, str], float] = {}

    def note_first_statuses() -> None:
        deadline = time.monotonic() + 120
        with statuses.changed:
            while len(seen) < len(keys) and time.monotonic() < deadline:
                for key in keys:
                    if key not in seen and statuses.values.get(key):
                        seen[key] = time.monotonic()
                statuses.changed.wait(1.0)

    statuses.start()
    noter = threading.Thread(target=note_first_statuses, daemon=True)
    noter.start()
    try:
        created = {}
        for key in keys:
            create_isvc(api_client, namespace, _service(key[1]))
            created[key] = time.monotonic()
        noter.join(130)
        assert len(seen) == len(keys), f"first statuses: {len(seen)} of {len(keys)}"
        return [seen[key] - created[key] for key in keys]
    finally:
        statuses.stop()


def _last_decision(api_client: Any, namespace: str) -> str:
    status = get_isvc(api_client, namespace, "stuck").get("status") or {}
    return str((status.get("autoscaler") or {}).get("lastDecisionTime", ""))


@pytest.fixture
def operator(cluster: Cluster, crds: list[str], tmp_path: Path) -> Iterator[OperatorProcess]:
    with OperatorProcess(cluster.kubeconfig, tmp_path / "operator.log").serving() as proc:
        yield proc


def test_a_prometheus_that_never_answers_slows_no_other_service(
    api_client: Any, namespace: str, operator: OperatorProcess
) -> None:
    before = [f"calm-{i}" for i in range(SERVICES // 2)]
    first_alone = _first_status_s(api_client, namespace, before)
    alone = _change_latencies(api_client, namespace, before, "alone")

    with silent_prometheus() as url:
        create_isvc(api_client, namespace, _stuck("stuck", url))

        def gave_up() -> dict[str, Any] | None:
            metrics = condition(get_isvc(api_client, namespace, "stuck"), "MetricsAvailable")
            return metrics if url in metrics.get("message", "") else None

        said = wait_for(gave_up, 60, "the stuck service's MetricsAvailable naming its Prometheus")
        print(f"\nthe stuck service: {said}")
        first = _last_decision(api_client, namespace)
        after = [f"busy-{i}" for i in range(SERVICES - len(before))]
        first_beside = _first_status_s(api_client, namespace, after)
        beside = _change_latencies(api_client, namespace, after, "beside")
        # The stuck service keeps its own pace: a decision (a hold) every interval or so.
        wait_for(lambda: _last_decision(api_client, namespace) > first, 30, "its next hold")

    figures = {
        "first_status_alone_p99_s": percentile(first_alone, 99),
        "first_status_beside_p99_s": percentile(first_beside, 99),
        "alone_p50_s": percentile(alone, 50),
        "alone_p99_s": percentile(alone, 99),
        "beside_p50_s": percentile(beside, 50),
        "beside_p99_s": percentile(beside, 99),
    }
    print(f"\n{len(after)} services created, {CHANGES} spec changes each: {figures}")
    # The bound is the benchmark's target, or the same changes' without the stuck service on a
    # machine too slow for that target.
    assert figures["beside_p99_s"] <= max(P99_LIMIT_S, 1.5 * figures["alone_p99_s"]), figures
    first_status = figures["first_status_beside_p99_s"]
    assert first_status <= max(P99_LIMIT_S, 1.5 * figures["first_status_alone_p99_s"]), figures
