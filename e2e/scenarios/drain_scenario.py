"""Graceful scale-down on the local cluster under streaming load: the drain's end-to-end proof.

Where it fits: docs/drain.md describes the drain and tests/integration/router/test_drain_router.py
proves it against the router alone. Here the whole path runs: the operator as a real process
(e2e/platform/operator_process.py) patches StatefulSets on the local cluster
(e2e/platform/cluster.py), the process bridge (e2e/platform/bridge/) runs the simulators and the
real vllm-router, which finds the workers through its Kubernetes discovery. tests/e2e/drain uses the
pieces; the command line runs the long version and prints the figures::

    e2e/platform/netns.sh .venv/bin/python -m e2e.scenarios.drain_scenario --cycles 20

What is counted: at the client, HTTP errors (`failed`) and streams without `[DONE]` or with
fewer tokens than asked (`truncated`); in every simulator's log (it outlives its pod), KV
recomputes, failed KV pulls and expired KV leases; on the router's metrics port, its prefill
and decode error counters. Drain durations come from the operator's `Drained` Events, their
start from the pod annotation (polled), their deregistration from the router's GET /workers
(polled), so each drain is set against the requests it could still hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes import config

from e2e.platform.closed_loop import Load, Result, count
from e2e.platform.operator_process import parse_metrics
from e2e.platform.service import (
    HIGH,
    Service,
    deployed_service,
    local_cluster,
    pod_url,
    router_workers,
    wait_settled,
)
from e2e.platform.stats import percentile
from pdfleet import labels

ROUTER_METRICS_PORT = 29000
LOW = {labels.ROLE_PREFILL: 1, labels.ROLE_DECODE: 1}
SIM_LOG_COUNTERS = {
    "recomputed": "Got invalid KVTransferParams",
    "kv_pull_failed": "KV load failed for",
    "kv_expired": "freed KV of",
}
_DRAINED = re.compile(r"^(\S+) \((\w+)\) drained in ([0-9.]+)s")
_FORCED = re.compile(r"^(\S+) \((\w+)\) removed after ([0-9.]+)s")


# ----- what the drains did ---------------------------------------------------------------------


def epoch(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Recorder(threading.Thread):
    """Polls the pods and the router: when each drain started (the annotation) and when the
    worker left the router (first poll without it; an upper bound by one poll)."""

    def __init__(self, service: Service, period_s: float = 0.25):
        super().__init__(name="drain-recorder", daemon=True)
        self.service, self.period_s = service, period_s
        self.marks: dict[tuple[str, str], dict[str, Any]] = {}
        self._halt = threading.Event()
        self.router = service.router()

    def run(self) -> None:
        while not self._halt.wait(self.period_s):
            with contextlib.suppress(Exception):  # a missed poll only widens the bounds
                self._poll()

    def _poll(self) -> None:
        listed = router_workers(self.router)
        now = time.time()
        for pod in self.service.pods():
            since = (pod["metadata"].get("annotations") or {}).get(labels.DRAINING)
            if not since or not pod["status"].get("podIP"):
                continue
            entry = self.marks.setdefault(
                (pod["metadata"]["name"], since),
                {"since": epoch(since), "url": pod_url(pod), "deregistered": None},
            )
            if entry["deregistered"] is None and listed is not None and entry["url"] not in listed:
                entry["deregistered"] = now

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


@dataclass(frozen=True)
class Drain:
    pod: str
    role: str
    since: float
    duration_s: float
    forced: bool
    deregistered: float | None
    holdable_s: float
    """Longest the pod could still be busy, from its mark: the latest end of any request
    started before its deregistration (requests on every worker, so an upper bound)."""


def parse_drain_event(message: str) -> tuple[str, str, float, bool] | None:
    for pattern, forced in ((_DRAINED, False), (_FORCED, True)):
        match = pattern.match(message)
        if match:
            return match.group(1), match.group(2), float(match.group(3)), forced
    return None


def holdable_s(results: Sequence[Result], since: float, deregistered: float | None) -> float:
    """Latest end, after `since`, of any request that started before the worker left the
    router (or before the drain began when that is not known)."""
    cutoff = deregistered if deregistered is not None else since
    ends = [r.ended - since for r in results if r.started < cutoff and r.ended > since]
    return max(ends, default=0.0)


def match_drains(
    events: Sequence[Any], marks: Mapping[tuple[str, str], Mapping[str, Any]],
    results: Sequence[Result],
) -> list[Drain]:  # fmt: skip
    """Pair each Drained/DrainForced Event with the marks it ends.

    The operator counts a repeated Event (same pod, same rounded duration) on the one
    already posted, so an Event with count n stands for n drains: the n marks of its pod,
    not yet paired, whose start + duration is nearest the Event's first and last times."""
    drains = []
    taken: set[tuple[str, str]] = set()
    for event in sorted(events, key=_event_first):
        parsed = parse_drain_event(event.message or "")
        if parsed is None:
            continue
        pod, role, duration, forced = parsed
        first, last = _event_first(event), _event_last(event)
        free = [key for key in marks if key[0] == pod and key not in taken]
        for key in _nearest_marks(free, marks, duration, first, last, event.count or 1):
            taken.add(key)
            mark = marks[key]
            drains.append(
                Drain(
                    pod, role, mark["since"], duration, forced, mark["deregistered"],
                    holdable_s(results, mark["since"], mark["deregistered"]),
                )
            )  # fmt: skip
    return sorted(drains, key=lambda d: d.since)


