"""The chart's Grafana dashboard and SLO alerts, read from the real Prometheus of a running fleet.

The demo fleet (conftest.py), prefill capped at one worker, serves a light load through its
router, under which the autoscaler drains the second decode worker; beside it, a service in
another namespace whose StatefulSet the API server refuses makes the operator count failed
passes. Prometheus scrapes the workers with the shipped Kubernetes SD job and the operator as
the chart's ServiceMonitor does, and evaluates the chart's rendered PrometheusRule.

* **Dashboard**: its template variables are resolved as Grafana resolves them (the
  ``label_values`` queries against Prometheus, one selected namespace and service, then
  "All"), and every target of every panel is sent as Grafana sends it: a range query over the
  load with ``$__interval``, ``$__rate_interval`` and ``$__range`` computed as Grafana does
  for a data source scraped every second, or an instant query for a table. Each must answer
  at least one series, and every series must hold a finite value: a panel without either
  shows nothing on a healthy fleet.
* **Alerts**: every rule evaluates without error; over the light load no SLO alert of the
  service was pending or firing (while the SLO series they compare existed) and nothing fired
  at all; the refused service puts its own alerts in pending. Then prefill, capped at one
  worker, gets more long prompts than it serves: TTFT blows through its target, and
  PdfleetTTFTAboveSLO and PdfleetSLOAttainmentLow go pending and then firing after the
  rules' ``for:``, while PdfleetITLAboveSLO stays silent (decode is not starved).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import REPO_ROOT, Cluster, wait_until
from e2e.platform.fleet import MODEL, Fleet, condition, drive
from e2e.platform.loadgen import OK, LoadRun, Phase
from e2e.platform.prometheus import Prometheus, duration
from pdfleet import labels
from pdfleet.api.types import parse_duration
from tests.e2e.observability.conftest import SLO_VIOLATION_FOR, TIME_SCALE
from tests.integration.chart.helm import CHART

pytestmark = pytest.mark.timeout(900)

DASHBOARD = CHART / "dashboards" / "pdfleet.json"
#: Light load, well inside what one prefill and one decode worker serve, with short answers so
#: that the autoscaler takes the demo's second decode worker away once its scale-down
#: stabilization has passed.
LIGHT = Phase("light", 60.0, 0.5, 1000, 16)
#: Long prompts at about twice the prompt tokens one prefill worker serves at this time scale:
#: its queue, and TTFT with it, grow for as long as the load lasts.
STARVING = Phase("long prompts", 300.0, 1.0, 8000, 8)
#: An ITL target on one of the workers' ITL bucket bounds (`AGENT_ITL_BUCKETS`), so that the ITL
#: attainment, and with it the attainment of both targets that PdfleetSLOAttainmentLow
#: reads, is exact rather than interpolated (docs/observability.md).
ITL_TARGET = "25ms"
REJECTED = "rejected"
SLO_ALERTS = ("PdfleetTTFTAboveSLO", "PdfleetITLAboveSLO", "PdfleetSLOAttainmentLow")
STARVED_ALERTS = {"PdfleetTTFTAboveSLO", "PdfleetSLOAttainmentLow"}
#: Grafana's interval variables for a data source whose scrape interval is set to the
#: Prometheus' own: over a range of minutes and a panel as wide as a screen `$__interval` is
#: its minimum, the scrape interval; `$__rate_interval` is max(interval + scrape interval,
#: 4 x scrape interval).
SCRAPE_S = 1.0
INTERVAL_S = SCRAPE_S
RATE_INTERVAL_S = max(INTERVAL_S + SCRAPE_S, 4 * SCRAPE_S)
#: Characters Grafana escapes in a multi-value variable's value inside a PromQL regex matcher.
REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|\[\]{}])")
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


@dataclass(frozen=True)
class Window:
    """The light-load run, in Prometheus time (Unix seconds), and the refused service's
    namespace."""

    start: float
    end: float
    rejected: str


def rejected_manifest(namespace: str) -> dict[str, Any]:
    """The minimal sample with a node selector key the API server refuses in a StatefulSet."""
    doc: dict[str, Any] = yaml.safe_load((REPO_ROOT / "crds/samples/minimal.yaml").read_text())
    doc["metadata"].update(name=REJECTED, namespace=namespace)
    doc["spec"]["prefill"]["nodeSelector"] = {"not a label key": "x"}
    return doc


def capped(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The demo fleet with prefill capped at one worker, and an ITL target on a bucket bound."""
    doc = copy.deepcopy(dict(manifest))
    doc["spec"]["prefill"]["replicas"].update(min=1, max=1, initial=1)
    doc["spec"]["slo"]["itl"]["target"] = ITL_TARGET
    return doc


