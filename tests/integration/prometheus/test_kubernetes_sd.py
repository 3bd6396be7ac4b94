"""Kubernetes service discovery with the scrape job we ship, on the local cluster.

The minimal sample's children (``pdfleet.render.render_children``; no operator) are applied
to a kwok cluster whose pdfleet pods are run by the process bridge on their pod IPs.
Prometheus, configured with ``scrape/kubernetes_sd.yaml`` unchanged but for the kubeconfig,
must find exactly the two worker pods (not the router) at ``podIP:8000``, label them
``namespace``, ``pdfleet_service``, ``pdfleet_role`` and ``pod``, scrape their ``vllm:``
series, and serve the autoscaler a full window once requests have gone through.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from e2e.platform import prometheus
from e2e.platform.bridge import Bridge, BridgeSettings
from e2e.platform.cluster import REPO_ROOT, Cluster, wait_until
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.autoscale import promql
from pdfleet.autoscale.metrics import PrometheusSource
from pdfleet.autoscale.policy import MetricsWindow
from pdfleet.render import render_children

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SERVICE = "llama-8b"  # crds/samples/minimal.yaml
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORKERS = ("prefill", "decode")


@dataclass(frozen=True)
class Discovered:
    namespace: str
    pods: dict[str, dict[str, Any]]  # role -> pod, as the API returns it
    prom: prometheus.Prometheus


def _pods(core: Any, namespace: str) -> dict[str, dict[str, Any]]:
    items = json.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
    return {p["metadata"]["labels"]["pdfleet.dev/role"]: p for p in items}


def _ready(pod: dict[str, Any] | None) -> bool:
    conds = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


@pytest.fixture(scope="module")
def discovered(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Discovered]:
    core = client.CoreV1Api(api_client)
    namespace = f"prom-{uuid.uuid4().hex[:8]}"
    bridge_cluster.create_namespace(namespace)
    tmp = tmp_path_factory.mktemp("prom-sd")
    settings = BridgeSettings(
        kubeconfig=bridge_cluster.kubeconfig,
        log_dir=tmp / "bridge",
        namespace=namespace,
        time_scale=0.1,
        probe_period_max_s=2.0,
    )
    deleted = False
    try:
        with Bridge(settings):
            doc = yaml.safe_load((REPO_ROOT / "crds/samples/minimal.yaml").read_text())
            doc["metadata"]["namespace"] = namespace
            isvc = InferenceService.model_validate(doc)
            bridge_cluster.apply(render_children(isvc, {"prefill": 1, "decode": 1}))
            wait_until(
                lambda: all(_ready(_pods(core, namespace).get(r)) for r in WORKERS),
                120,
                "prefill and decode pods Ready",
            )
            with prometheus.start_for_cluster(
                bridge_cluster, tmp / "prometheus", namespaces=[namespace]
            ) as prom:
                yield Discovered(namespace, _pods(core, namespace), prom)
            # The bridge finalizes the pods (preStop, stop, delete) while it still runs.
            core.delete_namespace(namespace)
            deleted = True
            wait_until(lambda: not core.list_namespaced_pod(namespace).items, 60, "pods gone")
    finally:
        if not deleted:  # a failure above: never leave the namespace in the shared cluster
            core.delete_namespace(namespace)


def test_prometheus_discovers_the_worker_pods_with_the_relabelled_labels(
    discovered: Discovered,
) -> None:
    t0 = time.monotonic()
    targets = discovered.prom.wait_for_targets(2, timeout_s=60)
    print(f"\n[prometheus] Prometheus up -> both pods scraped: {time.monotonic() - t0:.1f}s")
    assert len(discovered.prom.active_targets()) == 2, "the router pod is not scraped"
    by_role = {t["labels"]["pdfleet_role"]: t for t in targets}
    assert set(by_role) == set(WORKERS)
    for role, target in by_role.items():
        pod = discovered.pods[role]
        assert target["labels"] == {
            "instance": f"{pod['status']['podIP']}:8000",
            "job": "pdfleet-workers",
            "namespace": discovered.namespace,
            "pdfleet_service": SERVICE,
            "pdfleet_role": role,
            "pod": pod["metadata"]["name"],
        }
        assert target["scrapeUrl"] == f"http://{pod['status']['podIP']}:8000/metrics"


def test_vllm_series_carry_the_labels_the_promql_selects_on(discovered: Discovered) -> None:
    discovered.prom.wait_for_targets(2, timeout_s=60)
    for role in WORKERS:
        target = promql.RoleSeries(discovered.namespace, SERVICE, role)
        series = discovered.prom.query(target.selector(promql.KV_USAGE))
        assert len(series) == 1, (role, series)
        assert series[0]["metric"]["model_name"] == MODEL


def test_the_autoscaler_reads_a_full_window_from_discovered_pods(discovered: Discovered) -> None:
    """Requests sent prefill -> decode as vllm-router does; the window covers both roles."""
    discovered.prom.wait_for_targets(2, timeout_s=60)
    urls = {r: f"http://{discovered.pods[r]['status']['podIP']}:8000" for r in WORKERS}
    prompt = list(range(500))
    with httpx.Client(timeout=30) as http:
        for _ in range(3):
            r = http.post(
                f"{urls['prefill']}/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": prompt,
                    "max_tokens": 1,
                    "kv_transfer_params": {"do_remote_decode": True},
                },
            )
            r.raise_for_status()
            r = http.post(
                f"{urls['decode']}/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": prompt,
                    "max_tokens": 16,
                    "kv_transfer_params": r.json()["kv_transfer_params"],
                },
            )
            r.raise_for_status()
    # rate() needs two samples of each counter; a series first scraped after the requests
    # (vLLM's labelled counters appear with their first request) reads NaN until the next
    # scrape, so the window is polled until both roles have one.
    source = PrometheusSource(discovered.prom.url, disable_ssl=True)

    def window() -> MetricsWindow:
        return source.window(discovered.namespace, SERVICE, time.time(), 90, 60)

    def full(m: MetricsWindow) -> bool:
        return (
            m.prefill is not None
            and m.decode is not None
            and m.prefill.request_rate > 0
            and m.prefill.ttft_s > 0
            and m.decode.generation_tokens_rate > 0
            and m.decode.itl_s > 0
        )

    deadline = time.monotonic() + 30
    m = window()
    while not full(m) and time.monotonic() < deadline:
        time.sleep(0.5)
        m = window()
    assert full(m), m
