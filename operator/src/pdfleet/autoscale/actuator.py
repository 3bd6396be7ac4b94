"""The operator side of autoscaling: spec -> PolicyConfig, Prometheus -> decision -> status.

Where it fits: the controller calls `Autoscaler.step()` inside a reconcile pass of a service
with autoscaling enabled, once per `spec.autoscaling.interval`. The step's Prometheus reads run
beside the passes, on threads of that Prometheus URL (`WindowReads`): a pass starts a read
and a later pass decides with its answer, so a Prometheus that never answers holds up no
pass, and costs the services that use it, not the others. The decision lands in status
(`status.<role>.desired`, `status.autoscaler`, `status.slo`, the `MetricsAvailable` condition)
and, through the same pass, in the StatefulSets (scale-down through the drain path). The spec
is never written. The policy's memory (recent decisions, the learned capacity) lives here, per
service; after an operator restart it is relearned, and the stabilization windows restart
from the last decision time recorded in status.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import httpx

from pdfleet import httpclient, labels, metrics
from pdfleet.api.types import format_duration, parse_duration
from pdfleet.api.v1alpha1 import CapacityHintSpec, InferenceService, SLOStatus
from pdfleet.autoscale import idle
from pdfleet.autoscale.attainment import slo_attainment
from pdfleet.autoscale.policy import (
    Decision,
    MetricsWindow,
    PolicyConfig,
    RoleReplicas,
    decide,
    decode_latency,
    following_scale_down_window,
    trim_history,
)
from pdfleet.reconcile.observed import Observed

log = logging.getLogger(__name__)

METRICS_AVAILABLE = "MetricsAvailable"
BUDGET_LIMITED = "BudgetLimited"


class MetricsSource(Protocol):
    def window(
        self, namespace: str, service: str, now_s: float, percentile: float, window_s: float
    ) -> MetricsWindow: ...


def policy_config(isvc: InferenceService, kv_transfer_s: float = 0.0) -> PolicyConfig:
    """The policy's view of a spec. One percentile feeds both latency queries: the higher of
    the two SLO percentiles, so neither target is judged more leniently than written."""
    spec = isvc.spec
    assert spec.slo is not None  # admission requires slo when autoscaling is enabled
    auto = spec.autoscaling
    hint = auto.capacity_hint or CapacityHintSpec()
    config = PolicyConfig(
        startup_s=parse_duration(auto.worker_startup),
        ttft_target_s=spec.slo.ttft.seconds,
        itl_target_s=spec.slo.itl.seconds,
        percentile=max(spec.slo.ttft.percentile, spec.slo.itl.percentile),
        prefill_min=spec.prefill.replicas.min,
        prefill_max=spec.prefill.replicas.max,
        decode_min=spec.decode.replicas.min,
        decode_max=spec.decode.replicas.max,
        prefill_gpus_per_replica=spec.prefill.gpus_per_replica,
        decode_gpus_per_replica=spec.decode.gpus_per_replica,
        gpu_budget=auto.gpu_budget,
        interval_s=parse_duration(auto.interval),
        scale_up_stabilization_s=parse_duration(auto.scale_up_stabilization),
        max_scale_up_step=auto.max_scale_up_step,
        max_scale_down_step=auto.max_scale_down_step,
        prefill_capacity_prior=_optional_float(hint.prefill_prompt_tokens_per_second),
        decode_capacity_prior=_optional_float(hint.decode_generated_tokens_per_second),
        kv_transfer_s=kv_transfer_s,
    )
    # the policy's memory follows the user's scale-down window
    return following_scale_down_window(config, parse_duration(auto.scale_down_stabilization))


def _optional_float(value: int | None) -> float | None:
    return float(value) if value is not None else None


def measured_kv_transfer_s(status: Mapping[str, Any] | None) -> float:
    """The KV transport preflight's expected transfer time of a typical prompt (0 without a
    successful measurement)."""
    record = (status or {}).get("kvTransport") or {}
    expected = record.get("expectedTransferSeconds")
    return float(expected) if expected is not None and not record.get("error") else 0.0


def role_replicas(observed: Observed, role: str, current: int) -> RoleReplicas:
    pods = [p for p in observed.pods_of(role) if not p.terminating]
    ready = sum(1 for p in pods if p.ready and not p.draining_since)
    return RoleReplicas(
        current=current, ready=ready, pending=sum(1 for p in pods if p.unschedulable)
    )


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _measured(value: float, target: float) -> str:
    shown = "n/a" if math.isnan(value) else format_duration(value)
    return f"{shown}/{format_duration(target)}"


def describe(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """ "prefill 2->3, decode 4" style summary of a decision."""
    parts = []
    for role in labels.WORKER_ROLES:
        old, new = before[role], after[role]
        parts.append(f"{role} {old}->{new}" if old != new else f"{role} {new}")
    return ", ".join(parts)


def decision_reason(decision: Decision, latency_s: float, target_s: float) -> str:
    """One pool's reason in pdfleet_autoscaler_decisions_total, from a short fixed list: the
    policy's reasons are sentences with figures in them, a new series for nearly every
    decision. A hold without usable metrics says why (MetricsMissing, MetricsStale,
    MetricsNaN); otherwise OverTarget (the pool's latency, as in status.slo, is over its
    target), GPUBudget (the budget bounded the decision) or Load (sized on load and the
    learned capacity)."""
    conditions = {c.type: c for c in decision.conditions}
    available = conditions.get(METRICS_AVAILABLE)
    if available is not None and available.status != "True":
        return available.reason
    if latency_s > target_s:
        return "OverTarget"
    budget = conditions.get(BUDGET_LIMITED)
    return "GPUBudget" if budget is not None and budget.status == "True" else "Load"


@dataclass(frozen=True)
class AutoscaleOutcome:
    """What one decision changes: desired counts and the status fields the autoscaler owns."""

    desired: dict[str, int]
    autoscaler: dict[str, Any]
    slo: dict[str, Any]
    condition: dict[str, str]
    events: tuple[tuple[str, str, str], ...]
    """(type, reason, message) Events to record on the InferenceService."""
    attainment: dict[str, float]
    """Estimated SLO attainment per SLO (`attainment.SLOS`), NaN where unknown."""
    reasons: dict[str, str]
    """Per pool, the decision's reason for the decisions counter (`decision_reason`)."""


