"""Carrying out a drain plan (`drain/executor.py`): what a finished drain reports, as Events
and as the operator's drain metrics (the dashboard's Drains row, PdfleetDrainForced)."""

from __future__ import annotations

import pytest

from pdfleet.drain.executor import execute
from pdfleet.drain.plan import Action, ActionKind, DrainPlan
from tests.unit.fakes import Writer
from tests.unit.operator_metrics import counted, labels

OWNER = {"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferenceService",
         "metadata": {"namespace": "ns", "name": "svc", "uid": "u1"}}  # fmt: skip
DRAINED = Action(ActionKind.FINISHED, "svc-decode-2", since="t0", duration_s=7.0)
FORCED = Action(ActionKind.FINISHED, "svc-decode-1", since="t0", duration_s=400.0, forced=True,
                reason="2 requests still running")  # fmt: skip


def test_finished_drains_are_timed_and_forced_ones_counted() -> None:
    writer = Writer()
    with (
        counted("pdfleet_drain_duration_seconds_count") as drains,
        counted("pdfleet_drain_duration_seconds_sum") as seconds,
        counted("pdfleet_drain_forced_total") as forced,
    ):
        outcome = execute(DrainPlan(1, [DRAINED, FORCED]), "decode", "ns", OWNER, writer, None)
    assert outcome.finished == (DRAINED, FORCED)
    assert drains == {labels(role="decode"): 2.0}
    assert seconds == pytest.approx({labels(role="decode"): 407.0})
    assert forced == {labels(role="decode"): 1.0}
    assert [c for c in writer.calls if c[0] == "event"] == [
        ("event", "Drained"),
        ("event", "DrainForced"),
    ]


def test_a_drain_still_running_reports_nothing() -> None:
    mark = Action(ActionKind.MARK, "svc-prefill-1", since="t0")
    with (
        counted("pdfleet_drain_duration_seconds_count") as drains,
        counted("pdfleet_drain_forced_total") as forced,
    ):
        execute(DrainPlan(2, [mark]), "prefill", "ns", OWNER, Writer(), None)
    assert drains == {} and forced == {}
