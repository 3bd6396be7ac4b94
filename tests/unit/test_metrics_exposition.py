"""What /metrics serves: the default registry and the per-service series rendered ahead."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pdfleet import metrics
from tests.unit.operator_metrics import labels, samples, value

STATUS: dict[str, Any] = {
    "prefill": {"desired": 1, "replicas": 1, "ready": 1, "summary": "1/1"},
    "decode": {"desired": 2, "replicas": 2, "ready": 1},
    "conditions": [
        {"type": "Ready", "status": "False"},
        {"type": "Stalled", "status": "True"},
    ],
}


def test_a_service_status_becomes_its_series_and_leaves_none_when_forgotten() -> None:
    metrics.export_status("expo", 'odd"name\\', STATUS)
    service = {"namespace": "expo", "pdfleet_service": 'odd"name\\'}
    assert value("pdfleet_pool_replicas", **service, pdfleet_role="decode", state="ready") == 1
    assert value("pdfleet_pool_replicas", **service, pdfleet_role="prefill", state="desired") == 1
    assert value("pdfleet_service_condition", **service, condition="Stalled") == 1
    assert value("pdfleet_service_condition", **service, condition="Ready") == 0
    assert not [k for k in samples("pdfleet_pool_replicas") if ("state", "summary") in k]

    metrics.export_status("expo", 'odd"name\\', {**STATUS, "conditions": []})
    assert value("pdfleet_service_condition", **service, condition="Stalled") is None

    metrics.forget_service("expo", 'odd"name\\')
    for name in ("pdfleet_pool_replicas", "pdfleet_service_condition"):
        assert not [k for k in samples(name) if labels(**service) <= k]


def test_the_rendered_text_parses_to_every_series_of_the_status_and_no_other() -> None:
    metrics.export_status("expo", "svc-a", STATUS)
    served = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
        if s.labels.get("pdfleet_service") == "svc-a"
    }
    service = {("namespace", "expo"), ("pdfleet_service", "svc-a")}
    pools = {
        ("pdfleet_pool_replicas", frozenset({*service, ("pdfleet_role", role), ("state", k)})): v
        for role in ("prefill", "decode")
        for k, v in STATUS[role].items()
        if isinstance(v, int)
    }
    conditions = {
        ("pdfleet_service_condition", frozenset({*service, ("condition", c)})): v
        for c, v in (("Ready", 0.0), ("Stalled", 1.0))
    }
    assert served == {**pools, **conditions}
    metrics.forget_service("expo", "svc-a")


def test_the_server_serves_the_exposition() -> None:
    metrics.export_status("expo", "svc-b", STATUS)
    server = metrics.serve(0, addr="127.0.0.1")
    try:
        response = httpx.get(f"http://127.0.0.1:{server.server_address[1]}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert 'pdfleet_service="svc-b",pdfleet_role="decode",state="ready"} 1.0' in response.text
        assert "# TYPE pdfleet_reconcile_duration_seconds histogram" in response.text
    finally:
        server.shutdown()
        server.server_close()
        metrics.forget_service("expo", "svc-b")


def test_the_drain_series_of_both_roles_are_served_before_any_drain() -> None:
    # A series born at its first drain gives rate() and increase() nothing to count from.
    for role in ("prefill", "decode"):
        assert value("pdfleet_drain_forced_total", role=role) is not None
        assert value("pdfleet_drain_duration_seconds_count", role=role) is not None