def metrics_message(
    reason: str, window: MetricsWindow | None, now_s: float, config: PolicyConfig
) -> str:
    """What a user can act on when the window cannot be trusted: the read's own error, the
    roles without series, the age of a stale answer."""
    if window is not None and window.problem:
        return window.problem
    if reason == "MetricsMissing":
        missing = [r for r in labels.WORKER_ROLES if window is None or getattr(window, r) is None]
        return (
            f"Prometheus has no series for the {' and '.join(missing)} pods: are they "
            "scraped (docs/monitoring.md)?"
        )
    if reason == "MetricsStale" and window is not None:
        return (
            f"the newest answer is {format_duration(now_s - window.at_s)} old "
            f"(limit {format_duration(config.metrics_max_age_s)}): is Prometheus evaluating?"
        )
    if reason == "MetricsNaN":
        return "a signal is NaN, infinite or negative: check the scrape of the worker pods"
    return reason


def outcome_of(
    decision: Decision,
    before: Mapping[str, int],
    window: MetricsWindow | None,
    config: PolicyConfig,
    previous: Mapping[str, Any],
    now: datetime,
    now_s: float = math.nan,
    previous_condition: Mapping[str, Any] | None = None,
) -> AutoscaleOutcome:
    """Pure: turn a policy decision into status fields and Events.

    Figures from a window that cannot be trusted (stale, missing) are not shown as measured.
    MetricsUnavailable is an Event when metrics become unavailable or the reason changes,
    not on every decision while they stay so."""
    available = next((c for c in decision.conditions if c.type == METRICS_AVAILABLE), None)
    usable = available is None or available.status == "True"
    desired = {labels.ROLE_PREFILL: decision.prefill, labels.ROLE_DECODE: decision.decode}
    reason = "; ".join(decision.reasons) or "steady"
    autoscaler = {**dict(previous), "lastDecision": describe(before, desired), "reason": reason,
                  "lastDecisionTime": _stamp(now)}  # fmt: skip
    events: list[tuple[str, str, str]] = []
    if any(desired[r] > before[r] for r in desired):
        autoscaler["lastScaleUpTime"] = _stamp(now)
    if any(desired[r] < before[r] for r in desired):
        autoscaler["lastScaleDownTime"] = _stamp(now)
    if desired != dict(before):
        events.append(("Normal", "Autoscaled", f"{describe(before, desired)}: {reason}"))
    shown = window if usable else None
    ttft = shown.prefill.ttft_s if shown and shown.prefill else math.nan
    itl = math.nan
    if shown and shown.decode:
        # what the policy judges decode on; 0 is "neither signal known"
        itl = decode_latency(shown.decode) or math.nan
    attainment = slo_attainment(
        shown.ttft_buckets if shown else (),
        shown.tpot_buckets if shown else (),
        config.ttft_target_s,
        config.itl_target_s,
    )
    slo = SLOStatus(
        ttft=_measured(ttft, config.ttft_target_s),
        itl=_measured(itl, config.itl_target_s),
        window=format_duration(shown.window_s) if shown else "",
        ttft_seconds=None if math.isnan(ttft) else round(ttft, 4),
        itl_seconds=None if math.isnan(itl) else round(itl, 4),
        attainment=None if math.isnan(attainment["both"]) else round(attainment["both"], 4),
    ).wire()
    condition = {"type": METRICS_AVAILABLE, "status": "True", "reason": "MetricsFresh",
                 "message": "the latency and load signals are fresh"}  # fmt: skip
    if available is not None and not usable:
        message = available.message or metrics_message(available.reason, window, now_s, config)
        condition = {"type": METRICS_AVAILABLE, "status": available.status,
                     "reason": available.reason, "message": message}  # fmt: skip
    was = previous_condition or {}
    if condition["status"] != "True" and (
        was.get("status") != condition["status"] or was.get("reason") != condition["reason"]
    ):
        events.append(
            ("Warning", "MetricsUnavailable", f"{condition['reason']}: {condition['message']}")
        )
    elif condition["status"] == "True" and was.get("status") == "False":
        events.append(("Normal", "MetricsAvailable", condition["message"]))
    reasons = {
        labels.ROLE_PREFILL: decision_reason(decision, ttft, config.ttft_target_s),
        labels.ROLE_DECODE: decision_reason(decision, itl, config.itl_target_s),
    }
    return AutoscaleOutcome(desired, autoscaler, slo, condition, tuple(events), attainment, reasons)


