"""The operator side of autoscaling: spec -> PolicyConfig, Prometheus -> decision -> status.

Where it fits: the controller calls `Autoscaler.step()` inside a reconcile pass of a service
with autoscaling enabled, once per `spec.autoscaling.interval`. The decision lands in status
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pdfleet import labels, metrics
from pdfleet.api.types import format_duration, parse_duration
from pdfleet.api.v1alpha1 import CapacityHintSpec, InferenceService
from pdfleet.autoscale.attainment import slo_attainment
from pdfleet.autoscale.policy import (
    Decision,
    MetricsWindow,
    PolicyConfig,
    RoleReplicas,
    decide,
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
    settle_s = parse_duration(auto.scale_down_stabilization)
    hint = auto.capacity_hint or CapacityHintSpec()
    # The policy's memory follows the user's scale-down window (the defaults, 300 s, give
    # the benchmarked values): trends over one window, burst memory and capacity estimates
    # fading over two and three, at most one scale-down step per fifth of it.
    return PolicyConfig(
        startup_s=parse_duration(auto.worker_startup),
        trend_window_s=settle_s,
        burst_memory_half_life_s=2 * settle_s,
        capacity_half_life_s=3 * settle_s,
        scale_down_period_s=max(parse_duration(auto.interval), settle_s / 5),
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
        scale_down_stabilization_s=parse_duration(auto.scale_down_stabilization),
        max_scale_up_step=auto.max_scale_up_step,
        max_scale_down_step=auto.max_scale_down_step,
        prefill_capacity_prior=_optional_float(hint.prefill_prompt_tokens_per_second),
        decode_capacity_prior=_optional_float(hint.decode_generated_tokens_per_second),
        kv_transfer_s=kv_transfer_s,
    )


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
class Outcome:
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


def outcome_of(
    decision: Decision,
    before: Mapping[str, int],
    window: MetricsWindow | None,
    config: PolicyConfig,
    previous: Mapping[str, Any],
    now: datetime,
) -> Outcome:
    """Pure: turn a policy decision into status fields and Events."""
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
    ttft = window.prefill.ttft_s if window and window.prefill else math.nan
    itl = window.decode.itl_s if window and window.decode else math.nan
    slo: dict[str, Any] = {
        "ttft": _measured(ttft, config.ttft_target_s),
        "itl": _measured(itl, config.itl_target_s),
        "window": format_duration(window.window_s) if window else "",
    }
    if not math.isnan(ttft):
        slo["ttftSeconds"] = round(ttft, 4)
    if not math.isnan(itl):
        slo["itlSeconds"] = round(itl, 4)
    attainment = slo_attainment(
        window.ttft_buckets if window else (),
        window.tpot_buckets if window else (),
        config.ttft_target_s,
        config.itl_target_s,
    )
    if not math.isnan(attainment["both"]):
        slo["attainment"] = round(attainment["both"], 4)
    available = next((c for c in decision.conditions if c.type == METRICS_AVAILABLE), None)
    condition = {
        "type": METRICS_AVAILABLE,
        "status": "True",
        "reason": "MetricsFresh",
        "message": "",
    }
    if available is not None:
        condition = {"type": METRICS_AVAILABLE, "status": available.status,
                     "reason": available.reason, "message": available.message}  # fmt: skip
    if condition["status"] != "True":
        events.append(
            ("Warning", "MetricsUnavailable", condition["message"] or condition["reason"])
        )
    reasons = {
        labels.ROLE_PREFILL: decision_reason(decision, ttft, config.ttft_target_s),
        labels.ROLE_DECODE: decision_reason(decision, itl, config.itl_target_s),
    }
    return Outcome(desired, autoscaler, slo, condition, tuple(events), attainment, reasons)


@dataclass
class Autoscaler:
    """Runs the policy for every autoscaled service; thread-safe (one lock per call)."""

    source_for: Callable[[str], MetricsSource]
    """A metrics source for a Prometheus URL."""
    clock_s: Callable[[], float]
    _history: dict[tuple[str, str], tuple[Decision, ...]] = field(default_factory=dict)
    _last_run: dict[tuple[str, str], float] = field(default_factory=dict)
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

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._history.pop((namespace, name), None)
            self._last_run.pop((namespace, name), None)

    def step(
        self,
        isvc: InferenceService,
        observed: Observed,
        current: Mapping[str, int],
        previous_status: Mapping[str, Any] | None,
        now: datetime,
    ) -> Outcome:
        """One decision: read the window, decide, remember, describe."""
        namespace, name = str(isvc.metadata.namespace), str(isvc.metadata.name)
        key = (namespace, name)
        config = policy_config(isvc, measured_kv_transfer_s(previous_status))
        assert isvc.spec.slo is not None and isvc.spec.autoscaling.prometheus is not None
        now_s = self.clock_s()
        source = self.source_for(isvc.spec.autoscaling.prometheus.url)
        window = source.window(
            namespace, name, now_s, config.percentile, parse_duration(isvc.spec.slo.window)
        )
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
        outcome = outcome_of(decision, current, window, config, previous, now)
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


def _export_metrics(
    namespace: str,
    name: str,
    before: Mapping[str, int],
    outcome: Outcome,
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
