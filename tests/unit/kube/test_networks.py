"""The NetworkAttachmentDefinition cache (kube/networks.py): names by namespace, unknown until
listed, a missing CRD said once; and what a pass reads of it (handlers.ServiceCache)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from kubernetes import client

from pdfleet.handlers import ServiceCache
from pdfleet.kube import informer, networks
from pdfleet.kube.networks import NetworkCache, OptionalInformer


def _nad(name: str, namespace: str = "serving") -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "7"},
        "spec": {"config": '{"cniVersion": "0.3.1", "type": "ib-sriov"}'},
    }


def _service(name: str, networks_: list[str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": "m"}}
    if networks_ is not None:
        spec["kvTransfer"] = {"fabric": {"rdmaResource": "rdma/ib", "networks": networks_}}
    return {"metadata": {"name": name, "namespace": "serving"}, "spec": spec}


def test_names_are_unknown_until_a_listing_covers_the_namespace() -> None:
    cache = NetworkCache()
    cache.store.upsert(_nad("ib-rdma-net"))
    assert cache.names("serving") is None  # a pass must not take "not listed" for "missing"
    cache.listed("serving")
    assert cache.names("serving") == frozenset({"ib-rdma-net"})
    assert cache.names("other") is None
    cache.listed(None)  # the cluster-wide listing covers every namespace
    assert cache.names("other") == frozenset()


def test_a_network_change_queues_the_services_of_its_namespace_that_name_networks() -> None:
    cache = ServiceCache()
    for name, nets in (("fabric", ["ib-rdma-net"]), ("tcp", None), ("empty", [])):
        cache.service_event(("serving", name), "ADDED", _service(name, nets))
    cache.service_event(("elsewhere", "fabric"), "ADDED", _service("fabric", ["ib-rdma-net"]))
    assert cache.fabric_services("serving") == [("serving", "fabric")]

    queued: list[tuple[str, str]] = []
    watches = cache.informers(client.ApiClient(), ["serving"], queued.append, lambda: None)
    nad_watch = next(w for w in watches if w.kind == networks.KIND)
    assert isinstance(nad_watch, OptionalInformer)
    nad_watch.on_change(("serving", networks.EVERY_NAME))
    assert queued == [("serving", "fabric")]

    assert cache.observed_for(("serving", "fabric")).networks is None
    nad_watch.store.upsert(_nad("ib-rdma-net"))
    nad_watch.on_synced()
    assert cache.observed_for(("serving", "fabric")).networks == frozenset({"ib-rdma-net"})


def _informer() -> OptionalInformer:
    return OptionalInformer(
        client.ApiClient(), networks.KIND, None, "", NetworkCache().store, lambda _: None
    )


@pytest.mark.parametrize(("status", "absent"), [(404, 404), (403, 403), (500, None)])
def test_only_a_missing_or_forbidden_kind_is_absent(
    monkeypatch: pytest.MonkeyPatch, status: int, absent: int | None
) -> None:
    def refuse(self: OptionalInformer, query: Any) -> dict[str, Any]:
        raise client.ApiException(status=status, reason="no")

    monkeypatch.setattr(OptionalInformer, "_get", refuse)
    assert _informer().absent() == absent


def test_a_missing_crd_is_said_once_and_looked_for_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    answers = [404, 404, 404, None]  # installed at the fourth look
    monkeypatch.setattr(OptionalInformer, "absent", lambda self: answers.pop(0))
    monkeypatch.setattr(networks, "ABSENT_RETRY_S", 0.0)
    watched: list[bool] = []
    monkeypatch.setattr(informer.Informer, "run", lambda self, stop: watched.append(True))
    with caplog.at_level(logging.INFO, logger=networks.__name__):
        _informer().run(threading.Event())
    assert not answers and watched == [True]  # then the ordinary list-and-watch loop
    assert [r.getMessage() for r in caplog.records] == [
        "NetworkAttachmentDefinitions cannot be listed (404): missing networks go unreported; "
        "looking again every 0s"
    ]
