"""What a pass plans from: the watch indexes, with the operator's own writes laid over a
lagging index (reconcile/observed.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdfleet import labels
from pdfleet.reconcile.observed import ChildRef, Observed, child_ref, index_lags, overlay, pod_info

FRESH_S = 10.0
STS = ChildRef("StatefulSet", "svc-decode", applied_hash="h1", replicas=4, generation=3)
WRITTEN = replace(STS, applied_hash="h2", replicas=1, generation=4)
SERVICE = ChildRef("Service", "svc-router", applied_hash="s1")
SERVICE_2 = replace(SERVICE, applied_hash="s2")


@pytest.mark.parametrize(
    ("case", "seen", "written", "age_s", "lags"),
    [
        ("older generation, even long after the write", STS, WRITTEN, 60.0, True),
        ("the index caught up", replace(STS, generation=4, applied_hash="h2"), WRITTEN, 0.1, False),
        ("someone wrote after us", replace(STS, generation=5), WRITTEN, 0.1, False),
        ("no generation: another hash, just written", SERVICE, SERVICE_2, 1.0, True),
        ("no generation: another hash, written long ago", SERVICE, SERVICE_2, 11.0, False),
        ("no generation: the same hash", SERVICE, SERVICE, 1.0, False),
        ("missing from the index, just written", None, WRITTEN, 1.0, True),
        ("missing long after the write: deleted since", None, WRITTEN, 11.0, False),
    ],
)  # fmt: skip
def test_index_lags(
    case: str, seen: ChildRef | None, written: ChildRef, age_s: float, lags: bool
) -> None:
    assert index_lags(seen, written, age_s, FRESH_S) is lags, case


def test_overlay_lays_only_lagging_writes_over_the_index() -> None:
    router = ChildRef("Deployment", "svc-router", applied_hash="r1", replicas=1, generation=2)
    observed = Observed(
        children={("StatefulSet", "svc-decode"): STS, ("Deployment", "svc-router"): router}
    )
    written = {
        ("StatefulSet", "svc-decode"): (WRITTEN, 30.0),  # the index still shows generation 3
        ("Deployment", "svc-router"): (replace(router, generation=1), 0.5),  # index is newer
    }
    result = overlay(observed, written, FRESH_S)
    assert result.child("StatefulSet", "svc-decode") == WRITTEN
    assert result.child("Deployment", "svc-router") == router


def test_a_statefulset_in_a_paired_rollout_shows_its_start_partition_and_revision() -> None:
    """What the rollout plan reads back from the objects (pdfleet.rollout.plan)."""
    sts = {
        "kind": "StatefulSet",
        "metadata": {"name": "svc-decode", "generation": 7},
        "spec": {
            "replicas": 4,
            "ordinals": {"start": 3},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
            "template": {"metadata": {"labels": {labels.KV_REVISION: "r2"}}},
        },
    }
    ref = child_ref(sts)
    assert (ref.replicas, ref.ordinals_start, ref.partition, ref.kv_revision) == (4, 3, 2, "r2")
    plain = child_ref({"kind": "StatefulSet", "metadata": {"name": "s"}, "spec": {"replicas": 1}})
    assert (plain.ordinals_start, plain.partition, plain.kv_revision) == (0, 0, None)
    pod = pod_info({"metadata": {"name": "svc-decode-5", "labels": {labels.KV_REVISION: "r1"}}})
    assert (pod.ordinal, pod.kv_revision) == (5, "r1")
