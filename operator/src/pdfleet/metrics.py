"""The operator's own Prometheus metrics (served by `pdfleet operator run --metrics-port`)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RECONCILE_DURATION = Histogram(
    "pdfleet_reconcile_duration_seconds",
    "Time of one reconcile pass of one InferenceService.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
GC_FULL_COLLECTION = Histogram(
    "pdfleet_gc_full_collection_seconds",
    "Time of one full garbage collection of the operator process (every thread waits).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
RECONCILE_ERRORS = Counter(
    "pdfleet_reconcile_errors_total",
    "Reconcile passes that failed, by reason (HTTP status or exception type).",
    ["reason"],
)
CHILD_WRITES = Counter(
    "pdfleet_child_writes_total", "Child objects applied or deleted by the operator."
)
STATUS_WRITES = Counter(
    "pdfleet_status_writes_total", "InferenceService status updates written by the operator."
)
WATCH_LISTS = Counter(
    "pdfleet_watch_lists_total",
    "Full listings by the operator's informers, by kind: one at start, more after a watch "
    "expired (410) or broke.",
    ["kind"],
)
WATCHED_OBJECTS = Gauge(
    "pdfleet_watched_objects", "Objects held by the operator's informers, by kind.", ["kind"]
)
LEADER = Gauge("pdfleet_leader", "1 while this operator replica holds the leader lease.")
DRAIN_DURATION = Histogram(
    "pdfleet_drain_duration_seconds",
    "From marking a worker draining to the moment it held no request (or was forced).",
    ["role"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
DRAIN_FORCED = Counter(
    "pdfleet_drain_forced_total",
    "Workers removed because their drain passed spec.drain.timeout.",
    ["role"],
)

# Per-service series carry the same label names as the worker series the scrape configuration
# produces (namespace, pdfleet_service, pdfleet_role), so alerts and dashboards join them
# directly; the chart's ServiceMonitor scrapes the operator with honorLabels for that reason.
SERVICE_LABELS = ("namespace", "pdfleet_service")

AUTOSCALER_DECISIONS = Counter(
    "pdfleet_autoscaler_decisions_total",
    "Autoscaler decisions per pool, by direction (up, down, hold) and reason (OverTarget, "
    "GPUBudget, Load, or why metrics were unusable: MetricsMissing, MetricsStale, MetricsNaN).",
    [*SERVICE_LABELS, "pdfleet_role", "direction", "reason"],
)
SLO_TARGET = Gauge(
    "pdfleet_slo_target_seconds",
    "The SLO latency target from the spec, by SLO (ttft, itl).",
    [*SERVICE_LABELS, "slo"],
)
SLO_OBSERVED = Gauge(
    "pdfleet_slo_observed_seconds",
    "Measured latency at the SLO percentile over the SLO window, by SLO (ttft, itl).",
    [*SERVICE_LABELS, "slo"],
)
SLO_ATTAINMENT = Gauge(
    "pdfleet_slo_attainment_ratio",
    "Estimated share of the SLO window's requests meeting the latency target (0-1), by SLO "
    "(ttft, itl, both).",
    [*SERVICE_LABELS, "slo"],
)
POOL_REPLICAS = Gauge(
    "pdfleet_pool_replicas",
    "Workers per pool by state (desired, replicas, ready, pending, draining), as in status.",
    [*SERVICE_LABELS, "pdfleet_role", "state"],
)
SERVICE_CONDITION = Gauge(
    "pdfleet_service_condition",
    "1 when the InferenceService's condition (Ready, Reconciling, Stalled, ...) is True.",
    [*SERVICE_LABELS, "condition"],
)


def set_or_clear(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
    """Set one series, or drop it while the value is unknown (NaN): a last known value
    left behind would keep an alert firing after the traffic stopped."""
    if math.isnan(value):
        with contextlib.suppress(KeyError):  # never set, or dropped already
            gauge.remove(*labels)
    else:
        gauge.labels(*labels).set(value)


def export_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    """Mirror a service's status into the per-service gauges (pool sizes, conditions)."""
    for role in ("prefill", "decode"):
        for state, value in (status.get(role) or {}).items():
            if isinstance(value, int):
                POOL_REPLICAS.labels(namespace, name, role, state).set(value)
    for condition in status.get("conditions") or ():
        SERVICE_CONDITION.labels(namespace, name, condition["type"]).set(
            1 if condition.get("status") == "True" else 0
        )


def forget_service(namespace: str, name: str) -> None:
    """Drop a deleted service's series so dashboards do not show it forever."""
    per_service = (
        AUTOSCALER_DECISIONS,
        POOL_REPLICAS,
        SERVICE_CONDITION,
        SLO_TARGET,
        SLO_OBSERVED,
        SLO_ATTAINMENT,
    )
    for metric in per_service:
        for labels in list(metric._metrics):  # prometheus_client keeps children by label tuple
            if labels[:2] == (namespace, name):
                metric.remove(*labels)