def _event_first(event: Any) -> float:
    return float((event.first_timestamp or event.last_timestamp).timestamp())


def _event_last(event: Any) -> float:
    return float((event.last_timestamp or event.first_timestamp).timestamp())


def _nearest_marks(
    keys: Sequence[tuple[str, str]], marks: Mapping[tuple[str, str], Mapping[str, Any]],
    duration: float, first: float, last: float, n: int,
) -> list[tuple[str, str]]:  # fmt: skip
    """`n` marks for an Event seen first at `first` and last at `last` (whole seconds): the
    one that ended nearest each of the two, then the rest of the count from between them."""

    def off(key: tuple[str, str], at: float) -> float:
        return abs(float(marks[key]["since"]) + duration - (at + 0.5))

    chosen: list[tuple[str, str]] = []
    for at in (first, last)[: min(n, 2)]:
        left = [k for k in keys if k not in chosen]
        if left:
            chosen.append(min(left, key=lambda k: off(k, at)))
    inside = [k for k in keys if first - 1 <= marks[k]["since"] + duration <= last + 2]
    between = sorted((k for k in inside if k not in chosen), key=lambda k: marks[k]["since"])
    return chosen + between[: max(n - 2, 0)]


# ----- counters on the simulators and the router ------------------------------------------------


def sim_log_counters(log_dir: Path, namespace: str) -> dict[str, int]:
    """Recomputes, failed KV pulls and expired leases in every worker log of the namespace
    (one directory per pod uid, kept after the pod is gone)."""
    totals = dict.fromkeys(SIM_LOG_COUNTERS, 0)
    for path in log_dir.glob(f"{namespace}_*/vllm.log"):
        text = path.read_text(errors="replace")
        for key, needle in SIM_LOG_COUNTERS.items():
            totals[key] += text.count(needle)
    return totals


def router_error_counters(router_ip: str) -> dict[str, float]:
    text = httpx.get(f"http://{router_ip}:{ROUTER_METRICS_PORT}/metrics", timeout=5).text
    totals: dict[str, float] = {}
    for key, value in parse_metrics(text).items():
        name = key.split("{")[0]
        if name.startswith("vllm_router_pd_") and name.endswith("_errors_total"):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def router_gauges(router_ip: str) -> dict[str, float]:
    """worker URL -> pending + active decode requests, as the router counts them."""
    text = httpx.get(f"http://{router_ip}:{ROUTER_METRICS_PORT}/metrics", timeout=5).text
    loads: dict[str, float] = {}
    for key, value in parse_metrics(text).items():
        if key.startswith(("vllm_router_pd_pending_decode", "vllm_router_pd_active_decode")):
            worker = re.search(r'worker="([^"]+)"', key)
            if worker:
                loads[worker.group(1)] = loads.get(worker.group(1), 0.0) + value
    return loads


