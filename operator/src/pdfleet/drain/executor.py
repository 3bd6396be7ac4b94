"""Carry out a DrainPlan: annotate pods, deregister workers from the routers, recreate, report.

Where it fits: the controller calls `execute()` with the plan of one pool (drain/plan.py), a
`kube.writer.Writer` (in the operator: pdfleet.kube.api.KubeWriter; in the router tests: a
stand-in that stops simulator processes) and the service's `RouterFleet` (drain/io.py). The replica
count is not written here: the controller renders it into the StatefulSet it applies anyway.

Failures are logged and left to the next pass: every step is level-based (a mark is a merge
patch, a deregistration is re-checked against GET /workers), so repeating one is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdfleet import labels, metrics
from pdfleet.drain.io import RouterError, RouterFleet
from pdfleet.drain.plan import Action, ActionKind, DrainPlan
from pdfleet.kube.writer import Writer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainOutcome:
    """What the pass did, for the controller's log and tests."""

    writes: int
    deregistered: tuple[str, ...]
    failed: tuple[str, ...]
    finished: tuple[Action, ...]


def annotation_patch(value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {labels.DRAINING: value}}}


def execute(
    plan: DrainPlan,
    role: str,
    namespace: str,
    owner: Mapping[str, Any],
    writer: Writer,
    fleet: RouterFleet | None,
) -> DrainOutcome:
    """Run the plan's actions in order (a mark lands before its deregistration)."""
    writes = 0
    deregistered: list[str] = []
    failed: list[str] = []
    finished: list[Action] = []
    for action in plan.actions:
        if action.kind is ActionKind.MARK:
            writer.patch_merge("Pod", namespace, action.pod, annotation_patch(action.since))
            writes += 1
        elif action.kind is ActionKind.UNMARK:
            writer.patch_merge("Pod", namespace, action.pod, annotation_patch(None))
            writes += 1
            writer.event(owner, "DrainCancelled", f"{action.pod} serves again ({role})")
        elif action.kind is ActionKind.RECREATE:
            writer.delete("Pod", action.pod, namespace)
            writes += 1
            writer.event(
                owner,
                "DrainCancelled",
                f"{action.pod} was deregistered; recreating it so the router adds it back",
            )
        elif action.kind is ActionKind.DEREGISTER:
            if fleet is None or action.url is None:
                continue
            try:
                fleet.deregister(action.url)
                deregistered.append(action.pod)
            except RouterError as error:
                failed.append(action.pod)
                log.warning("deregistering %s (%s) failed: %s", action.pod, action.url, error)
        elif action.kind is ActionKind.FINISHED:
            finished.append(action)
            _report_finished(action, role, owner, writer)
    return DrainOutcome(writes, tuple(deregistered), tuple(failed), tuple(finished))


def _report_finished(action: Action, role: str, owner: Mapping[str, Any], writer: Writer) -> None:
    metrics.DRAIN_DURATION.labels(role=role).observe(action.duration_s)
    if action.forced:
        metrics.DRAIN_FORCED.labels(role=role).inc()
        writer.event(
            owner,
            "DrainForced",
            f"{action.pod} ({role}) removed after {action.duration_s:.0f}s of draining: "
            f"{action.reason}; requests still on it may fail",
            "Warning",
        )
    else:
        writer.event(owner, "Drained", f"{action.pod} ({role}) drained in {action.duration_s:.1f}s")
