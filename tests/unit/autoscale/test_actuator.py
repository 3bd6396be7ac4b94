"""The autoscaler inside the operator: spec -> policy config, decisions -> status and Events."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.autoscale.actuator import (
    READ_DEADLINE_S,
    READ_POLL_S,
    Autoscaler,
    WindowReads,
    decision_reason,
    describe,
    policy_config,
)
from pdfleet.autoscale.attainment import Buckets
from pdfleet.autoscale.policy import (
    Capacity,
    Decision,
    MetricsWindow,
    PolicyCondition,
    PolicyConfig,
    RoleMetrics,
    following_scale_down_window,
)
from pdfleet.controller import Controller
from pdfleet.reconcile.observed import Observed, PodInfo, observed_from
from pdfleet.reconcile.plan import desired_replicas, with_hash
from pdfleet.render import render_children
from tests.spec_cases import merge_patch, sample
from tests.unit.fakes import Inline, Writer
from tests.unit.operator_metrics import counted, labels, samples, value

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
AUTOSCALED = {
    "metadata": {"namespace": "ns", "uid": "u1", "generation": 1},
    "spec": {
        "prefill": {"replicas": {"min": 1, "max": 4, "initial": 1}},
        "decode": {"replicas": {"min": 1, "max": 4, "initial": 1}},
        "slo": {
            "ttft": {"target": "1s", "percentile": 90},
            "itl": {"target": "20ms", "percentile": 95},
        },
        "autoscaling": {
            "enabled": True,
            "gpuBudget": 6,
            "prometheus": {"url": "http://prom:9090"},
            "interval": "15s",
        },
    },
}


def _body() -> dict[str, Any]:
    body: dict[str, Any] = merge_patch(sample("minimal"), AUTOSCALED)
    return body


def _isvc() -> InferenceService:
    return InferenceService.model_validate(_body())


def _metrics(ttft: float, itl: float, prompt_rate: float = 1000.0) -> RoleMetrics:
    return RoleMetrics(
        ttft_s=ttft,
        itl_s=itl,
        request_rate=1.0,
        prompt_tokens_rate=prompt_rate,
        generation_tokens_rate=100.0,
        num_requests_waiting=0.0,
        kv_cache_usage=0.1,
    )


class Source:
    """A metrics source returning a fixed window (or None for a missing role)."""

    def __init__(
        self,
        prefill: RoleMetrics | None,
        decode: RoleMetrics | None,
        ttft_buckets: Buckets = (),
        tpot_buckets: Buckets = (),
    ) -> None:
        self.prefill, self.decode = prefill, decode
        self.ttft_buckets, self.tpot_buckets = ttft_buckets, tpot_buckets
        self.calls = 0

    def window(
        self, namespace: str, service: str, now_s: float, percentile: float, window_s: float
    ) -> MetricsWindow:
        self.calls += 1
        return MetricsWindow(
            now_s, window_s, self.prefill, self.decode, self.ttft_buckets, self.tpot_buckets
        )


def _observed(isvc: InferenceService) -> Observed:
    counts = desired_replicas(isvc, None)
    observed = observed_from(with_hash(m) for m in render_children(isvc, counts))
    pods = [
        PodInfo(name=f"llama-8b-{role}-0", role=role, ordinal=0, phase="Running", ready=True)
        for role in ("prefill", "decode")
    ]
    return replace(observed, pods=tuple(pods))


def test_policy_config_from_spec() -> None:
    config = policy_config(_isvc())
    assert (config.ttft_target_s, config.itl_target_s) == (1.0, 0.02)
    assert config.percentile == 95  # the stricter of the two SLO percentiles
    assert (config.prefill_max, config.decode_max, config.gpu_budget) == (4, 4, 6)
    assert config.interval_s == 15.0
    assert (config.scale_up_stabilization_s, config.scale_down_stabilization_s) == (60.0, 300.0)


def test_capacity_hints_become_priors() -> None:
    plain = policy_config(_isvc())
    assert (plain.prefill_capacity_prior, plain.decode_capacity_prior) == (None, None)
    hinted = InferenceService.model_validate(
        merge_patch(
            _body(),
            {
                "spec": {
                    "autoscaling": {
                        "capacityHint": {
                            "prefillPromptTokensPerSecond": 30000,
                            "decodeGeneratedTokensPerSecond": 9000,
                        }
                    }
                }
            },
        )
    )
    config = policy_config(hinted)
    assert (config.prefill_capacity_prior, config.decode_capacity_prior) == (30000.0, 9000.0)


def test_policy_memory_follows_the_scale_down_window() -> None:
    defaults = PolicyConfig(ttft_target_s=1.0, itl_target_s=0.02)
    config = policy_config(_isvc())  # scaleDownStabilization 300s, workerStartup 120s
    for field in (
        "startup_s",
        "trend_window_s",
        "burst_memory_half_life_s",
        "capacity_half_life_s",
        "scale_down_period_s",
    ):
        assert getattr(config, field) == getattr(defaults, field), field
    fast = InferenceService.model_validate(
        merge_patch(
            _body(),
            {"spec": {"autoscaling": {"scaleDownStabilization": "30s", "workerStartup": "10s"}}},
        )
    )
    config = policy_config(fast)
    assert (config.startup_s, config.trend_window_s, config.scale_down_period_s) == (10, 30, 15)
    # the benchmark's --scale-down-stabilization goes through the same mapping
    assert following_scale_down_window(defaults, 300) == defaults
    assert following_scale_down_window(defaults, 600).burst_memory_half_life_s == 1200


def test_describe() -> None:
    assert (
        describe({"prefill": 2, "decode": 4}, {"prefill": 3, "decode": 4})
        == "prefill 2->3, decode 4"
    )


def _controller(source: Source, clock: list[float]) -> tuple[Controller, Writer]:
    writer = Writer()
    autoscaler = Autoscaler(
        source_for=lambda url: source,
        clock_s=lambda: clock[0],
        reads=WindowReads(executor_for=lambda url: Inline()),
    )
    return Controller(writer, clock=lambda: NOW, autoscaler=autoscaler), writer


def test_missing_metrics_hold_and_say_why() -> None:
    source, clock = Source(None, None), [1000.0]
    controller, writer = _controller(source, clock)
    body = _body()
    result = controller.reconcile(body, _observed(_isvc()))
    status = writer.last_status
    assert status["prefill"]["desired"] == 1 and status["decode"]["desired"] == 1
    metrics_condition = next(c for c in status["conditions"] if c["type"] == "MetricsAvailable")
    assert metrics_condition["status"] == "False"
    assert ("event", "MetricsUnavailable") in writer.calls
    assert result.requeue_after_s == 15.0  # come back at the next interval


def test_ttft_violation_grows_prefill_and_records_an_event() -> None:
    source, clock = Source(_metrics(3.0, 0.01, prompt_rate=40_000), _metrics(3.0, 0.01)), [1000.0]
    controller, writer = _controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    status = writer.last_status
    assert status["prefill"]["desired"] > 1
    assert status["autoscaler"]["lastDecision"].startswith("prefill 1->")
    assert status["slo"]["ttft"] == "3s/1s" and status["slo"]["ttftSeconds"] == 3.0
    assert any(call == ("event", "Autoscaled") for call in writer.calls)
    sts = [c for c in writer.calls if c[0] == "apply" and c[1][0] == "StatefulSet"]
    assert ("StatefulSet", status["prefill"]["desired"]) in [c[1] for c in sts]


def test_status_shows_the_itl_the_policy_judges() -> None:
    # the window's mean ITL is under the 20 ms target, the p95 request's is over it
    decode = replace(_metrics(0.2, 0.012), tpot_s=0.025)
    source, clock = Source(_metrics(0.2, 0.012), decode), [1000.0]
    controller, writer = _controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    slo = writer.last_status["slo"]
    assert slo["itl"] == "25ms/20ms" and slo["itlSeconds"] == 0.025, slo
    # no request finished in the window: the mean stands in
    source.decode = _metrics(0.2, 0.012)
    clock[0] += 60.0
    controller.reconcile(_body(), _observed(_isvc()))
    assert writer.last_status["slo"]["itlSeconds"] == 0.012


def test_decisions_wait_for_the_interval() -> None:
    source, clock = Source(_metrics(0.2, 0.01), _metrics(0.2, 0.01)), [1000.0]
    controller, _ = _controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    assert source.calls == 1
    clock[0] += 5.0
    result = controller.reconcile(_body(), _observed(_isvc()))
    assert source.calls == 1
    assert result.requeue_after_s == pytest.approx(10.0)  # when the next step is due
    clock[0] += 10.0
    controller.reconcile(_body(), _observed(_isvc()))
    assert source.calls == 2


def test_nan_latency_is_reported_as_unknown_not_zero() -> None:
    source, clock = (
        Source(_metrics(math.nan, math.nan, 0.0), _metrics(math.nan, math.nan, 0.0)),
        [1.0],
    )
    controller, writer = _controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    assert writer.last_status["slo"]["ttft"] == "n/a/1s"


def test_no_autoscaling_no_metrics_queries() -> None:
    source, clock = Source(None, None), [1.0]
    controller, _ = _controller(source, clock)
    body = merge_patch(_body(), {"spec": {"autoscaling": {"enabled": False}}})
    controller.reconcile(body, _observed(_isvc()))
    assert source.calls == 0


def test_the_measured_kv_transfer_time_feeds_the_policy() -> None:
    from pdfleet.autoscale.actuator import measured_kv_transfer_s

    assert measured_kv_transfer_s(None) == 0.0
    assert measured_kv_transfer_s({"kvTransport": {"expectedTransferSeconds": 0.52}}) == 0.52
    failed = {"kvTransport": {"expectedTransferSeconds": None, "error": "refused"}}
    assert measured_kv_transfer_s(failed) == 0.0


SERVICE = {"namespace": "ns", "pdfleet_service": "llama-8b"}
INF = math.inf
# 40 % of TTFTs within the 1 s target, 90 % of requests' time per output token within 20 ms.
TTFT_BUCKETS: Buckets = ((0.5, 1.0), (1.0, 4.0), (2.5, 9.0), (INF, 10.0))
TPOT_BUCKETS: Buckets = ((0.01, 0.0), (0.02, 9.0), (0.025, 10.0), (INF, 10.0))


def test_slo_figures_go_to_status_and_the_operators_series() -> None:
    source = Source(_metrics(3.0, 0.01), _metrics(3.0, 0.01), TTFT_BUCKETS, TPOT_BUCKETS)
    controller, writer = _controller(source, [1000.0])
    controller.reconcile(_body(), _observed(_isvc()))
    assert writer.last_status["slo"]["attainment"] == pytest.approx(0.36)
    for slo, target, observed, share in (("ttft", 1.0, 3.0, 0.4), ("itl", 0.02, 0.01, 0.9)):
        assert value("pdfleet_slo_target_seconds", **SERVICE, slo=slo) == target
        assert value("pdfleet_slo_observed_seconds", **SERVICE, slo=slo) == observed
        assert value("pdfleet_slo_attainment_ratio", **SERVICE, slo=slo) == pytest.approx(share)
    assert value("pdfleet_slo_attainment_ratio", **SERVICE, slo="both") == pytest.approx(0.36)


def test_figures_that_become_unknown_drop_their_series() -> None:
    source = Source(_metrics(0.2, 0.01), _metrics(0.2, 0.01), TTFT_BUCKETS, TPOT_BUCKETS)
    clock = [1000.0]
    controller, writer = _controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    assert value("pdfleet_slo_attainment_ratio", **SERVICE, slo="both") is not None

    # The traffic stops: no latencies, no requests in the histograms. A last value left
    # behind would keep the SLO alerts firing.
    idle = _metrics(math.nan, math.nan, 0.0)
    source.prefill, source.decode, source.ttft_buckets, source.tpot_buckets = idle, idle, (), ()
    clock[0] += 15.0
    controller.reconcile(_body(), _observed(_isvc()))
    assert "attainment" not in writer.last_status["slo"]
    for slo in ("ttft", "itl", "both"):
        assert value("pdfleet_slo_attainment_ratio", **SERVICE, slo=slo) is None
    for slo in ("ttft", "itl"):
        assert value("pdfleet_slo_observed_seconds", **SERVICE, slo=slo) is None
        assert value("pdfleet_slo_target_seconds", **SERVICE, slo=slo) is not None


def _decision_labels(role: str, direction: str, reason: str) -> frozenset[tuple[str, str]]:
    return labels(**SERVICE, pdfleet_role=role, direction=direction, reason=reason)


def test_each_pool_counts_its_decision_by_direction_and_a_fixed_reason() -> None:
    violating = _metrics(3.0, 0.01, prompt_rate=40_000)
    source, clock = Source(violating, _metrics(3.0, 0.01)), [1000.0]
    controller, writer = _controller(source, clock)
    with counted("pdfleet_autoscaler_decisions_total") as decisions:
        controller.reconcile(_body(), _observed(_isvc()))
    assert writer.last_status["prefill"]["desired"] > 1
    assert decisions == {
        _decision_labels("prefill", "up", "OverTarget"): 1.0,
        _decision_labels("decode", "hold", "Load"): 1.0,
    }

    # The next decision sees other figures but adds no series: the reason is not the text.
    source.prefill = _metrics(3.5, 0.01, prompt_rate=41_000)
    clock[0] += 15.0
    with counted("pdfleet_autoscaler_decisions_total") as decisions:
        controller.reconcile(_body(), _observed(_isvc()))
    assert {dict(key)["reason"] for key in decisions} <= {"OverTarget", "Load"}
    assert sum(decisions.values()) == 2.0


def test_a_hold_without_metrics_is_counted_with_the_condition_reason() -> None:
    controller, _ = _controller(Source(None, None), [1000.0])
    with counted("pdfleet_autoscaler_decisions_total") as decisions:
        controller.reconcile(_body(), _observed(_isvc()))
    assert decisions == {
        _decision_labels("prefill", "hold", "MetricsMissing"): 1.0,
        _decision_labels("decode", "hold", "MetricsMissing"): 1.0,
    }


@pytest.mark.parametrize(
    ("conditions", "latency", "reason"),
    [
        ((PolicyCondition("MetricsAvailable", "False", "MetricsStale"),), 3.0, "MetricsStale"),
        ((PolicyCondition("MetricsAvailable", "True", "MetricsFresh"),), 3.0, "OverTarget"),
        ((PolicyCondition("BudgetLimited", "True", "GPUBudget"),), 3.0, "OverTarget"),
        ((PolicyCondition("BudgetLimited", "True", "GPUBudget"),), 0.5, "GPUBudget"),
        ((), 0.5, "Load"),
        ((), math.nan, "Load"),
    ],
)
def test_decision_reason(
    conditions: tuple[PolicyCondition, ...], latency: float, reason: str
) -> None:
    decision = Decision(0.0, 1, 1, 1, 1, ("free text 123/s",), conditions, Capacity(), None)
    assert decision_reason(decision, latency, 1.0) == reason


def test_a_deleted_service_leaves_no_series_behind() -> None:
    source = Source(_metrics(0.2, 0.01), _metrics(0.2, 0.01), TTFT_BUCKETS, TPOT_BUCKETS)
    controller, _ = _controller(source, [1000.0])
    controller.reconcile(_body(), _observed(_isvc()))
    controller.forget("ns", "llama-8b")
    for name in (
        "pdfleet_autoscaler_decisions_total",
        "pdfleet_slo_target_seconds",
        "pdfleet_slo_observed_seconds",
        "pdfleet_slo_attainment_ratio",
        "pdfleet_pool_replicas",
        "pdfleet_service_condition",
    ):
        assert not [key for key in samples(name) if labels(**SERVICE) <= key], name


class Held(Executor):
    """Runs submitted reads only when released: a Prometheus that has not answered yet."""

    def __init__(self) -> None:
        self.pending: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.pending.append((future, lambda: fn(*args, **kwargs)))
        return future

    def release(self) -> None:
        for future, call in self.pending:
            future.set_result(call())
        self.pending.clear()


def _held_controller(source: Source, clock: list[float]) -> tuple[Controller, Writer, Held]:
    held, writer = Held(), Writer()
    autoscaler = Autoscaler(
        source_for=lambda url: source,
        clock_s=lambda: clock[0],
        reads=WindowReads(executor_for=lambda url: held),
    )
    controller = Controller(writer, clock=lambda: NOW, autoscaler=autoscaler)
    return controller, writer, held


def _metrics_condition(writer: Writer) -> dict[str, Any]:
    return next(c for c in writer.last_status["conditions"] if c["type"] == "MetricsAvailable")


def test_a_pass_does_not_wait_for_prometheus_a_later_pass_decides() -> None:
    source = Source(_metrics(3.0, 0.01, prompt_rate=40_000), _metrics(3.0, 0.01))
    clock = [1000.0]
    controller, writer, held = _held_controller(source, clock)
    result = controller.reconcile(_body(), _observed(_isvc()))
    assert len(held.pending) == 1 and source.calls == 0
    assert result.requeue_after_s == READ_POLL_S  # come back for the answer
    clock[0] += 0.5
    controller.reconcile(_body(), _observed(_isvc()))
    assert len(held.pending) == 1  # never a second read of one service at once
    held.release()
    clock[0] += 0.5
    result = controller.reconcile(_body(), _observed(_isvc()))
    assert writer.last_status["prefill"]["desired"] > 1
    assert result.requeue_after_s == pytest.approx(15.0)


def test_a_prometheus_that_never_answers_holds_the_service_and_says_so() -> None:
    source = Source(_metrics(0.2, 0.01), _metrics(0.2, 0.01))
    clock = [1000.0]
    controller, writer, held = _held_controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    clock[0] += READ_DEADLINE_S
    controller.reconcile(_body(), _observed(_isvc()))
    condition = _metrics_condition(writer)
    assert condition["status"] == "False"
    assert "http://prom:9090 did not answer within 10s" in condition["message"]
    assert writer.last_status["slo"]["ttft"] == "n/a/1s"
    # The next step: the first read still holds its thread, so no second one starts.
    clock[0] += 15.0
    controller.reconcile(_body(), _observed(_isvc()))
    assert len(held.pending) == 1
    assert _metrics_condition(writer)["status"] == "False"
    # It answers at last: that answer is old, the next step reads again.
    held.release()
    clock[0] += 15.0
    controller.reconcile(_body(), _observed(_isvc()))
    assert len(held.pending) == 1 and source.calls == 1
    held.release()
    clock[0] += 0.5
    controller.reconcile(_body(), _observed(_isvc()))
    assert _metrics_condition(writer)["status"] == "True"


def test_metrics_unavailable_is_an_event_on_the_transition_not_every_decision() -> None:
    source, clock = Source(None, None), [1000.0]
    controller, writer = _controller(source, clock)
    for _ in range(4):
        controller.reconcile(_body(), _observed(_isvc()))
        clock[0] += 15.0
    assert writer.calls.count(("event", "MetricsUnavailable")) == 1
    message = _metrics_condition(writer)["message"]
    assert "no series for the prefill and decode pods" in message
    source.prefill, source.decode = _metrics(0.2, 0.01), _metrics(0.2, 0.01)
    controller.reconcile(_body(), _observed(_isvc()))
    assert writer.calls.count(("event", "MetricsAvailable")) == 1
    assert _metrics_condition(writer)["status"] == "True"


def test_a_stale_window_is_not_shown_as_the_measured_latency() -> None:
    class Stale(Source):
        def window(self, *args: Any) -> MetricsWindow:
            return replace(super().window(*args), at_s=0.0)  # an hour-old evaluation

    source, clock = Stale(_metrics(3.0, 0.01), _metrics(3.0, 0.01)), [3600.0]
    controller, writer = _controller(source, clock)
    controller.reconcile(_body(), _observed(_isvc()))
    assert writer.last_status["slo"]["ttft"] == "n/a/1s"
    assert "ttftSeconds" not in writer.last_status["slo"]
    condition = _metrics_condition(writer)
    assert condition["reason"] == "MetricsStale" and "3600s old" in condition["message"]