# A window read that takes longer than this is given up: the step holds and says so. Each
# query has its own timeout; this bounds the read as a whole (a Prometheus that answers
# byte by byte, or whose threads are all taken by reads of other services).
READ_DEADLINE_S = 10.0
# How soon a pass looks again at a read it left in flight.
READ_POLL_S = 0.5
# Window reads of one Prometheus at once: a slow one queues the reads of the services that
# use it, never those of another Prometheus.
READS_PER_PROMETHEUS = 2

Key = tuple[str, str]
T = TypeVar("T")


@dataclass(frozen=True)
class _Read(Generic[T]):
    started_s: float
    result: Future[T]


class WindowReads(Generic[T]):
    """Reads beside the reconcile passes (a metrics window, the activators' pages): at most
    one in flight per service, run on threads of the source's URL (`READS_PER_PROMETHEUS`)."""

    def __init__(self, executor_for: Callable[[str], Executor] | None = None) -> None:
        self._executor_for = executor_for or self._threads_for
        self._executors: dict[str, Executor] = {}
        self._reads: dict[Key, _Read[T]] = {}
        self._lock = threading.Lock()

    def _threads_for(self, url: str) -> Executor:
        with self._lock:
            if url not in self._executors:
                self._executors[url] = ThreadPoolExecutor(
                    max_workers=READS_PER_PROMETHEUS, thread_name_prefix="prometheus"
                )
            return self._executors[url]

    def get(self, key: Key) -> _Read[T] | None:
        with self._lock:
            return self._reads.get(key)

    def start(self, key: Key, url: str, read: Callable[[], T], now_s: float) -> _Read[T]:
        started = _Read(now_s, self._executor_for(url).submit(read))
        with self._lock:
            self._reads[key] = started
        return started

    def forget(self, key: Key) -> None:
        with self._lock:
            self._reads.pop(key, None)


