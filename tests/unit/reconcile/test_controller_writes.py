"""How a pass writes its children: what the pods use first, then the workloads, each wave at
once (plan.write_waves)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pdfleet.controller import Controller
from pdfleet.reconcile.observed import Observed
from tests.spec_cases import sample
from tests.unit.fakes import Writer

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
WORKLOADS = ("StatefulSet", "Deployment")


class MeetingWriter(Writer):
    """Each workload write waits until every workload of the pass is being written: written
    one after the other, the first would wait for ever (here: until the barrier's timeout)."""

    def __init__(self, workloads: int) -> None:
        super().__init__()
        self.meeting = threading.Barrier(workloads, timeout=30)

    def apply(self, manifest: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        if manifest["kind"] in WORKLOADS:
            self.meeting.wait()
        return super().apply(manifest, namespace)


def test_the_workloads_of_a_pass_are_written_at_once_after_what_they_use() -> None:
    body = sample("minimal")
    body["metadata"].update(namespace="ns", uid="u1", generation=1)
    writer = MeetingWriter(workloads=3)  # two StatefulSets and the router Deployment
    result = Controller(writer, clock=lambda: NOW).reconcile(body, Observed())
    assert result.writes == 12
    kinds = [args[0] for call, args in writer.calls if call == "apply"]
    first_workload = min(i for i, kind in enumerate(kinds) if kind in WORKLOADS)
    assert all(kind in WORKLOADS for kind in kinds[first_workload:])
    assert sorted(kinds[first_workload:]) == ["Deployment", "StatefulSet", "StatefulSet"]


def test_a_new_services_status_goes_out_before_its_children_and_once() -> None:
    """Until a status shows observedGeneration, kstatus reads a new service as Current: the
    first pass writes it first, and does not write the same status again at its end."""
    body = sample("minimal")
    body["metadata"].update(namespace="ns", uid="u1", generation=1)
    writer = Writer()
    Controller(writer, clock=lambda: NOW).reconcile(body, Observed())
    calls = [call for call, _ in writer.calls if call in ("status", "apply")]
    assert calls[0] == "status" and calls.count("status") == 1 and calls.count("apply") == 12
    assert writer.last_status["observedGeneration"] == 1
    reconciling = next(c for c in writer.last_status["conditions"] if c["type"] == "Reconciling")
    assert reconciling["status"] == "True"
