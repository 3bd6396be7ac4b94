"""Container probes: the spec parsed with Kubernetes defaults, and kubelet's bookkeeping.

Where it fits: the pod worker keeps one ``ProbeTracker`` per startup, readiness and liveness
probe and feeds it the results that ``containers.probe_once`` gets; a tracker says when a
probe is due and when its result flips. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Probe:
    """A container probe as declared in the pod spec (named ports resolved)."""

    kind: Literal["http", "exec", "tcp"]
    command: tuple[str, ...] = ()
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ValueError(f"container {container.get('name')!r} has no port named {port!r}")


def parse_probe(
    spec: Mapping[str, Any] | None,
    container: Mapping[str, Any],
    period_max_s: float | None = None,
    timeout_min_s: float | None = None,
) -> Probe | None:
    """The probe in ``spec`` with Kubernetes defaults; periods capped at ``period_max_s``,
    timeouts raised to ``timeout_min_s``."""
    if not spec:
        return None
    period = float(spec.get("periodSeconds", 10))
    timeout = float(spec.get("timeoutSeconds", 1))
    common: dict[str, Any] = {
        "initial_delay_s": float(spec.get("initialDelaySeconds", 0)),
        "period_s": min(period, period_max_s) if period_max_s else period,
        "timeout_s": max(timeout, timeout_min_s) if timeout_min_s else timeout,
        "success_threshold": int(spec.get("successThreshold", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
    }
    if "httpGet" in spec:
        http = spec["httpGet"]
        return Probe(
            "http",
            port=resolve_port(http["port"], container),
            path=str(http.get("path", "/")),
            scheme=str(http.get("scheme", "HTTP")),
            **common,
        )
    if "exec" in spec:
        return Probe("exec", command=tuple(spec["exec"].get("command") or ()), **common)
    if "tcpSocket" in spec:
        return Probe("tcp", port=resolve_port(spec["tcpSocket"]["port"], container), **common)
    raise ValueError(f"unsupported probe: {sorted(spec)}")


@dataclass
class ProbeTracker:
    """kubelet's per-probe result: flips after success/failure thresholds in a row."""

    probe: Probe
    ok: bool = False
    successes: int = 0  # in a row
    failures: int = 0  # in a row
    next_due: float = 0.0

    def start(self, now: float, ok: bool = False) -> None:
        """(Re)arm for a new container; liveness starts ``ok``, the others do not."""
        self.ok, self.successes, self.failures = ok, 0, 0
        self.next_due = now + self.probe.initial_delay_s

    def due(self, now: float) -> bool:
        return now >= self.next_due

    def observe(self, success: bool, now: float) -> bool:
        """Record one result; True when ``ok`` changed."""
        self.next_due = now + self.probe.period_s
        if success:
            self.successes, self.failures = self.successes + 1, 0
            flip = not self.ok and self.successes >= self.probe.success_threshold
        else:
            self.successes, self.failures = 0, self.failures + 1
            flip = self.ok and self.failures >= self.probe.failure_threshold
        if flip:
            self.ok = success
        return flip
