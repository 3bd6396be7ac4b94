"""Pure parts of the scale benchmark: sizing, floor manifests, audit and metrics parsing,
percentiles, process usage, targets and the table."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import yaml

from e2e.benchmarks.bench_scale import (
    OPERATOR_USER,
    PODS_PER_NODE,
    SAMPLE,
    AuditEntry,
    audit_entries,
    audit_policy,
    floor_children,
    kv_verdict,
    latency_breakdown,
    render_table,
    requests_by_verb,
    requests_summary,
    scale_nodes,
    service_keys,
    service_manifest,
    targets,
    usage,
)
from e2e.platform.stats import percentile


def test_nodes_hold_every_pod_with_headroom_inside_their_pod_cidr() -> None:
    nodes = scale_nodes(1000)
    gpu = [n for n in nodes if n.gpu_product]
    cpu = [n for n in nodes if not n.gpu_product]
    assert sum(n.gpus for n in gpu) >= 3000 * 1.25 and sum(n.pods for n in cpu) >= 1000 * 1.25
    assert all(n.pods == PODS_PER_NODE <= 254 for n in nodes)  # a /24 each
    assert len({n.pod_cidr for n in nodes}) == len(nodes)


def test_services_spread_over_namespaces() -> None:
    keys = service_keys("scale", 250)
    assert keys[0] == ("scale-0", "svc-0000") and keys[-1] == ("scale-2", "svc-0249")
    assert len(set(keys)) == 250


def test_floor_applies_what_the_operator_would_without_an_owner() -> None:
    manifest = service_manifest(yaml.safe_load(SAMPLE.read_text()), "ns", "svc-0001")
    children = floor_children(manifest)
    assert len(children) == 12
    assert all("ownerReferences" not in c["metadata"] for c in children)
    assert all("pdfleet.dev/applied-hash" in c["metadata"]["annotations"] for c in children)
    replicas = {c["metadata"]["name"]: c["spec"]["replicas"] for c in children if "replicas" in (
        c.get("spec") or {})}  # fmt: skip
    assert replicas == {"svc-0001-prefill": 1, "svc-0001-decode": 2, "svc-0001-router": 1}


def _audit(verb: str, stage: str, resource: str, t: str, **extra: Any) -> str:
    return json.dumps(
        {
            "stage": stage,
            "verb": verb,
            "requestReceivedTimestamp": t,
            "stageTimestamp": t,
            "user": {"username": OPERATOR_USER},
            "objectRef": {"resource": resource, **extra},
            "responseStatus": {"code": 200},
        }
    )


def test_audit_lines_count_each_request_once_and_keep_leases_apart() -> None:
    lines = [
        _audit("patch", "ResponseComplete", "statefulsets", "2026-01-01T00:00:01.5Z"),
        _audit("watch", "ResponseStarted", "pods", "2026-01-01T00:00:01Z"),
        _audit("watch", "ResponseComplete", "pods", "2026-01-01T00:00:01Z"),
        _audit("patch", "ResponseComplete", "inferenceservices", "2026-01-01T00:00:02Z",
               subresource="status"),
        _audit("update", "ResponseComplete", "leases", "2026-01-01T00:00:03Z"),
        _audit("get", "ResponseComplete", "leases", "2026-01-01T00:00:03Z"),
        _audit("patch", "ResponseComplete", "services", "2026-01-01T00:00:09Z"),  # after t1
        "",
    ]  # fmt: skip
    entries = list(audit_entries(lines))
    assert len(entries) == 6
    t0 = entries[1].t
    summary = requests_summary(entries, t0, t0 + 5)
    assert summary["by_verb"] == {"get": 1, "patch": 2, "update": 1, "watch": 1}
    assert summary["writes_by_resource"] == {
        "patch inferenceservices/status": 1,
        "patch statefulsets": 1,
        "update leases": 1,
    }
    assert summary["writes"] == 2 and summary["lease_writes"] == 1


def test_latency_breakdown_splits_reaction_and_server_time() -> None:
    """The writes of one pass go out at once: the server's share is their span, not a sum."""

    def sts(name: str, t: float, took: float) -> AuditEntry:
        return AuditEntry(t, "patch", "statefulsets", OPERATOR_USER, 200, t + took, "ns", name)

    entries = [
        sts("a-prefill", 5.0, 0.5),  # before the change: not this change's pass
        sts("a-prefill", 10.3, 0.2),
        sts("a-decode", 10.35, 0.3),
        sts("a-decode", 30.0, 0.3),  # a later pass (pods rolling)
        sts("b-prefill", 20.1, 0.1),
        sts("b-decode", 20.2, 0.1),
    ]
    changed = [("ns", "a", 10.0, 10.1), ("ns", "b", 20.0, 20.05), ("ns", "c", 25.0, 25.1)]
    got = latency_breakdown(entries, changed)
    assert got["changes"] == 2
    assert got["reaction_p99_s"] == pytest.approx(0.3)
    assert got["reaction_p50_s"] == pytest.approx(0.1)
    assert got["after_commit_p99_s"] == pytest.approx(0.2)
    assert got["after_commit_p50_s"] == pytest.approx(0.05)
    assert got["server_p99_s"] == pytest.approx(0.35)
    assert got["server_p50_s"] == pytest.approx(0.2)


