"""The informers' store and event handling (pure parts; the I/O loop runs against a real API
server in tests/integration/cluster/test_informer.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet import labels
from pdfleet.handlers import ServiceCache, child_projection, owner_of
from pdfleet.kube.informer import (
    OwnedStore,
    WatchExpiredError,
    apply_event,
    json_lines,
)
from pdfleet.reconcile.observed import ChildRef


def _sts(
    name: str, service: str | None = "svc", ready: int = 0, rv: str = "1", namespace: str = "ns"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": rv}
    if service is not None:
        meta["labels"] = {labels.SERVICE: service}
    return {"metadata": meta, "spec": {"replicas": 2}, "status": {"readyReplicas": ready}}


def _store() -> OwnedStore[ChildRef]:
    return OwnedStore(child_projection("StatefulSet"))


def test_objects_are_grouped_by_owning_service() -> None:
    store = _store()
    assert store.upsert(_sts("a-prefill", "a")) == {("ns", "a")}
    assert store.upsert(_sts("a-decode", "a")) == {("ns", "a")}
    assert store.upsert(_sts("b-prefill", "b")) == {("ns", "b")}
    assert sorted(ref.name for ref in store.owned_by(("ns", "a"))) == ["a-decode", "a-prefill"]
    assert [ref.kind for ref in store.owned_by(("ns", "b"))] == ["StatefulSet"]
    assert store.owned_by(("ns", "c")) == ()
    assert store.owners() == {("ns", "a"), ("ns", "b")}


def test_an_event_that_changes_nothing_a_pass_reads_triggers_nothing() -> None:
    store = _store()
    store.upsert(_sts("a", rv="1"))
    assert store.upsert(_sts("a", rv="2")) == set()  # only the resourceVersion moved
    assert store.upsert(_sts("a", ready=1, rv="3")) == {("ns", "svc")}


def test_an_object_relabelled_to_another_service_changes_both() -> None:
    store = _store()
    store.upsert(_sts("x", "a"))
    assert store.upsert(_sts("x", "b")) == {("ns", "a"), ("ns", "b")}
    assert store.owned_by(("ns", "a")) == ()
    assert store.owners() == {("ns", "b")}


def test_an_object_that_loses_its_owner_label_leaves_the_store() -> None:
    store = _store()
    store.upsert(_sts("x", "a"))
    assert store.upsert(_sts("x", None)) == {("ns", "a")}
    assert len(store) == 0 and store.owners() == set()


def test_removing_an_unknown_object_changes_nothing() -> None:
    store = _store()
    assert store.remove(_sts("ghost")) == set()


def test_a_relisting_is_the_whole_truth() -> None:
    """After a watch expired, objects missing from the new listing were deleted meanwhile."""
    store = _store()
    store.replace([_sts("a-1", "a"), _sts("b-1", "b"), _sts("c-1", "c")])
    changed = store.replace([_sts("a-1", "a"), _sts("b-1", "b", ready=1), _sts("d-1", "d")])
    assert changed == {("ns", "b"), ("ns", "c"), ("ns", "d")}
    assert store.owners() == {("ns", "a"), ("ns", "b"), ("ns", "d")}
    assert store.replace([]) == {("ns", "a"), ("ns", "b"), ("ns", "d")}
    assert len(store) == 0


def test_a_namespace_relisting_leaves_other_namespaces_alone() -> None:
    """With --namespace a b, both namespaces' informers of a kind share one store."""
    store = _store()
    store.upsert(_sts("a-1", "a", namespace="one"))
    store.upsert(_sts("b-1", "b", namespace="two"))
    assert store.replace([], namespace="one") == {("one", "a")}
    assert store.owners() == {("two", "b")}


@pytest.mark.parametrize(
    ("event", "owners", "version"),
    [
        ({"type": "ADDED", "object": _sts("a", rv="5")}, {("ns", "svc")}, "5"),
        ({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}, set(), "9"),
        ({"type": "DELETED", "object": _sts("gone", rv="7")}, set(), "7"),
    ],
)
def test_watch_events(event: dict[str, Any], owners: set[Any], version: str) -> None:
    assert apply_event(_store(), event) == (owners, version)


def test_a_deletion_event_removes_the_object() -> None:
    store = _store()
    apply_event(store, {"type": "ADDED", "object": _sts("a")})
    assert apply_event(store, {"type": "DELETED", "object": _sts("a", rv="2")}) == (
        {("ns", "svc")},
        "2",
    )
    assert len(store) == 0


def test_an_expired_watch_asks_for_a_new_listing() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    with pytest.raises(WatchExpiredError, match="too old"):
        apply_event(_store(), gone)


def test_any_other_watch_error_is_an_error() -> None:
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd down"}}
    with pytest.raises(RuntimeError, match="etcd down"):
        apply_event(_store(), error)


def test_watch_lines_split_anywhere_across_chunks() -> None:
    chunks = [b'{"type": "AD', b'DED", "n": 1}\n{"type"', b': "MODIFIED"}\n\n', b'{"last": true}']
    assert list(json_lines(chunks)) == [
        {"type": "ADDED", "n": 1},
        {"type": "MODIFIED"},
        {"last": True},
    ]


def test_children_and_pods_are_read_per_service() -> None:
    cache = ServiceCache()
    cache.children["StatefulSet"].upsert(_sts("svc-prefill"))
    pod = _sts("svc-prefill-0")
    pod["metadata"]["labels"][labels.ROLE] = "prefill"
    pod["status"] = {"phase": "Running"}
    cache.pods.upsert(pod)
    observed = cache.observed_for(("ns", "svc"))
    assert list(observed.children) == [("StatefulSet", "svc-prefill")]
    assert [(p.name, p.role, p.ordinal) for p in observed.pods] == [("svc-prefill-0", "prefill", 0)]
    assert cache.observed_for(("ns", "other")).children == {}


def test_owner_is_the_service_label_in_the_objects_namespace() -> None:
    assert owner_of(_sts("x", "a")) == ("ns", "a")
    assert owner_of(_sts("x", None)) is None