# The activators' pages: every service's reads share this pool, each page a short GET (a hung
# activator costs its own service a timeout, the others a place in the queue).
ACTIVATOR_POOL = "activators"
ACTIVATOR_TIMEOUT = httpx.Timeout(1.0)

Pod = tuple[str, str | None]
"""(name, pod IP) of an activator pod."""


def read_activator_pages(
    pods: Sequence[Pod], port: int, client: httpx.Client | None = None
) -> idle.ActivatorReading:
    """GET every activator pod's /metrics; a pod that cannot be read is named, with why."""
    client = client or httpclient.shared()
    samples: list[idle.ActivatorSample] = []
    unread: list[str] = []
    for name, ip in pods:
        if not ip:
            unread.append(f"{name}: no pod IP yet")
            continue
        url = httpx.URL(scheme="http", host=ip, port=port, path="/metrics")
        try:
            response = client.get(url, timeout=ACTIVATOR_TIMEOUT)
            response.raise_for_status()
            samples.append(idle.parse_sample(response.text))
        except (httpx.HTTPError, ValueError) as error:
            unread.append(f"{name}: {type(error).__name__}: {error}")
    return idle.ActivatorReading(tuple(samples), tuple(unread))


def _answer(read: _Read[MetricsWindow], url: str) -> MetricsWindow | str:
    """The window a finished read got, or what went wrong."""
    try:
        return read.result.result()
    except Exception as error:  # a source's own failure is a missing window, never a crash
        return f"reading Prometheus {url} failed: {type(error).__name__}: {error}"


