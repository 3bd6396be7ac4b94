"""One reconcile pass for one InferenceService: validate, plan, write what changed, report.

The kopf handlers (handlers.py) call `Controller.reconcile()` from every trigger: the
InferenceService's own watch events (create, update, and the initial listing on resume), its
children's events, and a periodic timer. The pass is level-based and idempotent: it derives
everything from the spec and the observed children, so running it twice changes nothing, and
an unchanged service costs no API writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic

from pdfleet import labels, metrics
from pdfleet.api.rules import error_paths
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.autoscale.actuator import Autoscaler, role_replicas
from pdfleet.autoscale.idle import woken
from pdfleet.drain.step import step as drain_step
from pdfleet.kube.errors import APIError
from pdfleet.kube.writer import Writer
from pdfleet.preflight import plan as preflight_plan
from pdfleet.preflight.step import step as preflight_step
from pdfleet.reconcile.memory import RECENT_WRITE_S, Memories, Pass
from pdfleet.reconcile.observed import (
    ChildRef,
    Observed,
    child_ref,
    index_lags,
    overlay,
)
from pdfleet.reconcile.plan import RenderCache, desired_replicas, plan, plan_pools, write_waves
from pdfleet.reconcile.status import (
    READY,
    compute_status,
    condition_events,
    condition_status,
    invalid_status,
    merge_foreign_condition,
    progress_interval_s,
    progress_only,
    status_changed,
)
from pdfleet.render import Manifest, RenderConfig
from pdfleet.rollout.plan import RolloutPlan

log = logging.getLogger(__name__)

INDEX_LAG_WARN_S = 5.0
# A status change that is only progress (pod counts, and the steps of a start-up while Ready
# stays False: reconcile/status.progress_only) waits until this long after the service's last
# status write, and goes out then with the state of that moment. Ready flipping, a problem
# (Stalled, SpecValid), a decision or a preflight record is written at once. A start-up's
# steps (created, pods appearing, pods ready, Ready, the preflight verdict) would each make a
# write; a few seconds is long enough for a lone start-up's counts to ride on its Ready write
# (docs/benchmarks/scale).
STATUS_COALESCE_S = 5.0
# Many services starting at once (a fleet applied in one go) make start-ups slow, their steps
# more than STATUS_COALESCE_S apart, so each step would still be a write, competing with their
# children's at the API server (docs/benchmarks/scale). So a start-up's progress waits
# longer the more services are starting, keeping their progress together under
# STARTUP_PROGRESS_PER_S writes a second (reconcile/status.progress_interval_s); a lone
# start-up keeps STATUS_COALESCE_S, and no start-up waits more than STARTUP_COALESCE_MAX_S.
STARTUP_PROGRESS_PER_S = 5.0
STARTUP_COALESCE_MAX_S = 60.0
# Child writes in flight at once, over all passes (the API client's connection pool is sized
# for these, the passes' own status writes and the lease).
WRITES_IN_FLIGHT = 8
# While a paired rollout runs, a pass comes back at least this often: its deadline passes
# with no watch event.
ROLLOUT_POLL_S = 5.0
# A child the API server refused for good (kube.errors.APIError.refused_for_good): the pass
# reports it instead of raising, and the periodic resync tries again.
CHILD_REJECTED = "ChildRejected"


@dataclass(frozen=True)
class PassResult:
    writes: int
    deletes: int
    status_written: bool
    requeue_after_s: float | None = None
    """Run another pass this soon (a drain is waiting on in-flight requests)."""


def _described(manifest: Mapping[str, Any]) -> str:
    """ "StatefulSet svc-decode (replicas 3)" for the log: what a pass wrote, and to what size."""
    described = f"{manifest['kind']} {manifest['metadata']['name']}"
    replicas = (manifest.get("spec") or {}).get("replicas")
    return described if replicas is None else f"{described} (replicas {replicas})"


def rejection_message(manifest: Mapping[str, Any], error: APIError) -> str:
    """'<Kind> <name>: <the API server's message>' for a child the API server refused."""
    return f"{manifest['kind']} {manifest['metadata']['name']}: {error.message}"[:2000]


