"""The benchmark's in-memory Prometheus (pdfleet_lab.tsdb) answers as the real one does.

Every query the operator's autoscaler sends (pdfleet.autoscale.promql) is evaluated by
`SimPrometheus` over a fleet's scraped series, and `promtool test rules` (the real PromQL
engine of the toolchain's Prometheus) is asked to confirm each answer on the same series at
the same times. The series are written by the benchmark's own exporter (pdfleet_lab.exporter)
and have what a real fleet's have: pods that start and stop within a window, a counter reset
(an engine restart), a missed scrape, histograms with vLLM's buckets.
"""

from __future__ import annotations

import math
import random
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pdfleet.autoscale import promql
from pdfleet_lab.exporter import EngineFamilies
from pdfleet_lab.tsdb import SimPrometheus
from tests.integration.chart.helm import toolchain_binary

SCRAPE_S = 15
STEPS = 40  # ten minutes of scrapes
SERVICE = {"namespace": "serving", "pdfleet_service": "llama"}


def _pods() -> list[tuple[str, str, int, int]]:
    """(role, pod, first scrape, last scrape) per pod: one starts late, one goes early."""
    return [
        ("prefill", "llama-prefill-0", 0, STEPS - 1),
        ("prefill", "llama-prefill-1", 17, STEPS - 1),
        ("decode", "llama-decode-0", 0, STEPS - 1),
        ("decode", "llama-decode-1", 0, 29),
    ]


def _fleet(rng: random.Random) -> SimPrometheus:
    """The benchmark's exporter, scraped every SCRAPE_S into a store, as the simulator does."""
    store = SimPrometheus()
    for role, pod, first, last in _pods():
        engine = EngineFamilies(role, pod)
        engine.labels.update(SERVICE)
        for step in range(first, last + 1):
            if pod == "llama-decode-0" and step == 20:
                # The engine restarted: its counters and histograms start again from zero.
                engine = EngineFamilies(role, pod)
                engine.labels.update(SERVICE)
            for _ in range(rng.randint(0, 20)):
                engine.scheduled(rng.lognormvariate(math.log(0.05), 1.0))
                engine.first_token(rng.lognormvariate(math.log(0.2), 0.8), rng.randint(1, 4000))
                engine.finished(rng.lognormvariate(math.log(0.03), 0.8))
            for _ in range(rng.randint(0, 30)):
                engine.decoded(float(rng.randint(1, 200)), rng.lognormvariate(math.log(0.03), 0.8))
            if step == 33 and pod == "llama-prefill-0":
                continue  # a missed scrape
            engine.scrape(store, float(step * SCRAPE_S), float(rng.randint(0, 12)), rng.random())
    return store


def _input_series(store: SimPrometheus) -> list[dict[str, str]]:
    """The store's series as promtool's input: a value per scrape, `_` where there is none."""
    out = []
    for name, labels, series in store.series():
        values: list[str] = ["_"] * STEPS
        for t, v in zip(series.times, series.values, strict=True):
            values[round(t / SCRAPE_S)] = repr(v)
        selector = ",".join(f'{k}="{v}"' for k, v in labels)
        out.append({"series": f"{name}{{{selector}}}", "values": " ".join(values)})
    return out


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
    store = _fleet(random.Random(7))
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
    input_series = _input_series(store)
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
