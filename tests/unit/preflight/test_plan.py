"""The operator's preflight plan: when a run is due, which pods, and what a result means."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.preflight import plan
from pdfleet.reconcile.observed import Observed, PodInfo
from pdfleet_wire.preflight import PreflightResult
from tests.spec_cases import merge_patch, sample

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PREFILL = PodInfo("llama-8b-prefill-0", "prefill", 0, "Running", True, pod_ip="10.244.1.5")
DECODE = PodInfo("llama-8b-decode-0", "decode", 0, "Running", True, pod_ip="10.244.2.5")
PAIR = (PREFILL, DECODE)


def _service(patch: dict[str, Any] | None = None) -> InferenceService:
    obj = merge_patch(sample("minimal"), patch or {})
    obj["metadata"].update(namespace="ns", uid="u1", generation=1)
    return InferenceService.model_validate(obj)


RDMA = {"spec": {"kvTransfer": {"fabric": {"rdmaResource": "rdma/ib"}}}}


def _result(**fields: Any) -> PreflightResult:
    base: dict[str, Any] = dict(
        ok=True, verified=True, transport="tcp/lo", transport_kind="tcp", lanes=("tcp/lo",),
        total_bytes=512 << 20, seconds=(1.0, 1.0, 1.0), latency_s=0.002,
        extra={"sideChannel": "10.244.1.5:5600", "sideChannelReachable": True},
    )  # fmt: skip
    return PreflightResult(**{**base, **fields})


def test_due_once_per_fingerprint_on_a_ready_service() -> None:
    isvc = _service()
    current = plan.fingerprint(isvc)
    assert not plan.due(isvc, False, None, None, current)  # not ready yet
    assert plan.due(isvc, True, None, None, current)
    assert not plan.due(isvc, True, None, 1.0, current)  # just tried (no record written yet)
    done = {"fingerprint": current, "error": ""}
    assert not plan.due(isvc, True, done, None, current)
    assert plan.due(isvc, True, done, None, "a changed spec")
    failed = {**done, "error": "listener unreachable"}
    assert not plan.due(isvc, True, failed, 10.0, current)
    assert plan.due(isvc, True, failed, plan.RETRY_S, current)
    assert plan.due(isvc, True, failed, None, current)  # an operator restart retries at once
    off = _service({"spec": {"kvTransfer": {"preflight": {"enabled": False}}}})
    assert not plan.due(off, True, None, None, plan.fingerprint(off))


def test_retry_after_the_last_attempt_only_for_a_run_that_could_not_measure() -> None:
    done = {"fingerprint": "f", "error": ""}
    assert plan.retry_after_s(None) is None and plan.retry_after_s(done, 10.0) is None
    failed = {**done, "error": "listener unreachable"}
    assert plan.retry_after_s(failed, 10.0) == plan.RETRY_S - 10.0
    assert plan.retry_after_s(failed) == plan.RETRY_S  # not tried by this operator
    assert plan.retry_after_s(failed, plan.RETRY_S + 5) == plan.RETRY_S


@pytest.mark.parametrize(
    "patch",
    [
        RDMA,
        {"spec": {"kvTransfer": {"fabric": {"ucx": {"tls": "rc_x"}}}}},
        {"spec": {"kvTransfer": {"preflight": {"promptTokens": 8192}}}},
        {"spec": {"prefill": {"parallelism": {"tensor": 2}}}},
        {"metadata": {"annotations": {labels.PREFLIGHT_RERUN: "again"}}},
        {"spec": {"model": {"name": "another-model"}}},
    ],
)
def test_fingerprint_follows_the_fabric_revision_and_rerun_annotation(
    patch: dict[str, Any],
) -> None:
    assert plan.fingerprint(_service(patch)) != plan.fingerprint(_service())
    unrelated = _service({"spec": {"decode": {"replicas": {"min": 1, "max": 7}}}})
    assert plan.fingerprint(unrelated) == plan.fingerprint(_service())


def test_pick_pair_takes_the_lowest_serving_pods() -> None:
    draining = replace(PREFILL, draining_since="2026-11-29T11:00:00Z")
    second = replace(PREFILL, name="llama-8b-prefill-1", ordinal=1, pod_ip="10.244.1.6")
    observed = Observed(pods=(draining, second, DECODE))
    assert plan.pick_pair(observed, "r1") == (second, DECODE)
    assert plan.pick_pair(Observed(pods=(DECODE,)), "r1") is None
    assert plan.pick_pair(Observed(pods=(PREFILL, replace(DECODE, ready=False))), "r1") is None


def test_pick_pair_pairs_pods_of_the_revision_asked() -> None:
    """During a paired rollout the preflight proves the new revision before it serves."""
    old = replace(PREFILL, kv_revision="r1")
    new = replace(PREFILL, name="llama-8b-prefill-1", ordinal=1, kv_revision="r2")
    decode_old = replace(DECODE, kv_revision="r1")
    decode_new = replace(DECODE, name="llama-8b-decode-1", ordinal=1, kv_revision="r2")
    observed = Observed(pods=(old, new, decode_old, decode_new))
    assert plan.pick_pair(observed, "r2") == (new, decode_new)
    assert plan.pick_pair(observed, "r1") == (old, decode_old)
    assert plan.pick_pair(Observed(pods=(old, new, decode_old)), "r2") is None


def test_a_pair_is_proven_by_a_measured_run_of_this_revision() -> None:
    isvc = _service()
    record = {"fingerprint": plan.fingerprint(isvc), "error": ""}

    def status(reason: str, **changes: Any) -> dict[str, Any]:
        condition = {"type": plan.KV_TRANSPORT_READY, "status": "False", "reason": reason}
        return {"kvTransport": {**record, **changes}, "conditions": [condition]}

    assert plan.proven(isvc, status("Measured"))
    assert plan.proven(isvc, status("TCPFallback")), "slower, but KV moves"
    assert not plan.proven(isvc, status("DataMismatch"))
    assert not plan.proven(isvc, status("Measured", error="no listener"))
    assert not plan.proven(isvc, status("Measured", fingerprint="of-another-revision"))
    assert not plan.proven(isvc, None)
    off = _service({"spec": {"kvTransfer": {"preflight": {"enabled": False}}}})
    assert plan.proven(off, None)


def test_request_for_the_decode_pod() -> None:
    body = plan.request(
        _service({"spec": {"prefill": {"parallelism": {"tensor": 2}}}}), PREFILL
    ).to_json()
    assert body["peer"] == "http://10.244.1.5:5590"
    assert body["tokens"] == 4096 and body["blockSize"] == 16 and body["tp"] == 2
    assert body["geometry"] == {"layers": 32, "kvHeads": 8, "headDim": 128, "dtypeBytes": 2}
    assert plan.listener_url("fd00::1", 5590) == "http://[fd00::1]:5590"


def test_expected_transfer_time_of_a_typical_prompt() -> None:
    # 4096 tokens x 128 KiB = 512 MiB at 512 MiB/s: one second plus one READ's latency.
    result = _result(total_bytes=512 << 20, seconds=(1.0,), latency_s=0.002)
    assert plan.expected_transfer_s(_service(), result) == pytest.approx(1.002)
    # TP 2 halves each rank's share; ranks pull in parallel.
    tp2 = _service({"spec": {"prefill": {"parallelism": {"tensor": 2}}}})
    assert plan.expected_transfer_s(tp2, result) == pytest.approx(0.502)
    assert plan.expected_transfer_s(_service(), _result(seconds=())) is None


@pytest.mark.parametrize(
    ("patch", "result", "status", "reason"),
    [
        ({}, _result(), True, "Measured"),  # no RDMA asked for: TCP is the plan
        (RDMA, _result(), False, "TCPFallback"),
        (RDMA, _result(transport="rc_mlx5/mlx5_0:1", transport_kind="rdma"), True, "Measured"),
        (RDMA, _result(transport="cuda_ipc/cuda", transport_kind="cuda_ipc"), True, "Measured"),
        (RDMA, _result(transport="unknown", transport_kind="unknown"), False, "NotRDMA"),
        ({"spec": {"kvTransfer": {"preflight": {"minBandwidthGbps": 1}}}}, _result(), False,
         "LowBandwidth"),
        ({"spec": {"kvTransfer": {"preflight": {"minBandwidthGbps": 0.1}}}}, _result(), True,
         "Measured"),
        ({}, _result(ok=False, verified=False, error="mismatch"), False, "DataMismatch"),
        ({}, _result(ok=False, verified=False, seconds=(), error="refused"), False,
         "PreflightFailed"),
        ({}, _result(extra={"sideChannel": "127.0.0.1:5600", "sideChannelReachable": True}),
         False, "SideChannelAddress"),
        ({}, _result(extra={"sideChannel": "10.244.1.5:5600", "sideChannelReachable": False}),
         False, "SideChannelUnreachable"),
        ({}, _result(extra={}), True, "Measured"),  # no side channel to check (no connector)
    ],
)  # fmt: skip
def test_verdict(patch: dict[str, Any], result: PreflightResult, status: bool, reason: str) -> None:
    verdict = plan.verdict(_service(patch), result, PAIR)
    assert (verdict.status, verdict.reason) == (status, reason)
    assert verdict.message.startswith("llama-8b-decode-0 reading from llama-8b-prefill-0")
    assert verdict.condition["type"] == plan.KV_TRANSPORT_READY


def test_verdict_message_names_the_figures() -> None:
    message = plan.verdict(_service(RDMA), _result(), PAIR).message
    assert "tcp/lo (tcp), 0.54 GB/s, latency 2.00 ms, host memory" in message
    assert "a 4096-token prompt's KV moves in 1.002 s" in message
    assert "rdma/ib" in message


def test_record_and_same_outcome() -> None:
    isvc = _service()
    record = plan.record(isvc, _result(), PAIR, NOW)
    assert record == {
        "fingerprint": plan.fingerprint(isvc),
        "measuredTime": "2026-11-29T12:00:00Z",
        "prefillPod": "llama-8b-prefill-0",
        "decodePod": "llama-8b-decode-0",
        "transport": "tcp/lo",
        "transportKind": "tcp",
        "memory": "DRAM",
        "bandwidthGbps": 0.537,
        "latencyMs": 2.0,
        "payloadBytes": 512 << 20,
        "expectedTransferSeconds": 1.002,
        "verified": True,
        "error": "",
    }
    later = {**record, "measuredTime": "2026-11-29T12:01:00Z"}
    assert plan.same_outcome(record, later) and not plan.same_outcome(None, later)
    assert not plan.same_outcome(record, {**later, "bandwidthGbps": 0.6})
    # A failed run's record as the API server stores it (the merge patch drops null fields)
    # is the same outcome as the fresh one that still carries them.
    failed = {**record, "bandwidthGbps": None, "latencyMs": None, "error": "refused"}
    stored = {k: v for k, v in failed.items() if v is not None}
    assert plan.same_outcome(stored, {**failed, "measuredTime": "2026-11-29T12:02:00Z"})


def test_the_record_fits_the_status_schema() -> None:
    from pdfleet.api.v1alpha1 import InferenceServiceStatus

    record = plan.record(_service(), _result(), PAIR, NOW)
    status = InferenceServiceStatus.model_validate({"kvTransport": record})
    assert status.model_dump(by_alias=True, exclude_none=True)["kvTransport"] == record