def _status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (dropped keys become null)."""
    return {**{key: None for key in (old or {}) if key not in new}, **new}


class Controller:
    """Reconciles InferenceServices through a `kube.writer.Writer`. Thread-safe per object."""

    def __init__(
        self,
        writer: Writer,
        config: RenderConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        autoscaler: Autoscaler | None = None,
        preflight_runner: Executor | None = None,
    ):
        self.writer = writer
        self.autoscaler = autoscaler
        self.config = config or RenderConfig()
        self.clock = clock
        # Everything kept per service between passes (reconcile/memory.py).
        self._memories = Memories()
        self._rendered = RenderCache()
        # Shared by every pass: a wave of one pass's children goes out at once, and the pool
        # bounds the operator's writes in flight (connections to the API server).
        self._writes = ThreadPoolExecutor(max_workers=WRITES_IN_FLIGHT, thread_name_prefix="apply")
        self._preflight_runner = preflight_runner or ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="preflight"
        )

    def _report_index_lag(
        self,
        namespace: str,
        name: str,
        observed: Observed,
        written: Mapping[tuple[str, str], tuple[ChildRef, float]],
    ) -> None:
        """Log a workload whose watch index still shows a generation older than our write
        after INDEX_LAG_WARN_S: the overlay covers it, and the log says the watch is slow.
        (`index_lags` with no freshness allowance: only a generation can show such a lag.)"""
        for (kind, child), (ref, age_s) in written.items():
            seen = observed.child(kind, child)
            if seen is not None and age_s > INDEX_LAG_WARN_S and index_lags(seen, ref, age_s, 0.0):
                log.info(
                    "%s/%s: the watch index shows %s %s at generation %d, %.1fs after this "
                    "operator wrote generation %d",
                    namespace, name, kind, child, seen.generation, age_s, ref.generation,
                )  # fmt: skip

    def forget(self, namespace: str, name: str) -> None:
        metrics.forget_service(namespace, name)
        if self.autoscaler is not None:
            self.autoscaler.forget(namespace, name)
        self._rendered.forget(namespace, name)
        self._memories.forget((namespace, name))

    def reconcile(self, body: Mapping[str, Any], observed: Observed) -> PassResult:
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        if meta.get("deletionTimestamp"):
            # Children go with the owner through garbage collection.
            return PassResult(0, 0, False)
        started = time.monotonic()
        with self._memories.of((namespace, name)).lock:
            try:
                return self._reconcile(body, observed)
            except APIError as error:
                metrics.RECONCILE_ERRORS.labels(reason=str(error.status)).inc()
                raise
            finally:
                metrics.RECONCILE_DURATION.observe(time.monotonic() - started)

    def _reconcile(self, body: Mapping[str, Any], observed: Observed) -> PassResult:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        # The watch index shows our last status write a moment late; a pass that started from
        # the older status would undo the autoscaler's latest decision.
        memory = self._memories.of((namespace, name))
        previous = memory.recent_status() or body.get("status")
        now = self.clock()
        try:
            isvc = InferenceService.model_validate(
                {"metadata": meta, "spec": body.get("spec"), "status": None}
            )
        except pydantic.ValidationError as error:
            # Only specs that slipped past admission land here (e.g. stored before a CRD
            # upgrade): report, do not retry in a loop, touch no child.
            message = "; ".join(error_paths(error))[:2000]
            new = invalid_status(previous, meta.get("generation"), message, now)
            return self._write_status(body, previous, new, "InvalidSpec", message)

        # What this pass plans from: the indexes, with our own writes laid over a lagging index
        # (the autoscaler and the drain read the pools' sizes from it).
        ours = memory.recent_writes()
        self._report_index_lag(namespace, name, observed, ours)
        observed = overlay(observed, ours, RECENT_WRITE_S)
        original = previous
        autoscale_after: float | None = None
        if isvc.spec.autoscaling.enabled and self.autoscaler is not None:
            previous = self._autoscale(body, isvc, observed, previous, now)
            # When the next step is due, not a full interval after this pass: the latest pass's
            # come-back replaces the one before (kube.workqueue.WorkQueue.come_back).
            autoscale_after = self.autoscaler.come_back_s(isvc)
        this = Pass(body, isvc, observed, now, memory)
        # The paired rollout places the revisions; the drain retires the old one's pods and
        # holds shrinking pools at their size until their pods have drained.
        desired = desired_replicas(isvc, previous)
        rollout = plan_pools(isvc, observed, desired, preflight_plan.proven(isvc, previous))
        drained = drain_step(this, rollout.pools, self.writer)
        rollout = rollout.retired(drained.retired)
        applied = {**drained.replicas}
        applied.update((role, rollout.pools[role].replicas) for role in drained.retired)
        requeue = drained.requeue_after_s
        self._report_rollout(body, previous, rollout)
        replicas, child_plan = plan(
            isvc, observed, previous, self.config, applied, self._rendered, rollout
        )
        planned = len(child_plan.apply) + len(child_plan.delete)
        if planned and not (original or {}).get("observedGeneration"):
            # A service's first status goes out before its children, so that its conditions
            # say at once what it waits for: a burst of creations queues the passes that
            # write a dozen children each. (kstatus reads it as InProgress before that too:
            # the CRD defaults status.observedGeneration to 0.) It is the status the end of
            # this pass would write, so that write is then skipped, not repeated.
            first = compute_status(isvc, observed, previous, replicas, now, planned, rollout)
            if self._write_status(body, original, first).status_written:
                self._report_problems(body, original, first)
            original = first
        for key in child_plan.delete:
            self.writer.delete(key[0], key[1], namespace)
        for manifest, outcome in self._apply_in_waves(child_plan.apply, namespace):
            if isinstance(outcome, APIError):
                if outcome.namespace_terminating:
                    log.info("%s/%s: namespace is being deleted; nothing to do", namespace, name)
                    return PassResult(0, 0, False)
                if not outcome.refused_for_good:
                    raise outcome
                # The spec passed admission but a child built from it did not (free-form
                # fields such as nodeSelector keys or affinity are checked only there).
                # Retrying cannot help until the spec changes: report it, do not raise.
                message = rejection_message(manifest, outcome)
                metrics.RECONCILE_ERRORS.labels(reason=str(outcome.status)).inc()
                new = invalid_status(
                    previous, meta.get("generation"), message, now, reason=CHILD_REJECTED
                )
                return self._write_status(body, original, new, CHILD_REJECTED, message)
            memory.remember(child_ref(outcome or manifest))
        writes = len(child_plan.apply) + len(child_plan.delete)
        metrics.CHILD_WRITES.inc(writes)
        if writes:
            log.info(
                "%s/%s: applied %s, deleted %d",
                namespace,
                name,
                [_described(m) for m in child_plan.apply],
                len(child_plan.delete),
            )
            self._record_changes(body, previous, applied, child_plan.apply, observed)

        new = compute_status(isvc, observed, previous, replicas, now, writes, rollout)
        new, preflight_after = self._preflight(body, isvc, observed, new, now)
        if rollout.rolling:
            # Nothing in the objects changes when a new pod turns Ready or the router's roll
            # ends beyond what the watches report; come back for what they cannot (the deadline).
            rollout_after: float | None = ROLLOUT_POLL_S
        else:
            rollout_after = None
        result = self._write_status(body, original, new, coalesce=True)
        if result.status_written:
            self._report_problems(body, original, new)
        pending = (requeue, autoscale_after, preflight_after, result.requeue_after_s, rollout_after)
        requeue = min((t for t in pending if t is not None), default=None)
        return PassResult(writes, len(child_plan.delete), result.status_written, requeue)

    def _report_rollout(
        self, body: Mapping[str, Any], previous: Mapping[str, Any] | None, rollout: RolloutPlan
    ) -> None:
        """An Event when a paired rollout starts, moves traffic, retires or ends."""
        before = (previous or {}).get("rollout") or {}
        phase = rollout.phase.value if rollout.rolling else None
        same = before.get("revision", rollout.target) == rollout.target
        if before.get("phase") == phase and same:
            return
        if phase is None:
            if before:
                self.writer.event(
                    body, "RolloutComplete", f"Revision {rollout.target} serves alone"
                )
            return
        message = f"{phase}: revision {rollout.target} (serving {rollout.router})"
        if rollout.waiting:
            message += f"; waiting for {rollout.waiting}"
        self.writer.event(body, f"Rollout{phase}", message)

    def _report_problems(
        self, body: Mapping[str, Any], old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> None:
        """A problem that turned True or names another cause goes out with the status that
        says so (reconcile/status.condition_events): a write that waits (progress
        coalescing) takes its Events along, instead of every pass meanwhile sending them."""
        for reason, message in condition_events(old, new):
            self.writer.event(body, reason, message, "Warning")

    def _apply_in_waves(
        self, manifests: Sequence[Manifest], namespace: str
    ) -> Iterator[tuple[Manifest, dict[str, Any] | APIError]]:
        """Apply each wave (plan.write_waves) at once, and yield every child with what the
        API server answered, in render order. A spec change rewrites both StatefulSets: one
        after the other, the second would wait for the first's answer.
        An error that is not the API server's answer is raised."""

        def apply(manifest: Manifest) -> dict[str, Any] | APIError:
            try:
                return self.writer.apply(manifest, namespace)
            except APIError as error:
                return error

        for wave in write_waves(manifests):
            outcomes = [apply(wave[0])] if len(wave) == 1 else self._writes.map(apply, wave)
            yield from zip(wave, outcomes, strict=True)

    def _autoscale(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        observed: Observed,
        previous: Mapping[str, Any] | None,
        now: datetime,
    ) -> dict[str, Any]:
        """The status as the autoscaler leaves it: decisions in status.<role>.desired, the
        autoscaler and slo blocks, and MetricsAvailable. Nothing else reads or writes here."""
        status = dict(previous or {})
        assert self.autoscaler is not None
        sleeps = isvc.spec.autoscaling.scale_to_zero is not None
        if sleeps:
            self._note_woken(body, observed, status)
        if not self.autoscaler.due(isvc):
            return status
        # The policy steps from the last decision (a pool being drained is already smaller).
        current = desired_replicas(isvc, status)
        if sleeps:
            change = self.autoscaler.sleep_or_wake(isvc, observed, current, status)
            if change is None:  # the activators' pages are being read
                return status
            status["scaleToZero"] = change.record
            if change.event is not None:
                self.writer.event(body, *change.event)
            if change.desired is not None:  # asleep, falling asleep or waking: not the policy's
                for role, count in change.desired.items():
                    status[role] = {**(status.get(role) or {}), "desired": count}
                return status
        outcome = self.autoscaler.step(isvc, observed, current, status, now)
        if outcome is None:  # its Prometheus read is in flight: a later pass decides
            return status
        for role, count in outcome.desired.items():
            status[role] = {**(status.get(role) or {}), "desired": count}
        status["autoscaler"] = outcome.autoscaler
        status["slo"] = outcome.slo
        status["conditions"] = merge_foreign_condition(
            status.get("conditions") or [], outcome.condition, isvc.metadata.generation, now
        )
        for type_, reason, message in outcome.events:
            self.writer.event(body, reason, message, type_)
        return status

    def _note_woken(
        self, body: Mapping[str, Any], observed: Observed, status: dict[str, Any]
    ) -> None:
        """Waking -> Awake on the first pass that sees a Ready prefill and decode (any pass:
        the wake time counts to it, not to the next autoscaler interval)."""
        assert self.autoscaler is not None
        ready = {role: role_replicas(observed, role, 0).ready for role in labels.WORKER_ROLES}
        change = woken(status.get("scaleToZero"), ready, self.autoscaler.wall_clock_s())
        if change is not None:
            status["scaleToZero"] = change.record
            if change.event is not None:
                self.writer.event(body, *change.event)

    def _preflight(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        observed: Observed,
        status: dict[str, Any],
        now: datetime,
    ) -> tuple[dict[str, Any], float | None]:
        memory = self._memories.of((str(isvc.metadata.namespace), str(isvc.metadata.name)))
        this = Pass(body, isvc, observed, now, memory)
        return preflight_step(this, status, self.writer, self._preflight_runner)

    def _write_status(
        self,
        body: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        new: Mapping[str, Any],
        event_reason: str | None = None,
        event_message: str = "",
        coalesce: bool = False,
    ) -> PassResult:
        """Write `new` if it changed anything; with `coalesce`, a change that is only progress
        waits out the interval after the last write (STATUS_COALESCE_S, longer for a start-up
        while many services start), and the pass asks to come back. The operator's gauges
        show `new` either way: the alerts read a service's conditions there."""
        meta = body["metadata"]
        metrics.export_status(meta["namespace"], meta["name"], new)
        if not status_changed(previous, new):
            return PassResult(0, 0, False)
        key = (meta["namespace"], meta["name"])
        now = time.monotonic()
        ready = condition_status(new, READY) == "True"
        if coalesce and progress_only(previous, new):
            interval = STATUS_COALESCE_S
            if not ready:
                interval = progress_interval_s(
                    self._memories.unready(), STATUS_COALESCE_S, STARTUP_PROGRESS_PER_S,
                    STARTUP_COALESCE_MAX_S,
                )  # fmt: skip
            wait = self._memories.of(key).status_at + interval - now
            if wait > 0:
                return PassResult(0, 0, False, requeue_after_s=wait)
        self.writer.patch_status(meta["namespace"], meta["name"], _status_patch(previous, new))
        self._memories.status_written(key, dict(new), ready)
        metrics.STATUS_WRITES.inc()
        if event_reason and condition_status(previous, "SpecValid") != "False":
            self.writer.event(body, event_reason, event_message, "Warning")
        return PassResult(0, 0, True)

    def _record_changes(
        self,
        body: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        replicas: Mapping[str, int],
        applied: list[dict[str, Any]],
        observed: Observed,
    ) -> None:
        """Events for what a user cares about: children created, pools resized, rollouts.

        Children created in one pass share one Event: a new service has a dozen, and an Event
        each would be nearly half the API writes of creating a fleet."""
        created = [
            f"{m['kind']} {m['metadata']['name']}"
            for m in applied
            if observed.child(m["kind"], m["metadata"]["name"]) is None
        ]
        if created:
            self.writer.event(body, "Created", "Created " + ", ".join(created))
        for manifest in applied:
            kind, child = manifest["kind"], manifest["metadata"]["name"]
            ref = observed.child(kind, child)
            if ref is None:
                continue
            if kind == "StatefulSet":
                role = manifest["metadata"]["labels"][labels.ROLE]
                if ref.replicas != replicas[role]:
                    self.writer.event(
                        body, "Scaled", f"Scaled {role} from {ref.replicas} to {replicas[role]}"
                    )
                else:
                    self.writer.event(body, "Updated", f"Updated {kind} {child}")
            else:
                self.writer.event(body, "Updated", f"Updated {kind} {child}")