@dataclass
class Autoscaler:
    """Runs the policy for every autoscaled service; thread-safe (one lock per call)."""

    source_for: Callable[[str], MetricsSource]
    """A metrics source for a Prometheus URL."""
    clock_s: Callable[[], float]
    wall_clock_s: Callable[[], float] = time.time
    """Unix time: the activators' timestamps are in it."""
    reads: WindowReads[MetricsWindow] = field(default_factory=WindowReads)
    read_deadline_s: float = READ_DEADLINE_S
    activator_reads: WindowReads[idle.ActivatorReading] = field(default_factory=WindowReads)
    read_activators: Callable[[Sequence[Pod], int], idle.ActivatorReading] = read_activator_pages
    _history: dict[Key, tuple[Decision, ...]] = field(default_factory=dict)
    _last_run: dict[Key, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def due_in_s(self, isvc: InferenceService) -> float:
        """Seconds until the next step is due: 0 when it is, a full interval right after one."""
        key = (str(isvc.metadata.namespace), str(isvc.metadata.name))
        interval = parse_duration(isvc.spec.autoscaling.interval)
        with self._lock:
            last = self._last_run.get(key)
        return 0.0 if last is None else max(0.0, last + interval - self.clock_s())

    def due(self, isvc: InferenceService) -> bool:
        return self.due_in_s(isvc) <= 0.0

    def come_back_s(self, isvc: InferenceService) -> float | None:
        """When the service's next pass should come: soon while its read is in flight, else
        when the next step is due (None: it is due now, the pass already ran it)."""
        key = (str(isvc.metadata.namespace), str(isvc.metadata.name))
        for read in (self.reads.get(key), self.activator_reads.get(key)):
            if read is not None and not read.result.done() and self.due(isvc):
                return READ_POLL_S
        return self.due_in_s(isvc) or None

    def forget(self, namespace: str, name: str) -> None:
        self.reads.forget((namespace, name))
        self.activator_reads.forget((namespace, name))
        with self._lock:
            self._history.pop((namespace, name), None)
            self._last_run.pop((namespace, name), None)

    def _window(
        self, isvc: InferenceService, percentile: float, now_s: float
    ) -> MetricsWindow | str | None:
        """The window to decide with, what went wrong instead, or None while the read that
        will give it is in flight. A read started before the last decision is stale: it is
        waited for (never two reads of one service at once) and then read again."""
        namespace, name = str(isvc.metadata.namespace), str(isvc.metadata.name)
        key = (namespace, name)
        assert isvc.spec.slo is not None and isvc.spec.autoscaling.prometheus is not None
        url = isvc.spec.autoscaling.prometheus.url
        with self._lock:
            last = self._last_run.get(key, -math.inf)
        read = self.reads.get(key)
        if read is not None and read.started_s < last and read.result.done():
            read = None  # answered after the step that gave up on it
        if read is None:
            source = self.source_for(url)
            window_s = parse_duration(isvc.spec.slo.window)

            def window() -> MetricsWindow:
                return source.window(namespace, name, now_s, percentile, window_s)

            read = self.reads.start(key, url, window, now_s)
        age_s = now_s - read.started_s
        if read.result.done():
            self.reads.forget(key)
            return _answer(read, url)
        if read.started_s < last:
            return f"Prometheus {url} has not answered a read started {format_duration(age_s)} ago"
        if age_s < self.read_deadline_s:
            return None
        return f"Prometheus {url} did not answer within {format_duration(self.read_deadline_s)}"

    def _activators(
        self, isvc: InferenceService, observed: Observed, now_s: float
    ) -> idle.ActivatorReading | None:
        """What the service's activators say, None while their pages are being read."""
        key = (str(isvc.metadata.namespace), str(isvc.metadata.name))
        read = self.activator_reads.get(key)
        if read is None:
            pods = [(p.name, p.pod_ip) for p in observed.pods_of(labels.ROLE_ACTIVATOR)
                    if not p.terminating]  # fmt: skip
            port = isvc.spec.router.port

            def pages() -> idle.ActivatorReading:
                return self.read_activators(pods, port)

            read = self.activator_reads.start(key, ACTIVATOR_POOL, pages, now_s)
        if not read.result.done():
            if now_s - read.started_s < self.read_deadline_s:
                return None
            self.activator_reads.forget(key)
            waited = format_duration(self.read_deadline_s)
            return idle.ActivatorReading((), (f"the activators' pages did not come in {waited}",))
        self.activator_reads.forget(key)
        try:
            return read.result.result()
        except Exception as error:  # a failed read is an unread activator, never a crash
            return idle.ActivatorReading((), (f"{type(error).__name__}: {error}",))

    def sleep_or_wake(
        self,
        isvc: InferenceService,
        observed: Observed,
        current: Mapping[str, int],
        previous_status: Mapping[str, Any] | None,
    ) -> idle.Transition | None:
        """For a service with scaleToZero, on a due pass: the sleep rule's transition (None
        while the activators are being read). One that sets the pools' sizes stands in for
        the policy's decision of this interval."""
        stz = isvc.spec.autoscaling.scale_to_zero
        assert stz is not None
        now_s = self.clock_s()
        reading = self._activators(isvc, observed, now_s)
        if reading is None:
            return None
        spec = isvc.spec
        bounds = idle.Bounds(
            minimum={r: spec.role(r).replicas.min for r in labels.WORKER_ROLES},
            maximum={r: spec.role(r).replicas.max for r in labels.WORKER_ROLES},
            gpus={r: spec.role(r).gpus_per_replica for r in labels.WORKER_ROLES},
            budget=spec.autoscaling.gpu_budget,
        )
        record = (previous_status or {}).get("scaleToZero")
        wall_s = self.wall_clock_s()
        change = idle.transition(
            record, reading, current, parse_duration(stz.idle_after), bounds, wall_s
        )
        if change.desired is not None:
            with self._lock:
                self._last_run[(str(isvc.metadata.namespace), str(isvc.metadata.name))] = now_s
        return change

    def step(
        self,
        isvc: InferenceService,
        observed: Observed,
        current: Mapping[str, int],
        previous_status: Mapping[str, Any] | None,
        now: datetime,
    ) -> AutoscaleOutcome | None:
        """One decision: read the window, decide, remember, describe. None while the window
        is being read: a later pass (`come_back_s`) decides."""
        namespace, name = str(isvc.metadata.namespace), str(isvc.metadata.name)
        key = (namespace, name)
        config = policy_config(isvc, measured_kv_transfer_s(previous_status))
        now_s = self.clock_s()
        answer = self._window(isvc, config.percentile, now_s)
        if answer is None:
            return None
        window = answer if isinstance(answer, MetricsWindow) else failed_window(answer, now_s)
        with self._lock:
            history = self._history.get(key, ())
        decision = decide(
            config,
            now_s,
            role_replicas(observed, labels.ROLE_PREFILL, current[labels.ROLE_PREFILL]),
            role_replicas(observed, labels.ROLE_DECODE, current[labels.ROLE_DECODE]),
            window,
            history,
        )
        with self._lock:
            self._history[key] = trim_history((*history, decision), now_s, config)
            self._last_run[key] = now_s
        previous = (previous_status or {}).get("autoscaler") or {}
        was = next(
            (c for c in (previous_status or {}).get("conditions") or ()
             if c.get("type") == METRICS_AVAILABLE),
            None,
        )  # fmt: skip
        outcome = outcome_of(decision, current, window, config, previous, now, now_s, was)
        log.log(
            logging.INFO if outcome.desired != dict(current) else logging.DEBUG,
            "%s/%s autoscaler: %s (%s)",
            namespace,
            name,
            outcome.autoscaler["lastDecision"],
            outcome.autoscaler["reason"],
        )
        _export_metrics(namespace, name, current, outcome, config, window)
        return outcome


def failed_window(problem: str, now_s: float) -> MetricsWindow:
    """A window with neither role, carrying why it could not be read."""
    return MetricsWindow(at_s=now_s, window_s=0.0, prefill=None, decode=None, problem=problem)


def _export_metrics(
    namespace: str,
    name: str,
    before: Mapping[str, int],
    outcome: AutoscaleOutcome,
    config: PolicyConfig,
    window: MetricsWindow | None,
) -> None:
    for role, count in outcome.desired.items():
        direction = "up" if count > before[role] else "down" if count < before[role] else "hold"
        reason = outcome.reasons[role]
        metrics.AUTOSCALER_DECISIONS.labels(namespace, name, role, direction, reason).inc()
    metrics.SLO_TARGET.labels(namespace, name, "ttft").set(config.ttft_target_s)
    metrics.SLO_TARGET.labels(namespace, name, "itl").set(config.itl_target_s)
    for slo, key in (("ttft", "ttftSeconds"), ("itl", "itlSeconds")):
        observed = outcome.slo.get(key, math.nan)
        metrics.set_or_clear(metrics.SLO_OBSERVED, (namespace, name, slo), observed)
    for slo, share in outcome.attainment.items():
        metrics.set_or_clear(metrics.SLO_ATTAINMENT, (namespace, name, slo), share)