def drain_summary(drains: Sequence[Drain]) -> dict[str, Any]:
    durations = [d.duration_s for d in drains]
    return {
        "drains": len(drains),
        "forced": sum(1 for d in drains if d.forced),
        "median_s": round(statistics.median(durations), 2) if durations else None,
        "p90_s": round(percentile(durations, 90), 2) if durations else 0.0,
        "max_s": round(max(durations, default=0.0), 2),
        "max_holdable_s": round(max((d.holdable_s for d in drains), default=0.0), 2),
        "worst_over_holdable_s": round(
            max((d.duration_s - d.holdable_s for d in drains), default=0.0), 2
        ),
    }


# ----- scale cycles -------------------------------------------------------------------------


def scale_and_settle(service: Service, counts: Mapping[str, int], timeout_s: float) -> float:
    started = time.monotonic()
    service.scale(counts)
    wait_settled(service, counts, timeout_s)
    return time.monotonic() - started


def run_cycles(
    service: Service, cycles: int, timeout_s: float = 180.0,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[list[tuple[float, float]], str | None]:  # fmt: skip
    """`cycles` times: every pool HIGH -> LOW -> HIGH, each step settled (down_s, up_s).

    A step that does not settle in `timeout_s` ends the run early; the cycles done so far
    and why it stopped are returned, so that what was measured is still reported."""
    timings: list[tuple[float, float]] = []
    for i in range(cycles):
        try:
            down = scale_and_settle(service, LOW, timeout_s)
            up = scale_and_settle(service, HIGH, timeout_s)
        except TimeoutError as error:
            progress(f"stopped after {i} cycles: {error}")
            return timings, str(error)
        timings.append((down, up))
        progress(f"cycle {i + 1}/{cycles}: down {down:.1f}s, up {up:.1f}s")
    return timings, None


@dataclass
class CycleReport:
    cycles: int
    results: list[Result]
    drains: list[Drain]
    sim: dict[str, int]
    router_errors: dict[str, float]
    timings: list[tuple[float, float]] = field(default_factory=list)
    stopped: str | None = None  # why the run ended before its last cycle

    def figures(self) -> dict[str, Any]:
        longest = max((r.ended - r.started for r in self.results), default=0.0)
        return {
            "cycles": len(self.timings),
            "stopped": self.stopped,
            "sent": len(self.results),
            "ok": count(self.results, "ok"),
            "failed": count(self.results, "failed"),
            "truncated": count(self.results, "truncated"),
            **self.sim,
            "router_errors": sum(self.router_errors.values()),
            "longest_request_s": round(longest, 2),
            "drain": drain_summary(self.drains),
            "cycle_s": {
                "down_median": round(statistics.median(t[0] for t in self.timings), 1)
                if self.timings else None,
                "up_median": round(statistics.median(t[1] for t in self.timings), 1)
                if self.timings else None,
            },
        }  # fmt: skip


def cycles_under_load(
    service: Service, cycles: int, clients: int = 4,
    progress: Callable[[str], None] = lambda _: None,
) -> CycleReport:  # fmt: skip
    """The scenario of docs/drain.md's table: load, `cycles` scale cycles, every counter."""
    recorder = Recorder(service)
    recorder.start()
    try:
        with Load(service.router(), clients=clients) as load:
            time.sleep(3.0)
            timings, stopped = run_cycles(service, cycles, progress=progress)
            time.sleep(2.0)
    finally:
        recorder.stop()
    results = load.snapshot()
    events = service.events(("Drained", "DrainForced"))
    return CycleReport(
        cycles=cycles,
        results=results,
        drains=match_drains(events, recorder.marks, results),
        sim=sim_log_counters(service.log_dir, service.namespace),
        router_errors=router_error_counters(service.router_ip()),
        timings=timings,
        stopped=stopped,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pdfleet-drain-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"logs: {workdir}", flush=True)
    with local_cluster(workdir / "kwok") as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            with deployed_service(cluster, api, workdir / "pods") as service:
                report = cycles_under_load(
                    service, args.cycles, args.clients,
                    progress=lambda line: print(line, flush=True),
                )  # fmt: skip
        finally:
            api.close()
    figures = report.figures()
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    bad = [r for r in report.results if r.outcome != "ok"]
    for r in bad[:10]:
        print(f"lost: {r}", file=sys.stderr)
    lost = figures["failed"] + figures["truncated"] + sum(report.sim.values())
    return 1 if lost or figures["router_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
