"""Alerts and the dashboard: valid PromQL (promtool), and only metrics that exist.

Every `pdfleet_*` series they use must be defined in pdfleet.metrics, every `vllm:*` series
must be one the autoscaler reads too, and their labels must be ones those metrics carry.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY

from pdfleet import metrics
from pdfleet.autoscale import promql
from tests.integration.chart.helm import CHART, NAMESPACE, VALUE_SETS, render, toolchain_binary
from tests.manifests import one

DASHBOARD = CHART / "dashboards" / "pdfleet.json"
METRIC = re.compile(r"\b(pdfleet_[a-z_]+|vllm:[a-z_:]+)")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
WORKER_LABELS = {"namespace", "pdfleet_service", "pdfleet_role", "pod", "le"}
LABEL_NAMES = {"pdfleet_service", "pdfleet_role"}


def _operator_metrics() -> dict[str, set[str]]:
    """Name -> label names of every metric pdfleet.metrics defines (histogram series too)."""
    assert metrics.LEADER  # imported for its registrations
    found: dict[str, set[str]] = {}
    for collector in [*REGISTRY._collector_to_names, *metrics.SERVICE_SERIES]:
        for family in collector.describe() if hasattr(collector, "describe") else ():
            if not family.name.startswith("pdfleet_"):
                continue
            names = {family.name, f"{family.name}_total"}
            names |= {family.name + suffix for suffix in HISTOGRAM_SUFFIXES}
            label_names = set(getattr(collector, "_labelnames", ())) | {"le"}
            for name in names:
                found[name] = label_names
    return found


def _vllm_metrics() -> set[str]:
    names = {
        value
        for key, value in vars(promql).items()
        if key.isupper() and isinstance(value, str) and value.startswith("vllm:")
    }
    names.add("vllm:num_requests_running")
    return names | {name + suffix for name in names for suffix in HISTOGRAM_SUFFIXES}


def _rules(tmp_path: Path) -> list[dict[str, Any]]:
    rule = one(render(VALUE_SETS["monitoring"], tmp_path), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def _check_metrics(expr: str) -> list[str]:
    operator, vllm = _operator_metrics(), _vllm_metrics()
    problems = []
    for name in METRIC.findall(expr):
        if name in LABEL_NAMES:
            continue
        if name not in operator and name not in vllm:
            problems.append(f"unknown metric {name} in {expr}")
    return problems


def test_promtool_accepts_the_alerting_rules(tmp_path: Path) -> None:
    promtool = toolchain_binary("promtool", "PDFLEET_PROMTOOL")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": _rules(tmp_path)}))
    result = subprocess.run(
        [str(promtool), "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_use_only_existing_metrics(tmp_path: Path) -> None:
    problems = [p for g in _rules(tmp_path) for r in g["rules"] for p in _check_metrics(r["expr"])]
    assert problems == []


def test_every_alert_has_severity_summary_and_runbook(tmp_path: Path) -> None:
    for group in _rules(tmp_path):
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            assert rule["labels"]["team"] == "inference", "alertLabels are applied"
            assert rule["annotations"]["summary"]
            anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
            assert anchor == rule["alert"].lower()


def test_runbook_anchors_exist_in_the_observability_doc(tmp_path: Path) -> None:
    doc = (CHART.parent.parent / "docs" / "observability.md").read_text()
    headings = {line.lstrip("#").strip().lower() for line in doc.splitlines() if line[:1] == "#"}
    for group in _rules(tmp_path):
        for rule in group["rules"]:
            assert rule["alert"].lower() in headings, rule["alert"]


def test_dashboard_queries_use_only_existing_metrics_and_labels() -> None:
    operator = _operator_metrics()
    problems = []
    for expr in _dashboard_exprs():
        problems += _check_metrics(expr)
        for name, selector in re.findall(r"(pdfleet_[a-z_]+)\{([^}]*)\}", expr):
            used = set(re.findall(r"([a-z_]+)\s*[=!]~?", selector))
            problems += [f"{name} has no label {u}" for u in used - operator.get(name, set())]
        for name, selector in re.findall(r"(vllm:[a-z_:]+)\{([^}]*)\}", expr):
            used = set(re.findall(r"([a-z_]+)\s*[=!]~?", selector))
            problems += [f"{name} has no label {u}" for u in used - WORKER_LABELS]
    assert problems == []


def test_dashboard_is_importable_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "service", "quantile"} <= variables
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("time to first token", "inter-token latency", "workers", "decisions", "drain"):
        assert topic in titles


def test_dashboard_configmap_carries_the_json(tmp_path: Path) -> None:
    config_map = one(render(VALUE_SETS["monitoring"], tmp_path), "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["pdfleet.json"]) == json.loads(DASHBOARD.read_text())


PROMTOOL_TESTS: dict[str, Any] = {
    "rule_files": ["rules.yaml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # The leader died 10 minutes ago; the standby never took over.
                {"series": f'pdfleet_leader{{namespace="{NAMESPACE}",pod="op-0"}}',
                 "values": "1x5 0x15"},
                {"series": f'pdfleet_leader{{namespace="{NAMESPACE}",pod="op-1"}}',
                 "values": "0x20"},
                # TTFT 0.9s against a 0.5s target for 20 minutes.
                {"series": 'pdfleet_slo_observed_seconds{namespace="serving",'
                           'pdfleet_service="llama",slo="ttft",pod="op-0"}',
                 "values": "0.9x20"},
                {"series": 'pdfleet_slo_target_seconds{namespace="serving",'
                           'pdfleet_service="llama",slo="ttft",pod="op-0"}',
                 "values": "0.5x20"},
                # 80 % of requests meet both targets, each target alone more: only the
                # series for both may fire PdfleetSLOAttainmentLow (objective 90 %).
                *({"series": 'pdfleet_slo_attainment_ratio{namespace="serving",'
                             f'pdfleet_service="llama",slo="{slo}",pod="op-0"}}',
                   "values": f"{share}x20"}
                  for slo, share in (("ttft", 0.99), ("itl", 0.81), ("both", 0.8))),
                # Another service at 95 % for both.
                {"series": 'pdfleet_slo_attainment_ratio{namespace="serving",'
                           'pdfleet_service="qwen",slo="both",pod="op-0"}',
                 "values": "0.95x20"},
                # Ready decode workers but no vLLM series from them.
                {"series": 'pdfleet_pool_replicas{namespace="serving",pdfleet_service="llama",'
                           'pdfleet_role="decode",state="ready",pod="op-0"}',
                 "values": "2x20"},
                {"series": 'vllm:num_requests_running{namespace="serving",'
                           'pdfleet_service="llama",pdfleet_role="prefill",pod="w-0"}',
                 "values": "1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "PdfleetOperatorNoLeader", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "PdfleetOperatorNoLeader",
                 "exp_alerts": [{"exp_labels": {"severity": "critical", "team": "inference"}}]},
                {"eval_time": "15m", "alertname": "PdfleetTTFTAboveSLO",
                 "exp_alerts": [{"exp_labels": {
                     "severity": "warning", "team": "inference",
                     "namespace": "serving", "pdfleet_service": "llama"}}]},
                {"eval_time": "15m", "alertname": "PdfleetITLAboveSLO", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "PdfleetSLOAttainmentLow", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "PdfleetSLOAttainmentLow",
                 "exp_alerts": [{"exp_labels": {
                     "severity": "warning", "team": "inference",
                     "namespace": "serving", "pdfleet_service": "llama"}}]},
                {"eval_time": "15m", "alertname": "PdfleetWorkerMetricsMissing",
                 "exp_alerts": [{"exp_labels": {
                     "severity": "warning", "team": "inference", "namespace": "serving",
                     "pdfleet_service": "llama", "pdfleet_role": "decode"}}]},
            ],
        }
    ],
}  # fmt: skip


def test_alerts_fire_on_the_series_they_are_meant_for(tmp_path: Path) -> None:
    promtool = toolchain_binary("promtool", "PDFLEET_PROMTOOL")
    groups = _rules(tmp_path)
    for rule in (rule for group in groups for rule in group["rules"]):
        rule.pop("annotations")  # promtool compares them too; their text is checked above
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests_file = tmp_path / "tests.yaml"
    tests_file.write_text(yaml.safe_dump(PROMTOOL_TESTS))
    result = subprocess.run(
        [str(promtool), "test", "rules", str(tests_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
