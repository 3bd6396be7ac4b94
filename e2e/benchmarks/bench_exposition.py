"""What one scrape of the operator's /metrics costs with N services (issue #10's follow-up).

The per-service series (pool sizes, conditions: 16 a service) are rendered when a
service's status is exported (pdfleet.metrics.ServiceSeries), and a scrape joins the rendered
lines. For comparison, the same series held as prometheus_client Gauges, which format every
sample at every scrape (the usual way to serve them: the baseline). Both in this process,
one after the other, on the same statuses; medians of ``--repeats`` scrapes.

    .venv/bin/python -m e2e.benchmarks.bench_exposition            # 1,000 services
    .venv/bin/python -m e2e.benchmarks.bench_exposition --services 100 --out /tmp/expo.json

Prints the figures and writes them as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from pdfleet import metrics

OUT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "scale" / "exposition.json"
CONDITIONS = ("Ready", "Reconciling", "Stalled", "SpecValid", "RouterReady", "KVTransportReady")


def status(ready: int) -> dict[str, Any]:
    """A service's status as the operator writes it: two pools, six conditions."""
    pool = {"desired": 2, "replicas": 2, "ready": ready, "pending": 0, "draining": 0}
    return {
        "prefill": {**pool, "summary": f"{ready}/2"},
        "decode": {**pool, "summary": f"{ready}/2"},
        "conditions": [{"type": c, "status": "True"} for c in CONDITIONS],
    }


def as_gauges(services: Sequence[tuple[str, str]]) -> CollectorRegistry:
    """The same series as prometheus_client Gauges in a registry of their own."""
    registry = CollectorRegistry()
    pools = Gauge(
        "pdfleet_pool_replicas", "pools", [*metrics.SERVICE_LABELS, "pdfleet_role", "state"],
        registry=registry,
    )  # fmt: skip
    conditions = Gauge(
        "pdfleet_service_condition", "conditions", [*metrics.SERVICE_LABELS, "condition"],
        registry=registry,
    )  # fmt: skip
    for namespace, name in services:
        for role in ("prefill", "decode"):
            for state, value in status(2)[role].items():
                if isinstance(value, int):
                    pools.labels(namespace, name, role, state).set(value)
        for condition in CONDITIONS:
            conditions.labels(namespace, name, condition).set(1)
    return registry


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.benchmarks.bench_exposition", description=__doc__
    )
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    services = [(f"team-{i // 100}", f"svc-{i:04d}") for i in range(args.services)]

    def export_all() -> None:
        for service in services:
            metrics.export_status(*service, status(2))

    export_s = median_s(export_all, 5)
    served = metrics.exposition()
    rendered_s = median_s(metrics.exposition, args.repeats)
    registry = as_gauges(services)
    formatted_s = median_s(lambda: generate_latest(registry), args.repeats)
    names = ("pdfleet_pool_replicas{", "pdfleet_service_condition{")
    series = sum(1 for line in served.decode().splitlines() if line.startswith(names))
    results = {
        "services": args.services,
        "series": series,
        "scrape_rendered_ahead_s": rendered_s,
        "scrape_formatted_each_time_s": formatted_s,
        "ratio": formatted_s / rendered_s,
        "export_per_service_s": export_s / args.services,
        "bytes": len(served),
    }
    for service in services:
        metrics.forget_service(*service)
    print(json.dumps(results, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
