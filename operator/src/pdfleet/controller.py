"""One reconcile pass for one InferenceService: validate, plan, write what changed, report.

The kopf handlers (handlers.py) call `Controller.reconcile()` from every trigger: the
InferenceService's own watch events (create, update, and the initial listing on resume), its
children's events, and a periodic timer. The pass is level-based and idempotent: it derives
everything from the spec and the observed children, so running it twice changes nothing, and
an unchanged service costs no API writes.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic
from kubernetes.client.exceptions import ApiException

from pdfleet import httpclient, labels, metrics
from pdfleet.api.rules import error_paths
from pdfleet.api.types import parse_duration
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.autoscale.actuator import Autoscaler
from pdfleet.drain.executor import execute as execute_drain
from pdfleet.drain.io import RouterFleet, read_loads, router_replicas
from pdfleet.drain.plan import (
    Action,
    Kind,
    Stage,
    needs_io,
    plan_drain,
    worker_url,
)
from pdfleet.kube.api import KubeWriter
from pdfleet.preflight import io as preflight_io
from pdfleet.preflight import plan as preflight
from pdfleet.reconcile.observed import (
    ChildRef,
    Observed,
    PodInfo,
    child_ref,
    index_lags,
    overlay,
    with_marks,
)
from pdfleet.reconcile.plan import RenderCache, desired_replicas, plan, write_waves
from pdfleet.reconcile.status import (
    READY,
    compute_status,
    condition_events,
    invalid_status,
    merge_foreign_condition,
    progress_interval_s,
    progress_only,
    status_changed,
)
from pdfleet.render import Manifest, RenderConfig
from pdfleet.render.common import child_name
from pdfleet_worker.preflight.plan import PreflightResult, failed

log = logging.getLogger(__name__)

# How long a child we wrote stands in for the watch index's copy (which lags by a moment);
# long enough for any watch event, short enough that a child deleted meanwhile comes back.
RECENT_WRITE_S = 10.0
# How long a written workload is remembered: its generation tells a lagging index from a
# newer object (reconcile/observed.index_lags), so it can stand in for as long as the lag.
WRITTEN_KEEP_S = 300.0
INDEX_LAG_WARN_S = 5.0
# A status change that is only progress (pod counts, and the steps of a start-up while Ready
# stays False: reconcile/status.progress_only) waits until this long after the service's last
# status write, and goes out then with the state of that moment. Ready flipping, a problem
# (Stalled, SpecValid), a decision or a preflight record is written at once. With 1 s, most
# of 1,000 services created at once wrote their status 5 or 6 times on the way to Ready
# (created, pods appearing, pods ready, Ready, the preflight verdict); with 5 s, 20 services
# wrote 3 times each, the counts riding on the Ready write (docs/benchmarks/scale).
STATUS_COALESCE_S = 5.0
# Many services starting at once (a fleet applied in one go) make start-ups slow, their steps
# more than STATUS_COALESCE_S apart: with 5 s, 1,000 services still wrote 5 or 6 times each,
# writes that compete with their children's at the API server. So a start-up's progress waits
# longer the more services are starting, keeping their progress together under
# STARTUP_PROGRESS_PER_S writes a second (reconcile/status.progress_interval_s); a lone
# start-up keeps STATUS_COALESCE_S, and no start-up waits more than STARTUP_COALESCE_MAX_S.
STARTUP_PROGRESS_PER_S = 5.0
STARTUP_COALESCE_MAX_S = 60.0
# Child writes in flight at once, over all passes (the API client's connection pool is sized
# for these, the passes' own status writes and the lease).
WRITES_IN_FLIGHT = 8
# How soon a pass looks again at a preflight run it left in flight.
PREFLIGHT_POLL_S = 1.0
# API answers that refuse a child until someone changes the spec (400, 422: malformed or
# invalid) or the operator's rights (403: e.g. a chart older than a kind the spec asks for):
# retrying at once cannot help, the periodic resync tries again.
REJECTED = (400, 403, 422)
CHILD_REJECTED = "ChildRejected"
TYPED_PATCH_FAILURE = "failed to create typed patch object"

# How long a reported drain is remembered (its Event and metric are recorded once).
REPORTED_KEEP_S = 3600.0

# While a pool drains, the next pass comes this soon: in-flight gauges change no Kubernetes
# object, so no watch event would wake the controller when a worker goes idle.
DRAIN_POLL_S = 0.5


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


def _condition_status(status: Mapping[str, Any] | None, kind: str) -> str | None:
    for condition in (status or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return None


def is_rejection(error: ApiException) -> bool:
    """Whether the API server refused a child for good (retrying cannot help)."""
    if error.status in REJECTED:
        return True
    # Server-side apply answers 500, not 422, when the applied object does not fit the
    # schema at all (a string where a map belongs, an unknown field in a free-form part).
    return error.status == 500 and TYPED_PATCH_FAILURE in str(error.body or "")


def namespace_terminating(error: ApiException) -> bool:
    """Whether a write was refused because its namespace is being deleted: the service goes
    with it, so there is nothing to report or retry."""
    if error.status != 403:
        return False
    try:
        causes = (json.loads(error.body or "{}").get("details") or {}).get("causes") or ()
    except (ValueError, AttributeError):
        return False
    return any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes)


def rejection_message(manifest: Mapping[str, Any], error: ApiException) -> str:
    """'<Kind> <name>: <the API server's message>' for a child the API server refused."""
    try:
        detail = str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        detail = str(error.reason)
    return f"{manifest['kind']} {manifest['metadata']['name']}: {detail}"[:2000]


