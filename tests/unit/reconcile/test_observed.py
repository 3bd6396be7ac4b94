"""What a pass plans from: the watch indexes, with the operator's own writes laid over a
lagging index (reconcile/observed.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdfleet.reconcile.observed import ChildRef, Observed, index_lags, overlay

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
