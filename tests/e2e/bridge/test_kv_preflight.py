"""The KV transport preflight on the local cluster: a real `pdfleet operator run` sets
KVTransportReady from a measurement between the service's own worker pods.

The process bridge runs each worker as `pdfleet-agent launch` (simulator engine), which starts
the preflight listener on the pod IP beside it; the UCX settings come from the spec
(`fabric.ucx`: tcp on `lo`, the namespace's only interface). First the service asks for no
RDMA, so TCP is the plan and the condition is True with the measured figures; then the fabric
asks for `rdma/ib`, the pods roll, the operator measures again and reports the TCP fallback as
KVTransportReady=False with a Warning Event."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import REPO_ROOT, Cluster, wait_until
from e2e.platform.service import operated_namespace
from pdfleet import labels

pytestmark = pytest.mark.timeout(600)

NAME = "llama-8b"
PREFLIGHT = {"promptTokens": 512, "iterations": 3}


def _manifest(namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO_ROOT / "crds/samples/minimal.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["router"] = {"healthCheckInterval": "2s"}
    doc["spec"]["kvTransfer"] = {
        "fabric": {"ucx": {"tls": "tcp", "netDevices": "lo"}},
        "preflight": PREFLIGHT,
    }
    return doc


class Service:
    def __init__(self, api: Any, namespace: str) -> None:
        self.namespace = namespace
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    def get(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL, NAME
        )
        return obj

    def status(self) -> dict[str, Any]:
        return dict(self.get().get("status") or {})

    def condition(self, type_: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == type_), {})

    def patch(self, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL, NAME, patch
        )

    def events(self, reason: str) -> list[Any]:
        return [
            e
            for e in self.core.list_namespaced_event(self.namespace).items
            if e.reason == reason and e.involved_object.name == NAME
        ]


@pytest.fixture(scope="module")
def service(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log_dir = tmp_path_factory.mktemp("kv-preflight")
    with operated_namespace(bridge_cluster, api_client, log_dir, "kvpf") as operated:
        namespace = operated.namespace
        svc = Service(api_client, namespace)
        svc.custom.create_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, labels.PLURAL, _manifest(namespace)
        )
        yield svc


def _measured_again(service: Service, before: str) -> bool:
    record = service.status().get("kvTransport") or {}
    return record.get("fingerprint") not in (None, before) and not record.get("error")


@pytest.fixture
def tcp_service(service: Service) -> Service:
    """The service as created (its fabric asks for no RDMA) with a KV transport verdict for
    that spec: a fabric an earlier test changed is put back and measured again first."""
    fabric = service.get()["spec"]["kvTransfer"]["fabric"]
    if fabric.get("rdmaResource") is not None:
        before = service.status()["kvTransport"]["fingerprint"]
        service.patch({"spec": {"kvTransfer": {"fabric": {"rdmaResource": None}}}})
        wait_until(lambda: _measured_again(service, before), 300, "a preflight for TCP again")
    wait_until(lambda: bool(service.condition("KVTransportReady")), 240, "KVTransportReady")
    return service


def test_the_operator_measures_the_pools_once_ready(tcp_service: Service) -> None:
    service = tcp_service
    condition = service.condition("KVTransportReady")
    assert (condition["status"], condition["reason"]) == ("True", "Measured"), condition
    record = service.status()["kvTransport"]
    assert record["transport"] == "tcp/lo" and record["transportKind"] == "tcp"
    assert record["memory"] == "DRAM" and record["verified"] and not record["error"]
    assert record["payloadBytes"] == 512 * 131_072
    assert record["bandwidthGbps"] > 0 and record["latencyMs"] > 0
    assert record["expectedTransferSeconds"] > 0
    assert (record["prefillPod"], record["decodePod"]) == (f"{NAME}-prefill-0", f"{NAME}-decode-0")
    assert "tcp/lo (tcp)" in condition["message"] and "GB/s" in condition["message"]
    assert service.events("KVTransportMeasured")
    print(f"\non the cluster: {condition['message']}")


def test_a_fabric_that_asks_for_rdma_but_gets_tcp_is_a_warning(tcp_service: Service) -> None:
    service = tcp_service
    before = service.status()["kvTransport"]["fingerprint"]
    service.patch({"spec": {"kvTransfer": {"fabric": {"rdmaResource": "rdma/ib"}}}})
    wait_until(lambda: _measured_again(service, before), 300, "a new preflight after the change")
    condition = service.condition("KVTransportReady")
    assert (condition["status"], condition["reason"]) == ("False", "TCPFallback"), condition
    assert "rdma/ib" in condition["message"]
    events = service.events("KVTransportTCPFallback")
    assert events and events[0].type == "Warning"
    # A warning: the service serves. The fabric is part of the KV revision, so the change
    # rolls both pools as a pair and the new pair is measured while traffic still moves;
    # Ready comes once the rollout is done, with the verdict still TCPFallback.
    wait_until(lambda: _ready(service), 300, "Ready after the rollout")
    condition = service.condition("KVTransportReady")
    assert (condition["status"], condition["reason"]) == ("False", "TCPFallback"), condition


def _ready(service: Service) -> bool:
    return service.condition("Ready").get("status") == "True"