def _status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (dropped keys become null)."""
    return {**{key: None for key in (old or {}) if key not in new}, **new}


@dataclass(frozen=True)
class _PreflightRun:
    """A preflight run in flight for one service: which spec and pods it measures."""

    fingerprint: str
    pair: tuple[PodInfo, PodInfo]
    result: Future[PreflightResult]


class Controller:
    """Reconciles InferenceServices through a KubeWriter. Thread-safe per object."""

    def __init__(
        self,
        writer: KubeWriter,
        config: RenderConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        autoscaler: Autoscaler | None = None,
        preflight_runner: Executor | None = None,
    ):
        self.writer = writer
        self.autoscaler = autoscaler
        self.config = config or RenderConfig()
        self.clock = clock
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._written: dict[tuple[str, str], dict[tuple[str, str], tuple[ChildRef, float]]] = {}
        # The last status this operator wrote per service, with when (monotonic), kept while
        # it may stand in for the watch index's copy (RECENT_WRITE_S).
        self._status_written: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}
        # When each service's status was last written (monotonic), and the services whose
        # last written status is not Ready: how long a start-up's progress waits.
        self._status_at: dict[tuple[str, str], float] = {}
        self._unready: set[tuple[str, str]] = set()
        self._marks: dict[tuple[str, str], dict[str, tuple[str | None, float]]] = {}
        self._rendered = RenderCache()
        # Drains already reported (Event + metric), by service: the StatefulSet's lowered
        # count may reach the watch index a pass late, and the report must not repeat.
        self._reported: dict[tuple[str, str], dict[tuple[str, str], float]] = {}
        # The last KV transport preflight per service: (fingerprint, monotonic time).
        self._preflight_tried: dict[tuple[str, str], tuple[str, float]] = {}
        # Runs in flight: a run can take seconds (UCX set-up, a slow fabric) up to its
        # timeout, and the service's passes (drains, scale-ups) must not wait for it.
        self._preflight_runs: dict[tuple[str, str], _PreflightRun] = {}
        # Shared by every pass: a wave of one pass's children goes out at once, and the pool
        # bounds the operator's writes in flight (connections to the API server).
        self._writes = ThreadPoolExecutor(max_workers=WRITES_IN_FLIGHT, thread_name_prefix="apply")
        self._preflight_runner = preflight_runner or ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="preflight"
        )

    def _remember(self, key: tuple[str, str], ref: ChildRef) -> None:
        self._written.setdefault(key, {})[(ref.kind, ref.name)] = (ref, time.monotonic())

    def _recent_writes(self, key: tuple[str, str]) -> dict[tuple[str, str], tuple[ChildRef, float]]:
        """Children this operator wrote, with their age (see observed.overlay)."""
        now = time.monotonic()
        live = {k: v for k, v in self._written.get(key, {}).items() if now - v[1] < WRITTEN_KEEP_S}
        self._written[key] = live
        return {k: (ref, now - at) for k, (ref, at) in live.items()}

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

    def _remember_marks(self, key: tuple[str, str], actions: Sequence[Action]) -> None:
        """Drain marks this operator just wrote on pods (the pod index shows them late; a
        pass that missed its own mark would mark again and restart the drain clock)."""
        expires = time.monotonic() + RECENT_WRITE_S
        marks = self._marks.setdefault(key, {})
        for action in actions:
            if action.kind is Kind.MARK:
                marks[action.pod] = (action.since, expires)
            elif action.kind in (Kind.UNMARK, Kind.RECREATE):
                marks[action.pod] = (None, expires)

    def _recent_marks(self, key: tuple[str, str]) -> dict[str, str | None]:
        now = time.monotonic()
        live = {pod: v for pod, v in self._marks.get(key, {}).items() if v[1] > now}
        self._marks[key] = live
        return {pod: since for pod, (since, _) in live.items()}

    def _recent_status(self, key: tuple[str, str]) -> dict[str, Any] | None:
        written = self._status_written.get(key)
        if written is None or time.monotonic() - written[1] > RECENT_WRITE_S:
            self._status_written.pop(key, None)
            return None
        return written[0]

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        metrics.forget_service(namespace, name)
        if self.autoscaler is not None:
            self.autoscaler.forget(namespace, name)
        self._rendered.forget(namespace, name)
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
            self._reported.pop((namespace, name), None)
            self._written.pop((namespace, name), None)
            self._status_written.pop((namespace, name), None)
            self._status_at.pop((namespace, name), None)
            self._unready.discard((namespace, name))
            self._marks.pop((namespace, name), None)
            self._preflight_tried.pop((namespace, name), None)
            self._preflight_runs.pop((namespace, name), None)

    def reconcile(self, body: Mapping[str, Any], observed: Observed) -> PassResult:
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        if meta.get("deletionTimestamp"):
            # Children go with the owner through garbage collection.
            return PassResult(0, 0, False)
        started = time.monotonic()
        with self._lock(namespace, name):
            try:
                return self._reconcile(body, observed)
            except ApiException as error:
                metrics.RECONCILE_ERRORS.labels(reason=str(error.status)).inc()
                raise
            finally:
                metrics.RECONCILE_DURATION.observe(time.monotonic() - started)

    def _reconcile(self, body: Mapping[str, Any], observed: Observed) -> PassResult:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        # The watch index shows our last status write a moment late; a pass that started from
        # the older status would undo the autoscaler's latest decision.
        previous = self._recent_status((namespace, name)) or body.get("status")
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
        ours = self._recent_writes((namespace, name))
        self._report_index_lag(namespace, name, observed, ours)
        observed = overlay(observed, ours, RECENT_WRITE_S)
        original = previous
        autoscale_after: float | None = None
        if isvc.spec.autoscaling.enabled and self.autoscaler is not None:
            previous = self._autoscale(body, isvc, observed, previous, now)
            # When the next step is due, not a full interval after this pass: the latest pass's
            # come-back replaces the one before (handlers.WorkQueue.come_back).
            autoscale_after = self.autoscaler.come_back_s(isvc)
        applied, requeue = self._drain(body, isvc, observed, desired_replicas(isvc, previous))
        replicas, child_plan = plan(isvc, observed, previous, self.config, applied, self._rendered)
        planned = len(child_plan.apply) + len(child_plan.delete)
        if planned and not (original or {}).get("observedGeneration"):
            # A service's first status goes out before its children: until a status shows
            # observedGeneration, kstatus (Flux, kubectl wait --for) reads a custom resource
            # as Current, and a burst of creations queues the passes that write a dozen
            # children each. It is the status the end of this pass would write, so that
            # write is then skipped, not repeated.
            first = compute_status(isvc, observed, previous, replicas, now, planned)
            if self._write_status(body, original, first).status_written:
                self._report_problems(body, original, first)
            original = first
        for key in child_plan.delete:
            self.writer.delete(key[0], key[1], namespace)
        for manifest, outcome in self._apply_in_waves(child_plan.apply, namespace):
            if isinstance(outcome, ApiException):
                if namespace_terminating(outcome):
                    log.info("%s/%s: namespace is being deleted; nothing to do", namespace, name)
                    return PassResult(0, 0, False)
                if not is_rejection(outcome):
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
            self._remember((namespace, name), child_ref(outcome or manifest))
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

        new = compute_status(isvc, observed, previous, replicas, now, writes)
        new, preflight_after = self._preflight(body, isvc, observed, new, now)
        metrics.export_status(namespace, name, new)
        result = self._write_status(body, original, new, coalesce=True)
        if result.status_written:
            self._report_problems(body, original, new)
        pending = (requeue, autoscale_after, preflight_after, result.requeue_after_s)
        requeue = min((t for t in pending if t is not None), default=None)
        return PassResult(writes, len(child_plan.delete), result.status_written, requeue)

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
    ) -> Iterator[tuple[Manifest, dict[str, Any] | ApiException]]:
        """Apply each wave (plan.write_waves) at once, and yield every child with what the
        API server answered, in render order. A spec change rewrites both StatefulSets: one
        after the other, the second waited for the first's answer (docs/benchmarks/scale).
        An error that is not the API server's answer is raised."""

        def apply(manifest: Manifest) -> dict[str, Any] | ApiException:
            try:
                return self.writer.apply(manifest, namespace)
            except ApiException as error:
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
        if not self.autoscaler.due(isvc):
            return status
        # The policy steps from the last decision (a pool being drained is already smaller).
        current = desired_replicas(isvc, status)
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

    def _preflight(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        observed: Observed,
        status: dict[str, Any],
        now: datetime,
    ) -> tuple[dict[str, Any], float | None]:
        """status.kvTransport and KVTransportReady after a KV transport preflight, when one is
        due (pdfleet.preflight.plan); and when to come back to retry a run that failed.

        The run is one HTTP call to a decode pod, which READs from a prefill pod over NIXL. It
        runs beside the passes (`preflight_runner`): a pass starts it when due and a later
        pass (every PREFLIGHT_POLL_S meanwhile) records its outcome."""
        record = status.get("kvTransport")
        key = (str(isvc.metadata.namespace), str(isvc.metadata.name))
        if not isvc.spec.kv_transfer.preflight.enabled:
            self._preflight_runs.pop(key, None)
            return preflight.cleared(status), None
        fingerprint = preflight.fingerprint(isvc)
        run = self._preflight_runs.get(key)
        if run is None or run.fingerprint != fingerprint:  # none in flight for this spec
            since = self._since_attempt(key, fingerprint)
            ready = _condition_status(status, READY) == "True"
            pair = preflight.pick_pair(observed)
            if pair is None or not preflight.due(isvc, ready, record, since, fingerprint):
                return status, preflight.retry_after_s(record, since)
            self._preflight_tried[key] = (fingerprint, time.monotonic())
            run = self._start_preflight(isvc, fingerprint, pair)
            self._preflight_runs[key] = run
        if not run.result.done():
            return status, PREFLIGHT_POLL_S
        del self._preflight_runs[key]
        since = self._since_attempt(key)
        pair = run.pair
        try:
            result = run.result.result()
        except Exception as err:  # the run's own failure is a result, never a failed pass
            result = failed(f"preflight run: {type(err).__name__}: {err}")
        verdict = preflight.verdict(isvc, result, pair)
        new_record = preflight.record(isvc, result, pair, now)
        if preflight.same_outcome(record, new_record):
            return status, preflight.retry_after_s(new_record, since)
        if preflight.news(status, record, new_record, verdict):
            kind = "Normal" if verdict.status else "Warning"
            self.writer.event(body, f"KVTransport{verdict.reason}", verdict.message, kind)
        log.info(
            "%s/%s KV transport preflight: %s %s",
            isvc.metadata.namespace,
            isvc.metadata.name,
            verdict.reason,
            verdict.message,
        )
        conditions = merge_foreign_condition(
            status["conditions"], verdict.condition, isvc.metadata.generation, now
        )
        new = {**status, "kvTransport": new_record, "conditions": conditions}
        return new, preflight.retry_after_s(new_record, since)

    def _since_attempt(self, key: tuple[str, str], fingerprint: str | None = None) -> float | None:
        """Seconds since this operator last started a preflight of the service (of that
        fingerprint, when given); None when it has not."""
        tried = self._preflight_tried.get(key)
        if tried is None or (fingerprint is not None and tried[0] != fingerprint):
            return None
        return time.monotonic() - tried[1]

    def _start_preflight(
        self, isvc: InferenceService, fingerprint: str, pair: tuple[PodInfo, PodInfo]
    ) -> _PreflightRun:
        prefill, decode = pair
        assert decode.pod_ip is not None
        port = isvc.spec.kv_transfer.preflight.port
        url = preflight.listener_url(decode.pod_ip, port) + "/preflight/run"
        body = preflight.request(isvc, prefill)
        future = self._preflight_runner.submit(preflight_io.run, url, body, preflight.RUN_TIMEOUT_S)
        return _PreflightRun(fingerprint, pair, future)

    def _drain(
        self,
        body: Mapping[str, Any],
        isvc: InferenceService,
        observed: Observed,
        desired: Mapping[str, int],
    ) -> tuple[dict[str, int], float | None]:
        """Replica counts to apply while pools drain (pdfleet.drain), and when to come back.

        Router and worker HTTP happen only while a pool is shrinking or has marked pods: an
        idle service costs no I/O and no API write here."""
        key = (str(body["metadata"]["namespace"]), str(body["metadata"]["name"]))
        observed = with_marks(observed, self._recent_marks(key))
        applied = dict(desired)
        active = {}
        for role in labels.WORKER_ROLES:
            ref = observed.child("StatefulSet", child_name(isvc, role))
            current = ref.replicas if ref is not None else None
            if needs_io(desired[role], current, observed.pods_of(role)):
                active[role] = current
        if not active:
            return applied, None
        router = isvc.spec.router
        ips = [
            p.pod_ip
            for p in observed.pods_of(labels.ROLE_ROUTER)
            if p.pod_ip and p.phase == "Running" and not p.terminating
        ]
        if router.type != "vllm-router":
            ips = []  # an external gateway: only the workers' own gauges can be read
        fleet = RouterFleet(
            router_replicas(ips, router.port, router.metrics_port), client=httpclient.shared()
        )
        port = isvc.spec.engine.port
        timeout_s = parse_duration(isvc.spec.drain.timeout)
        now = self.clock()
        requeue: float | None = None
        namespace = key[0]
        # Keyed by (pod, drain start), which never repeats; kept for a while rather than
        # pruned to the pods seen this pass, so an index that briefly misses a pod cannot
        # make its drain be reported twice.
        reported = {
            k: at
            for k, at in self._reported.get(key, {}).items()
            if time.monotonic() - at < REPORTED_KEEP_S
        }
        try:
            # One reading for both pools: the routers are asked once per pass, and the
            # workers all at once (drain/io.read_loads), so a pass stays short under load.
            marked = {
                p.name: (url, role)
                for role in active
                for p in observed.pods_of(role)
                if p.draining_since and not p.terminating and (url := worker_url(p, port))
            }
            loads = read_loads(fleet, marked)
            for role, current in active.items():
                pods = observed.pods_of(role)
                drain = plan_drain(
                    role, desired[role], current, pods, loads, now, timeout_s, port,
                    finished=reported.keys(),
                )  # fmt: skip
                outcome = execute_drain(drain, role, namespace, body, self.writer, fleet)
                self._remember_marks(key, drain.actions)
                reported.update(
                    ((a.pod, a.since or ""), time.monotonic()) for a in outcome.finished
                )
                applied[role] = drain.replicas
                if drain.actions or drain.active:
                    requeue = DRAIN_POLL_S
                    waiting = {
                        pod: loads[pod].holding(role)
                        for pod, stage in drain.stages.items()
                        if stage is Stage.DEREGISTERED and pod in loads
                    }
                    log.info(
                        "%s/%s %s drain: replicas %s -> %s, stages %s, deregistered %s, "
                        "failed %s, waiting on %s",
                        isvc.metadata.namespace,
                        isvc.metadata.name,
                        role,
                        current,
                        drain.replicas,
                        {k: v.value for k, v in drain.stages.items()},
                        list(outcome.deregistered),
                        list(outcome.failed),
                        waiting,
                    )
        finally:
            fleet.close()
            self._reported[key] = reported
        return applied, requeue

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
        while many services start), and the pass asks to come back."""
        if not status_changed(previous, new):
            return PassResult(0, 0, False)
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        now = time.monotonic()
        ready = _condition_status(new, READY) == "True"
        if coalesce and progress_only(previous, new):
            interval = STATUS_COALESCE_S
            if not ready:
                interval = progress_interval_s(
                    len(self._unready), STATUS_COALESCE_S, STARTUP_PROGRESS_PER_S,
                    STARTUP_COALESCE_MAX_S,
                )  # fmt: skip
            wait = self._status_at.get(key, -math.inf) + interval - now
            if wait > 0:
                return PassResult(0, 0, False, requeue_after_s=wait)
        self.writer.patch_status(meta["namespace"], meta["name"], _status_patch(previous, new))
        self._status_written[key] = (dict(new), now)
        self._status_at[key] = now
        if ready:
            self._unready.discard(key)
        else:
            self._unready.add(key)
        metrics.STATUS_WRITES.inc()
        if event_reason and _condition_status(previous, "SpecValid") != "False":
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
        each was nearly half the API writes of creating a fleet (docs/benchmarks/scale)."""
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
