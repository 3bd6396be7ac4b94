"""The operator's informers against a real kube-apiserver: paged listing, then watch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from pdfleet import labels
from pdfleet.handlers import child_projection
from pdfleet.kube import informer as informer_module
from pdfleet.kube.informer import Informer, OwnedStore
from pdfleet.reconcile.observed import ChildRef
from tests.integration.cluster.kube_helpers import wait_for


def _service(namespace: str, name: str, owner: str) -> client.V1Service:
    return client.V1Service.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace, "labels": {labels.SERVICE: owner}},
            "spec": {"clusterIP": "None", "ports": [{"port": 8000}]},
        }
    )


@pytest.fixture
def watched(
    api_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Informer[ChildRef], list[tuple[str, str]]]]:
    core = client.CoreV1Api(api_client)
    for i in range(5):
        core.create_namespaced_service(namespace, _service(namespace, f"a-{i}", "a"))
    unowned = {
        "metadata": {"name": "unowned"},
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
    }
    core.create_namespaced_service(namespace, client.V1Service.model_validate(unowned))
    monkeypatch.setattr(informer_module, "PAGE_SIZE", 2)  # three pages
    monkeypatch.setattr(informer_module, "WATCH_TIMEOUT_S", 2)  # watches end and resume
    changed: list[tuple[str, str]] = []
    synced = threading.Event()
    services = Informer(
        api_client,
        "Service",
        namespace,
        labels.SERVICE,
        OwnedStore(child_projection("Service")),
        changed.append,
        synced.set,
    )
    stop = threading.Event()
    thread = threading.Thread(target=services.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert synced.wait(30), "the first listing did not finish"
        yield services, changed
    finally:
        stop.set()
        thread.join(10)


def test_the_listing_fills_the_store_without_triggering_passes(
    watched: tuple[Informer[ChildRef], list[tuple[str, str]]], namespace: str
) -> None:
    services, changed = watched
    names = sorted(ref.name for ref in services.store.owned_by((namespace, "a")))
    assert names == [f"a-{i}" for i in range(5)]
    assert all(ref.kind == "Service" for ref in services.store.owned_by((namespace, "a")))
    assert len(services.store) == 5  # the unlabelled Service is not selected
    assert changed == []


def test_watch_events_change_the_store_and_name_the_owner(
    watched: tuple[Informer[ChildRef], list[tuple[str, str]]], namespace: str, api_client: Any
) -> None:
    services, changed = watched
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service(namespace, _service(namespace, "b-0", "b"))
    wait_for(lambda: (namespace, "b") in changed, 30, "the new service's owner")
    assert [ref.name for ref in services.store.owned_by((namespace, "b"))] == ["b-0"]

    core.delete_namespaced_service("a-0", namespace)
    wait_for(lambda: len(services.store.owned_by((namespace, "a"))) == 4, 30, "a-0 gone")
    assert (namespace, "a") in changed

    # Across the end of a watch (2 s here) the informer resumes without losing an event.
    changed.clear()
    wait_for(lambda: services.store.owned_by((namespace, "c")) == (), 1, "nothing for c")
    threading.Event().wait(3)
    core.create_namespaced_service(namespace, _service(namespace, "c-0", "c"))
    wait_for(lambda: changed == [(namespace, "c")], 30, "the event after a resumed watch")
    assert len(services.store) == 6
