"""The operator's own Prometheus metrics (served by `pdfleet operator run --metrics-port`)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    Metric,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from pdfleet.labels import WORKER_ROLES

RECONCILE_DURATION = Histogram(
    "pdfleet_reconcile_duration_seconds",
    "Time of one reconcile pass of one InferenceService.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_WAIT = Histogram(
    "pdfleet_queue_wait_seconds",
    "From a service queued for a pass to the pass starting, by priority (urgent: a watch "
    "event of a running service; new: a service seen for the first time; resync).",
    ["priority"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
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
# Both roles' drain series exist from the start at zero. Drains are rare, often the first of
# their role in the process's life, and a series born at 1 has no earlier sample for rate()
# or increase() to count from: the dashboard would never show that drain, nor
# PdfleetDrainForced fire on the first forced one.
for _role in WORKER_ROLES:
    DRAIN_DURATION.labels(role=_role)
    DRAIN_FORCED.labels(role=_role)

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


class ServiceSeries:
    """A per-service gauge whose exposition is rendered when a service's status is exported,
    not at every scrape: at 1,000 services the pool and condition gauges are 16,000 series,
    and prometheus_client formats every sample at every scrape while holding the GIL, which
    pauses every pass (e2e/benchmarks/bench_exposition.py, docs/benchmarks/scale). A scrape
    joins the services' rendered lines (`exposition`)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        self.name = name
        self.documentation = documentation
        self._labelnames = (*SERVICE_LABELS, *labelnames)
        self._lines: dict[tuple[str, str], str] = {}
        self._guard = threading.Lock()

    def set(self, namespace: str, name: str, values: Mapping[tuple[str, ...], float]) -> None:
        """Replace one service's series: `values` by the labels after SERVICE_LABELS."""
        lines = "".join(
            f"{self.name}{{{_label_pairs(self._labelnames, (namespace, name, *extra))}}} "
            f"{floatToGoString(value)}\n"  # type: ignore[no-untyped-call]
            for extra, value in values.items()
        )
        with self._guard:
            self._lines[(namespace, name)] = lines

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._lines.pop((namespace, name), None)

    def text(self) -> str:
        with self._guard:
            lines = list(self._lines.values())
        help_ = _escape_help(self.documentation)
        return f"# HELP {self.name} {help_}\n# TYPE {self.name} gauge\n" + "".join(lines)

    def describe(self) -> list[Metric]:
        """Name and labels, as a prometheus_client collector describes itself."""
        return [GaugeMetricFamily(self.name, self.documentation, labels=self._labelnames)]


def _label_pairs(names: Sequence[str], values: Sequence[str]) -> str:
    return ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


POOL_REPLICAS = ServiceSeries(
    "pdfleet_pool_replicas",
    "Workers per pool by state (desired, replicas, ready, pending, draining), as in status.",
    ["pdfleet_role", "state"],
)
SERVICE_CONDITION = ServiceSeries(
    "pdfleet_service_condition",
    "1 when the InferenceService's condition (Ready, Reconciling, Stalled, ...) is True.",
    ["condition"],
)
SERVICE_SERIES = (POOL_REPLICAS, SERVICE_CONDITION)


def exposition() -> bytes:
    """What /metrics serves: the default registry, then the per-service series."""
    rendered = "".join(series.text() for series in SERVICE_SERIES)
    return generate_latest(REGISTRY) + rendered.encode()


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = exposition()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


def serve(port: int, addr: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve `exposition` on every path of addr:port from a daemon thread."""
    server = ThreadingHTTPServer((addr, port), _MetricsHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def set_or_clear(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
    """Set one series, or drop it while the value is unknown (NaN): a last known value
    left behind would keep an alert firing after the traffic stopped."""
    if math.isnan(value):
        with contextlib.suppress(KeyError):  # never set, or dropped already
            gauge.remove(*labels)
    else:
        gauge.labels(*labels).set(value)


def export_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """Mirror a service's status into the per-service gauges (pool sizes, conditions)."""
    POOL_REPLICAS.set(
        namespace,
        name,
        {
            (role, state): value
            for role in ("prefill", "decode")
            for state, value in (status.get(role) or {}).items()
            if isinstance(value, int)
        },
    )
    SERVICE_CONDITION.set(
        namespace,
        name,
        {
            (condition["type"],): 1 if condition.get("status") == "True" else 0
            for condition in status.get("conditions") or ()
        },
    )


def forget_service(namespace: str, name: str) -> None:
    """Drop a deleted service's series so dashboards do not show it forever."""
    for series in SERVICE_SERIES:
        series.forget(namespace, name)
    per_service = (AUTOSCALER_DECISIONS, SLO_TARGET, SLO_OBSERVED, SLO_ATTAINMENT)
    for metric in per_service:
        for labels in list(metric._metrics):  # prometheus_client keeps children by label tuple
            if labels[:2] == (namespace, name):
                metric.remove(*labels)
