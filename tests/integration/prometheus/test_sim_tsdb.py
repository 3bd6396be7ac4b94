"""The benchmark's in-memory Prometheus (pdfleet_lab.tsdb) answers as the real one does.

Every query the operator's autoscaler sends (pdfleet.autoscale.promql) is evaluated by
`SimPrometheus` over a fleet's scraped series, and `promtool test rules` (the real PromQL
engine of the toolchain's Prometheus) is asked to confirm each answer on the same series at
the same times. The series have what a real fleet's have: pods that start and stop within a
window, a counter reset (an engine restart), a missed scrape, histograms with vLLM's buckets.
"""

from __future__ import annotations

import math
import random
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pdfleet.autoscale import promql
from pdfleet_lab.tsdb import SimPrometheus
from pdfleet_worker.sim.metrics import ITL_BUCKETS, TTFT_BUCKETS
from tests.integration.chart.helm import toolchain_binary

SCRAPE_S = 15
STEPS = 40  # ten minutes of scrapes
SERVICE = {"namespace": "serving", "pdfleet_service": "llama"}


def _pods() -> list[tuple[dict[str, str], int, int]]:
    """(labels, first scrape, last scrape) per pod: one starts late, one goes early."""
    return [
        ({**SERVICE, "pdfleet_role": "prefill", "pod": "llama-prefill-0"}, 0, STEPS - 1),
        ({**SERVICE, "pdfleet_role": "prefill", "pod": "llama-prefill-1"}, 17, STEPS - 1),
        ({**SERVICE, "pdfleet_role": "decode", "pod": "llama-decode-0"}, 0, STEPS - 1),
        ({**SERVICE, "pdfleet_role": "decode", "pod": "llama-decode-1"}, 0, 29),
    ]


def _fleet_series(rng: random.Random) -> dict[str, list[float | None]]:
    """Series (as promtool writes them) to values per scrape; None: no sample."""
    out: dict[str, list[float | None]] = {}

    def series(name: str, labels: dict[str, str]) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}}"

    for labels, first, last in _pods():
        totals = {promql.PROMPT_TOKENS: 0.0, promql.GENERATION_TOKENS: 0.0, promql.REQUESTS: 0.0}
        hist: dict[str, list[float]] = {
            promql.TTFT: [0.0] * (len(TTFT_BUCKETS) + 1),
            promql.ITL: [0.0] * (len(ITL_BUCKETS) + 1),
        }
        sums = {promql.TTFT: 0.0, promql.ITL: 0.0}
        values: dict[str, list[float | None]] = {}

        def put(
            key: str, step: int, value: float, values: dict[str, list[float | None]] = values
        ) -> None:
            values.setdefault(key, [None] * STEPS)[step] = value

        for step in range(first, last + 1):
            if labels["pod"] == "llama-decode-0" and step == 20:
                # The engine restarted: its counters and histograms start again from zero.
                totals = dict.fromkeys(totals, 0.0)
                hist = {k: [0.0] * len(v) for k, v in hist.items()}
                sums = dict.fromkeys(sums, 0.0)
            totals[promql.PROMPT_TOKENS] += rng.randint(0, 40_000)
            totals[promql.GENERATION_TOKENS] += rng.randint(0, 3_000)
            totals[promql.REQUESTS] += rng.randint(0, 20)
            for name, bounds in ((promql.TTFT, TTFT_BUCKETS), (promql.ITL, ITL_BUCKETS)):
                for _ in range(rng.randint(0, 30)):
                    seen = rng.lognormvariate(math.log(0.2 if name == promql.TTFT else 0.03), 0.8)
                    sums[name] += seen
                    index = next((i for i, b in enumerate(bounds) if seen <= b), len(bounds))
                    hist[name][index] += 1
            if step == 33 and labels["pod"] == "llama-prefill-0":
                continue  # a missed scrape
            for name, total in totals.items():
                put(series(name, labels), step, total)
            for name, bounds in ((promql.TTFT, TTFT_BUCKETS), (promql.ITL, ITL_BUCKETS)):
                cumulative = 0.0
                for bound, count in zip([*bounds, math.inf], hist[name], strict=True):
                    cumulative += count
                    le = "+Inf" if math.isinf(bound) else repr(float(bound))
                    put(series(f"{name}_bucket", {**labels, "le": le}), step, cumulative)
                put(series(f"{name}_sum", labels), step, sums[name])
                put(series(f"{name}_count", labels), step, cumulative)
            put(series(promql.WAITING, labels), step, float(rng.randint(0, 12)))
            put(series(promql.KV_USAGE, labels), step, rng.random())
        out.update(values)
    return out


def _store(fleet: dict[str, list[float | None]]) -> SimPrometheus:
    store = SimPrometheus()
    for text, values in fleet.items():
        name, _, inner = text.partition("{")
        labels = dict(item.split("=", 1) for item in inner.rstrip("}").split(","))
        labels = {k: v.strip('"') for k, v in labels.items()}
        for step, value in enumerate(values):
            if value is not None:
                store.add(name, labels, float(step * SCRAPE_S), value)
    return store


def _queries() -> list[str]:
    queries: list[str] = []
    for role in ("prefill", "decode"):
        target = promql.RoleSeries(SERVICE["namespace"], SERVICE["pdfleet_service"], role)
        queries += promql.role_queries(target, 95, 60).values()
    queries += promql.slo_bucket_queries(
        SERVICE["namespace"], SERVICE["pdfleet_service"], 120
    ).values()
    return queries


def test_every_autoscaler_query_answers_as_prometheus_does(tmp_path: Path) -> None:
    fleet = _fleet_series(random.Random(7))
    store = _store(fleet)
    tests: list[dict[str, Any]] = []
    answered = 0
    for eval_s in (62, 240, 307, 345, 450, 500, 584):
        store.now = float(eval_s)
        for query in _queries():
            answer = store.custom_query(query)
            answered += bool(answer)
            tests.append(
                {
                    "expr": query,
                    "eval_time": f"{eval_s}s",
                    "exp_samples": [
                        {
                            "labels": "{"
                            + ",".join(f'{k}="{v}"' for k, v in sorted(s["metric"].items()))
                            + "}",
                            "value": float(s["value"][1]),
                        }
                        for s in answer
                    ],
                }
            )
    assert answered > len(tests) * 0.8  # the test compares answers, not mostly empty ones
    input_series = [
        {"series": name, "values": " ".join("_" if v is None else repr(v) for v in values)}
        for name, values in fleet.items()
    ]
    spec = {
        "fuzzy_compare": True,
        "evaluation_interval": f"{SCRAPE_S}s",
        "tests": [
            {"interval": f"{SCRAPE_S}s", "input_series": input_series, "promql_expr_test": tests}
        ],
    }
    path = tmp_path / "autoscaler_queries.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    promtool = toolchain_binary("promtool", "PDFLEET_PROMTOOL")
    run = subprocess.run(
        [str(promtool), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