def test_a_kv_verdict_is_any_kv_transport_condition() -> None:
    def isvc(*conditions: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": "a"}, "status": {"conditions": list(conditions)}}

    assert kv_verdict(isvc({"type": "KVTransportReady", "status": "False"}))
    assert kv_verdict(isvc({"type": "KVTransportReady", "status": "True"}))
    assert not kv_verdict(isvc({"type": "Ready", "status": "True"}))
    assert not kv_verdict({"metadata": {"name": "a"}})


def test_audit_policy_logs_only_the_operator() -> None:
    rules = audit_policy("someone")["rules"]
    assert rules[0] == {"level": "Metadata", "users": ["someone"]} and rules[-1]["level"] == "None"


def test_apiserver_requests_are_summed_by_verb() -> None:
    text = "\n".join(
        [
            "# HELP apiserver_request_total Counter",
            'apiserver_request_total{code="201",component="apiserver",resource="pods",'
            'verb="POST",version="v1"} 3',
            'apiserver_request_total{code="409",resource="pods",verb="POST"} 1',
            'apiserver_request_total{code="200",resource="leases",verb="PUT"} 2.0',
            'apiserver_request_duration_seconds_count{verb="POST"} 99',
        ]
    )
    assert requests_by_verb(text) == {"POST": 4.0, "PUT": 2.0}


@pytest.mark.parametrize(
    ("q", "expected"), [(50, 50.0), (99, 99.0), (100, 100.0), (0, 1.0), (1, 1.0)]
)
def test_percentile_is_nearest_rank(q: float, expected: float) -> None:
    assert percentile([float(x) for x in range(100, 0, -1)], q) == expected


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 50))


def test_usage_over_a_window() -> None:
    samples = [(0.0, 1.0, 50.0), (1.0, 2.0, 80.0), (2.0, 4.5, 70.0), (3.0, 9.0, 200.0)]
    got = usage(samples, 0.5, 2.5)
    assert (got.cpu_s, got.peak_rss_mb, got.end_rss_mb) == (2.5, 80.0, 70.0)
    assert math.isnan(usage(samples, 10, 11).cpu_s)


def _results(p99: float, writes: int) -> dict[str, Any]:
    requests = {"by_verb": {"patch": 10}, "writes": writes, "lease_writes": 12}
    window = {"operator_requests": requests, "usage": {"cpu_s": 3.0, "end_rss_mb": 90.0}}
    return {
        "services": 10,
        "children": 120,
        "floor": {"ready_s": 10.0},
        "convergence_ratio": 1.2,
        "peak_rss_mb": 120.0,
        "operator": {
            "create": {"ready_s": 12.0, "apiserver_requests": {"POST": 5}, **window},
            "steady": {"seconds": 300.0, **window},
            "latency": {"changes": 100, "p50_s": 0.2, "p99_s": p99},
            "restart": {"resumed_s": 4.0, **window},
        },
    }


def test_targets_are_judged_on_the_measured_values() -> None:
    met = {t["name"]: t["met"] for t in targets(_results(p99=0.8, writes=0))}
    assert met == {
        "convergence_ratio": True,
        "peak_rss_mb": True,
        "idle_writes": True,
        "reconcile_p99_s": True,
    }
    missed = {t["name"] for t in targets(_results(p99=1.4, writes=3)) if not t["met"]}
    assert missed == {"idle_writes", "reconcile_p99_s"}


def test_table_shows_every_phase_and_marks_missed_targets() -> None:
    table = render_table(_results(p99=1.4, writes=0))
    assert "| Convergence ratio (operator / floor) | 1.20x |" in table
    assert "| Steady 300 s: operator writes (lease renewals apart) | 0 (12 lease) |" in table
    assert "| reconcile_p99_s | 1.00 | 1.40 | **no** |" in table
    assert "| idle_writes | 0 | 0 | yes |" in table


def test_table_says_how_far_a_restart_got_when_it_did_not_finish() -> None:
    results = _results(p99=0.5, writes=0)
    results["operator"]["restart"].update(resumed_s=None, timeout_s=600.0, reconciled=120)
    table = render_table(results)
    assert (
        "| Restart: start -> every service reconciled once | not within 600 s (120 reconciled) |"
        in table
    )