def regex_value(values: list[str] | None, all_value: str = ".*") -> str:
    """A multi-value variable as Grafana writes it into a regex matcher; None is "All"."""
    if values is None:
        return all_value
    escaped = [REGEX_SPECIAL.sub(r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def interpolate(expr: str, variables: Mapping[str, str]) -> str:
    """``$name`` and ``${name}`` replaced; an unknown variable is an error, as in Grafana."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"no value for ${name} in {expr}")
        return variables[name]

    return VARIABLE.sub(value, expr)


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels") or [])


def template_query(name: str) -> str:
    variable = next(v for v in dashboard()["templating"]["list"] if v["name"] == name)
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def label_values(prometheus: Prometheus, query: str) -> list[str]:
    """Grafana's ``label_values(selector, label)`` variable query."""
    match = LABEL_VALUES.match(query)
    assert match, query
    return prometheus.label_values(match.group(2), match.group(1))


def unix_time(stamp: str) -> float:
    """An RFC 3339 time as Prometheus writes it (nanoseconds, Z) in Unix seconds."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


def finite(value: str) -> bool:
    return math.isfinite(float(value))


def ours(alert: Mapping[str, Any], fleet: Fleet) -> bool:
    found = alert["labels"]
    return bool(
        found.get("namespace") == fleet.namespace and found.get("pdfleet_service") == fleet.name
    )


@pytest.fixture(scope="module")
def healthy(fleet: Fleet, bridge_cluster: Cluster) -> Iterator[Window]:
    """The light load, during which the autoscaler drains the second decode worker, beside a
    refused service."""
    start = time.time()
    bridge_cluster.apply([capped(fleet.manifest)])
    rejected = bridge_cluster.create_namespace(f"{fleet.namespace}-rejected")
    bridge_cluster.apply([rejected_manifest(rejected)])
    run = asyncio.run(drive(fleet, [LIGHT], TIME_SCALE)).run
    lost = [r for r in run.records if r.outcome != OK]
    print(f"light load: {len(run.records)} requests, {len(lost)} not completed {lost[:3]}")

    def drained() -> bool:
        decode = fleet.status().get("decode") or {}
        done = (decode.get("desired"), decode.get("ready"), decode.get("draining", 0)) == (1, 1, 0)
        count = 'sum(pdfleet_drain_duration_seconds_count{role="decode"})'
        return done and fleet.prometheus.scalar(count) >= 1

    def stalled() -> bool:
        custom = client.CustomObjectsApi(fleet.api)
        obj = custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, rejected, labels.PLURAL, REJECTED
        )
        found = condition(cast(dict[str, Any], obj).get("status") or {}, "Stalled") or {}
        return found.get("status") == "True" and found.get("reason") == "ChildRejected"

    wait_until(drained, 120, "decode scaled down to one worker, its drain scraped", interval_s=1.0)
    wait_until(stalled, 30, "the refused service Stalled with ChildRejected", interval_s=1.0)
    # A few rate windows past the drain's observation, as a dashboard refreshed a little later.
    time.sleep(2 * RATE_INTERVAL_S)
    yield Window(start, time.time(), rejected)
    bridge_cluster.kubectl("delete", "namespace", rejected, "--wait=false")


def test_the_dashboard_variables_find_the_fleet(fleet: Fleet, healthy: Window) -> None:
    namespaces = label_values(fleet.prometheus, template_query("namespace"))
    assert fleet.namespace in namespaces
    selected = {"namespace": regex_value([fleet.namespace])}
    services = label_values(fleet.prometheus, interpolate(template_query("service"), selected))
    assert services == [fleet.name]


@pytest.mark.parametrize("selection", ["one service", "all"])
def test_every_panel_shows_data(fleet: Fleet, healthy: Window, selection: str) -> None:
    board = dashboard()
    quantile = next(v for v in board["templating"]["list"] if v["name"] == "quantile")
    one = selection == "one service"
    variables = {
        "namespace": regex_value([fleet.namespace] if one else None),
        "service": regex_value([fleet.name] if one else None),
        "quantile": quantile["current"]["value"],
        "__interval": duration(INTERVAL_S),
        "__rate_interval": duration(RATE_INTERVAL_S),
        "__range": f"{round(healthy.end - healthy.start)}s",
    }
    problems, shown = [], 0
    for panel in panels(board["panels"]):
        for target in panel.get("targets") or ():
            where = f"{panel['title']!r} {target['refId']}"
            expr = interpolate(target["expr"], variables)
            if target.get("instant"):
                series = fleet.prometheus.query(expr, at=healthy.end)
                values = [[s["value"][1]] for s in series]
            else:
                series = fleet.prometheus.query_range(expr, healthy.start, healthy.end, INTERVAL_S)
                values = [[v for _, v in s["values"]] for s in series]
            if not series:
                problems.append(f"{where}: no series from {expr}")
                continue
            empty = [s["metric"] for s, vs in zip(series, values, strict=True)
                     if not any(finite(v) for v in vs)]  # fmt: skip
            if empty:
                problems.append(f"{where}: no finite value in {empty} from {expr}")
                continue
            shown += 1
    print(f"{selection}: {shown} panel targets answered with data")
    assert problems == []


def test_every_rule_evaluates_and_no_slo_alert_sounds_while_healthy(
    fleet: Fleet, healthy: Window
) -> None:
    groups = fleet.prometheus.rule_groups()
    assert {g["name"] for g in groups} == {"pdfleet-operator", "pdfleet-services", "pdfleet-slo"}
    broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
              if r["health"] != "ok"]  # fmt: skip
    assert broken == []
    # The series the SLO alerts compare existed all along: their silence is a verdict.
    service = f'namespace="{fleet.namespace}", pdfleet_service="{fleet.name}"'
    for series in (
        f'pdfleet_slo_observed_seconds{{{service}, slo="ttft"}}',
        f'pdfleet_slo_observed_seconds{{{service}, slo="itl"}}',
        f'pdfleet_slo_target_seconds{{{service}, slo="ttft"}}',
        f'pdfleet_slo_attainment_ratio{{{service}, slo="both"}}',
    ):
        found = fleet.prometheus.query(f"count_over_time({series}[30s])", at=healthy.end)
        assert found, f"no {series} in the last 30 s of the light load"
    names = "|".join(SLO_ALERTS)
    sounded = fleet.prometheus.query_range(
        f'ALERTS{{alertname=~"{names}", {service}}}', healthy.start, healthy.end, SCRAPE_S
    )
    assert [s["metric"] for s in sounded] == []
    fired = fleet.prometheus.query_range(
        'ALERTS{alertstate="firing"}', healthy.start, healthy.end, SCRAPE_S
    )
    assert [s["metric"] for s in fired] == []


def test_a_refused_service_puts_its_alerts_in_pending(fleet: Fleet, healthy: Window) -> None:
    pending = {
        (a["labels"]["alertname"], a["labels"].get("pdfleet_service") or a["labels"].get("reason"))
        for a in fleet.prometheus.alerts()
        if a["state"] == "pending" and a["labels"].get("namespace") in (healthy.rejected, None)
    }
    assert ("PdfleetServiceStalled", REJECTED) in pending, pending
    assert ("PdfleetServiceNotReady", REJECTED) in pending, pending
    assert ("PdfleetReconcileErrors", "422") in pending, pending


async def starve(fleet: Fleet, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Long prompts through the router until both starved alerts of the service fire (or
    ``timeout_s``); every alert of the service seen meanwhile, by name, at its latest state,
    with ``firingSeenAt`` (Unix seconds) once seen firing."""
    run = LoadRun(url=fleet.router_url(), model=MODEL, phases=[STARVING], time_scale=TIME_SCALE)
    load = asyncio.create_task(run.run())
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for alert in await asyncio.to_thread(fleet.prometheus.alerts):
                if not ours(alert, fleet):
                    continue
                name = alert["labels"]["alertname"]
                entry = seen.setdefault(name, {})
                entry.update(alert)
                if alert["state"] == "firing":
                    entry.setdefault("firingSeenAt", time.time())
            if all(seen.get(name, {}).get("state") == "firing" for name in STARVED_ALERTS):
                break
            await asyncio.sleep(2.0)
    finally:
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load
    return seen


def test_a_starved_prefill_pool_fires_its_slo_alerts(fleet: Fleet, healthy: Window) -> None:
    started = time.time()
    seen = asyncio.run(starve(fleet, timeout_s=240.0))
    took = time.time() - started
    status = fleet.status()
    print(f"starved prefill: alerts {({n: a['state'] for n, a in seen.items()})} after "
          f"{took:.0f}s; status.slo {status.get('slo')}")  # fmt: skip
    for name in sorted(STARVED_ALERTS):
        assert seen.get(name, {}).get("state") == "firing", (name, seen)
        # Pending first, for at least the rules' `for:`.
        went_pending = unix_time(seen[name]["activeAt"])
        assert seen[name]["firingSeenAt"] - went_pending >= parse_duration(SLO_VIOLATION_FOR)
        assert seen[name]["labels"]["severity"] == "warning"
    # Decode kept up: its alert never sounded.
    assert "PdfleetITLAboveSLO" not in seen, seen["PdfleetITLAboveSLO"]
    # The pool was starved, not rescued: its cap held it at one worker.
    assert status["prefill"]["desired"] == 1
