"""What admission admits, the operator can run.

Hypothesis draws InferenceServices from the whole admitted range of every field (durations
at both ends of their ranges, any port, any Unicode in free text, any parallelism), keeps
those the models admit (the pydantic models with their rules, the stand-in for the API
server here; the integration tier proves the CRD agrees), and runs each through the
operator's pure code: plan and render, and, with SLO targets, the autoscaler's config and a
few decisions on drawn metrics. Nothing may raise, and every child must be one the API server
takes: one env entry per name, distinct ports, valid labels, an apply body its YAML decoder
reads back unchanged. The hostile specs (tests/cases/hostile_specs.yaml) are replayed against
the models, and a config with zeros in it must still decide.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pdfleet import labels
from pdfleet.api.crd import crd
from pdfleet.api.rules import error_paths
from pdfleet.api.types import DURATION_PATTERN, parse_duration
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.autoscale import capacity as cap
from pdfleet.autoscale import policy
from pdfleet.autoscale.actuator import policy_config
from pdfleet.autoscale.policy import Decision, MetricsWindow, RoleMetrics, RoleReplicas
from pdfleet.kube.api import apply_body
from pdfleet.reconcile.observed import Observed
from pdfleet.reconcile.plan import plan
from tests.spec_cases import HOSTILE_FILE, InvalidCase, invalid_cases, normalize_path
from tests.spec_strategies import oracle

RUNS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
CASES = invalid_cases(HOSTILE_FILE)

# ---------------------------------------------------------------------------------------------
# Strategies: the admitted range of each field, its ends drawn often.


def durations(low: str, high: str) -> st.SearchStrategy[str]:
    lo, hi = round(parse_duration(low) * 1000), round(parse_duration(high) * 1000)
    return st.one_of(st.sampled_from([low, high]), st.integers(lo, hi).map(lambda ms: f"{ms}ms"))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


TEXT = st.text(max_size=40)  # any Unicode: controls, emoji, the YAML line breaks
PORTS = st.one_of(
    st.sampled_from([1024, 5600, 8000, 29000, 65472, 65535]), st.integers(1024, 65535)
)
ARGS = st.lists(
    st.one_of(st.sampled_from(["--enforce-eager", "--seed=7", "--block-size"]), TEXT), max_size=4
)
ENV_NAME = st.one_of(
    st.sampled_from(["NOTE", "HF_HOME", "HF_TOKEN", "UCX_LOG_LEVEL", "PDFLEET_ENGINE"]),
    st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_.-]{0,20}\Z"),
)
ENV = st.lists(st.fixed_dictionaries({"name": ENV_NAME, "value": TEXT}), max_size=3)


@st.composite
def roles(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(0, 3))
    high = draw(st.integers(max(low, 1), 6))
    replicas = {"min": low, "max": high}
    if draw(st.booleans()):
        replicas["initial"] = draw(st.integers(low, high))
    parallelism = {
        "tensor": draw(st.sampled_from([1, 2, 8, 64])),
        "data": draw(st.sampled_from([1, 2, 64])),
    }
    return {
        "replicas": replicas,
        "parallelism": parallelism,
        "extraArgs": draw(ARGS),
        "env": draw(ENV),
    }


def _budget_floor(spec: dict[str, Any]) -> int:
    """The fewest GPUs the spec's budget rules allow."""

    def gpus(role: dict[str, Any]) -> int:
        return int(role["parallelism"]["tensor"] * role["parallelism"]["data"])

    pools = [spec["prefill"], spec["decode"]]
    start: int = sum(p["replicas"].get("initial", p["replicas"]["min"]) * gpus(p) for p in pools)
    least: int = sum(p["replicas"]["min"] * gpus(p) for p in pools)
    return max(start, least, *(gpus(p) for p in pools))


SOURCES = st.one_of(
    st.none(),
    st.builds(lambda path: {"pvc": {"claimName": "models", "path": "/" + path}}, TEXT),
    st.builds(
        lambda id_, rev, token: {
            "hub": {
                k: v
                for k, v in {"id": id_, "revision": rev, "tokenSecretRef": token}.items()
                if v is not None
            }
        },
        maybe(TEXT.filter(bool)),
        maybe(TEXT.filter(bool)),
        maybe(st.just({"name": "hub-token"})),
    ),
)
FABRICS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"rdmaResource": st.just("rdma/ib")},
        optional={
            "rdmaPerReplica": st.integers(1, 64),
            "networks": st.just(["rdma-net"]),
            "ucx": st.fixed_dictionaries(
                {}, optional={"tls": st.just("rc_x,tcp"), "gidIndex": st.integers(0, 255)}
            ),
        },
    ),
)


