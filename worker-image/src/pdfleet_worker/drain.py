"""Drain hooks of a worker pod: the preStop wait and the readiness check.

Where it fits: Kubernetes runs `pdfleet-agent prestop` before SIGTERM and `pdfleet-agent
ready` as the readiness probe. preStop marks the pod draining (readiness turns false, so
router service discovery and Services stop sending it work), then waits until the engine's
own gauges show no running or waiting request, up to the drain timeout. SIGTERM then lets
vLLM's --shutdown-timeout finish the rest (including prefill KV not yet read by a decode).

A decode's requests still pulling their KV from a prefill are in the waiting gauge: vLLM's
Prometheus logger sets it to capacity + deferred (v1/metrics/loggers.py), so the
`num_requests_waiting_by_reason` split is not added again.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DRAIN_FILE = "/tmp/pdfleet-draining"
_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_SAMPLE = re.compile(r"^(vllm:num_requests_(?:running|waiting))(?:\{[^}]*\})?\s+(\S+)", re.M)


def in_flight(metrics_text: str) -> float:
    """Running + waiting requests summed over every engine (DP rank) in a /metrics page."""
    total = 0.0
    for name, value in _SAMPLE.findall(metrics_text):
        if name in _GAUGES:
            total += float(value)
    return total


def mark_draining(path: str) -> None:
    Path(path).write_text(f"{time.time():.3f}\n")


def is_draining(path: str) -> bool:
    return Path(path).exists()


@dataclass
class DrainResult:
    drained: bool
    waited_s: float
    last_in_flight: float | None


def wait_idle(
    base_url: str,
    timeout_s: float,
    interval_s: float = 1.0,
    settle_polls: int = 2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """Poll /metrics until in-flight is 0 for `settle_polls` polls in a row, or time out.

    Several zero readings are needed because a router may still send the decode stage of a
    request whose prefill started before deregistration (the pair is chosen up front).
    An unreachable engine counts as idle: there is nothing left to wait for.
    """
    start = clock()
    zeros = 0
    last: float | None = None
    import httpx  # only preStop polls; readiness must start fast (see check_ready)

    with httpx.Client(timeout=min(5.0, max(0.5, interval_s))) as client:
        while True:
            try:
                resp = client.get(f"{base_url}/metrics")
                last = in_flight(resp.text) if resp.status_code == 200 else None
            except httpx.HTTPError:
                return DrainResult(True, clock() - start, None)
            zeros = zeros + 1 if last == 0 else 0
            if zeros >= settle_polls:
                return DrainResult(True, clock() - start, last)
            if clock() - start >= timeout_s:
                return DrainResult(False, clock() - start, last)
            sleep(interval_s)


def check_ready(base_url: str, drain_file: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """Readiness: not draining, and vLLM answers /health (it has no /ready of its own)."""
    if is_draining(drain_file):
        return False, "draining"
    # The readiness probe runs every few seconds as a new process: the standard library's
    # client starts in a fraction of httpx's import time, which matters on a busy node.
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout_s) as resp:
            status = resp.status
    except urllib.error.HTTPError as err:
        status = err.code
    except (OSError, ValueError) as err:
        return False, f"engine unreachable: {err!r}"
    if status != 200:
        return False, f"/health answered {status}"
    return True, "ok"