@st.composite
def admitted_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": draw(TEXT.filter(bool))},
        "engine": {
            "image": draw(TEXT.filter(bool)),
            "port": draw(PORTS),
            "extraArgs": draw(ARGS),
            "env": draw(ENV),
        },
        "prefill": draw(roles()),
        "decode": draw(roles()),
        "kvTransfer": {
            "sideChannelPort": draw(st.integers(1024, 65472)),
            "leaseSeconds": draw(maybe(st.integers(1, 3600))),
            "bufferDevice": draw(st.sampled_from(["cuda", "cpu"])),
            "fabric": draw(FABRICS),
            "preflight": {"enabled": draw(st.booleans()), "port": draw(PORTS)},
        },
        "router": {
            "type": draw(st.sampled_from(["vllm-router", "external"])),
            "image": draw(maybe(TEXT.filter(bool))),
            "replicas": draw(st.integers(1, 32)),
            "port": draw(PORTS),
            "metricsPort": draw(PORTS),
            "policy": draw(st.sampled_from(["power_of_two", "cache_aware", "round_robin"])),
            "healthCheckInterval": draw(durations("1s", "1h")),
        },
        "drain": {"timeout": draw(durations("1s", "24h"))},
        "networkPolicy": {"enabled": draw(st.booleans())},
    }
    spec["model"]["source"] = draw(SOURCES)
    spec["model"]["maxModelLen"] = draw(maybe(st.integers(16, 10_000_000)))
    if draw(st.booleans()):
        target = durations("1ms", "1h")
        percentile = st.floats(0.001, 99.999)
        spec["slo"] = {
            "ttft": {"target": draw(target), "percentile": draw(percentile)},
            "itl": {"target": draw(target), "percentile": draw(percentile)},
            "window": draw(durations("10s", "6h")),
        }
        spec["autoscaling"] = {
            "enabled": draw(st.booleans()),
            "gpuBudget": _budget_floor(spec) + draw(st.integers(0, 16)),
            "prometheus": {"url": "http://prometheus.monitoring:9090"},
            "interval": draw(durations("1s", "1h")),
            "scaleUpStabilization": draw(durations("0s", "24h")),
            "scaleDownStabilization": draw(durations("1s", "24h")),
            "workerStartup": draw(durations("1s", "24h")),
            "maxScaleUpStep": draw(st.integers(1, 1000)),
            "maxScaleDownStep": draw(st.integers(1, 1000)),
        }
    obj = {"metadata": {"name": "llama", "namespace": "ns", "uid": "u1", "generation": 1}}
    obj["spec"] = _drop_none(spec)
    assume(not oracle(obj))  # the rules across fields (distinct ports) refuse a few
    return obj


def _drop_none(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_none(v) for k, v in node.items() if v is not None}
    return node


LATENCY = st.one_of(st.just(math.nan), st.floats(0.0, 100.0))
RATE = st.floats(0.0, 1e6)
ROLE_METRICS = st.builds(
    RoleMetrics,
    ttft_s=LATENCY,
    itl_s=LATENCY,
    request_rate=RATE,
    prompt_tokens_rate=RATE,
    generation_tokens_rate=RATE,
    num_requests_waiting=st.floats(0.0, 1e4),
    kv_cache_usage=st.floats(0.0, 1.0),
    prompt_tokens_rate_peak=st.one_of(st.just(math.nan), RATE),
)


# ---------------------------------------------------------------------------------------------
# What the API server would refuse in a child.


def _containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    template = manifest.get("spec", {}).get("template", {})
    return list(template.get("spec", {}).get("containers", []))


def _check_child(manifest: dict[str, Any]) -> None:
    for container in _containers(manifest):
        names = Counter(item["name"] for item in container.get("env", []))
        assert not [n for n, count in names.items() if count > 1], names
        ports = [p["containerPort"] for p in container.get("ports", [])]
        assert len(ports) == len(set(ports)) and all(1 <= p <= 65535 for p in ports), ports
    if manifest["kind"] == "Service":
        ports = [p["port"] for p in manifest["spec"]["ports"]]
        assert len(ports) == len(set(ports)), ports
    for value in manifest["metadata"].get("labels", {}).values():
        assert len(value) <= 63 and LABEL_VALUE.match(value), value
    # the YAML decoder of server-side apply reads the body back as it was sent (libyaml, like
    # the API server's, refuses what YAML may not carry and folds its line breaks)
    assert yaml.load(apply_body(manifest), Loader=yaml.CSafeLoader) == manifest


# ---------------------------------------------------------------------------------------------
# Tests


@RUNS
@given(obj=admitted_specs(), data=st.data())
def test_an_admitted_spec_plans_renders_and_autoscales(
    obj: dict[str, Any], data: st.DataObject
) -> None:
    isvc = InferenceService.model_validate(obj)
    desired = {
        role: {"desired": data.draw(st.integers(0, 8), label=f"{role} desired")}
        for role in labels.WORKER_ROLES
    }
    replicas, children = plan(isvc, Observed(), desired)
    for manifest in children.apply:
        _check_child(manifest)
    if isvc.spec.slo is None:
        return
    config = policy_config(isvc, data.draw(st.floats(0.0, 10.0), label="kv transfer s"))
    now = 1_000_000.0
    history: tuple[Decision, ...] = ()
    window = parse_duration(isvc.spec.slo.window)
    for _ in range(data.draw(st.integers(1, 4), label="decisions")):
        now += config.interval_s
        metrics = data.draw(
            maybe(
                st.builds(
                    MetricsWindow,
                    st.just(now),
                    st.just(window),
                    maybe(ROLE_METRICS),
                    maybe(ROLE_METRICS),
                )
            ),
            label="metrics",
        )
        fleet = {
            role: RoleReplicas(current=count, ready=data.draw(st.integers(0, count)))
            for role, count in replicas.items()
        }
        decision = policy.decide(config, now, fleet["prefill"], fleet["decode"], metrics, history)
        history = policy.trim_history((*history, decision), now, config)
        for role in policy.ROLES:
            low, high = config.bounds(role)
            assert low <= decision.desired(role) <= high
        replicas = {"prefill": decision.prefill, "decode": decision.decode}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_hostile_spec_is_refused_naming_the_field(case: InvalidCase) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        InferenceService.model_validate(case.obj)
    lines = error_paths(refused.value)
    named = [
        line
        for line in lines
        if normalize_path(line.split(": ", 1)[0]) == normalize_path(case.field)
    ]
    assert named and any(case.message in line for line in named), lines


def test_every_duration_of_the_spec_has_a_usable_range() -> None:
    def walk(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
        found = [(path, node)] if node.get("pattern") == DURATION_PATTERN else []
        for name, prop in node.get("properties", {}).items():
            found += walk(prop, f"{path}.{name}")
        return found

    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    durations_found = walk(schema, "spec")
    assert len(durations_found) >= 8
    for path, node in durations_found:
        rules = [entry["rule"] for entry in node.get("x-kubernetes-validations", [])]
        assert any("duration(self) >=" in rule for rule in rules), path


def test_a_zero_that_slipped_past_admission_divides_nothing() -> None:
    zero = policy.PolicyConfig(
        ttft_target_s=0.0,
        itl_target_s=0.0,
        scale_down_stabilization_s=0.0,
        capacity_half_life_s=0.0,
        burst_memory_half_life_s=0.0,
        backlog_drain_s=0.0,
        prefill_target_utilization=0.0,
        decode_target_utilization=math.nan,
        prefill_capacity_prior=1000.0,
        decode_capacity_prior=1000.0,
    )
    busy = RoleMetrics(0.5, 0.05, 10.0, 5000.0, 800.0, 3.0, 0.5, 9000.0)
    history: tuple[Decision, ...] = ()
    for step in range(6):
        # long gaps: a half-life fades to nothing rather than divide by zero
        now = 1_000.0 + step * 100_000.0
        metrics = MetricsWindow(now, 60.0, busy, busy)
        pool = RoleReplicas(2, 2)
        decision = policy.decide(zero, now, pool, pool, metrics, history)
        history = policy.trim_history((*history, decision), now, zero)
    assert 1 <= decision.prefill <= zero.prefill_max


def test_a_memory_faded_past_the_smallest_float_is_forgotten() -> None:
    # the longest interval (1h) over the shortest half-life (3 x 1s) underflows to zero
    seen = cap.observe(cap.RoleCapacity(), 0.0, 100.0, 0.2, 0.1, 3.0)
    later = cap.observe(seen, 3600.0, 100.0, 0.05, 0.1, 3.0)
    assert later.weight == 1.0 and later.ceiling == math.inf
    bracket = cap.observe_bracket(cap.Bracket(), 0.0, 100.0, 0.2, 0.1, 3.0, None)
    assert cap.observe_bracket(bracket, 3600.0, 100.0, 0.05, 0.1, 3.0, None).broke == math.inf
