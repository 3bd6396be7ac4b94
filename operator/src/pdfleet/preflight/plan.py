"""When to run the KV transport preflight and what its result means: pure.

Where it fits: the controller asks `due()` once per pass (a ready service whose kvTransfer
spec, or rerun annotation, has not been measured yet; a failed run again RETRY_S after the
last attempt),
picks the pair with `pick_pair()`, sends `request()` to the decode pod (preflight.io), and
turns the result into status.kvTransport (`record()`) and the KVTransportReady condition
(`verdict()`). A TCP fallback where RDMA was asked for, a bandwidth under the spec's
threshold, unverified data or an unreachable side channel make a warning, never a silent pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService, KVTransportStatus
from pdfleet.reconcile.observed import Observed, PodInfo
from pdfleet.rollout.revision import kv_revision
from pdfleet_wire.preflight import DTYPE_BYTES, KVCacheShape, PreflightRequest, PreflightResult

KV_TRANSPORT_READY = "KVTransportReady"
# A run that could not measure (a listener not up yet, a pod gone) is tried again this late.
RETRY_S = 60.0
# The operator's wait for a run; the initiator gets a minute less for its transfers, which
# leaves its process start (transfer.CHILD_START_S) and the HTTP round trips inside it.
RUN_TIMEOUT_S = 180.0
# Paths that count as "the fast one" when the fabric names an RDMA resource.
_FAST = ("rdma", "cuda_ipc")


@dataclass(frozen=True)
class Verdict:
    status: bool
    reason: str
    message: str

    @property
    def condition(self) -> dict[str, str]:
        return {
            "type": KV_TRANSPORT_READY,
            "status": "True" if self.status else "False",
            "reason": self.reason,
            "message": self.message,
        }


# Verdicts that say KV cannot move between the pair, as opposed to moving slower or over
# another path than asked: a paired rollout does not move traffic to a revision with one.
BROKEN = frozenset(
    {"DataMismatch", "PreflightFailed", "SideChannelAddress", "SideChannelUnreachable"}
)


def fingerprint(isvc: InferenceService) -> str:
    """What a measurement belongs to: the kvTransfer spec, the prefill's TP (it shards the
    payload), the KV revision (a paired rollout proves the new revision's pair before it
    serves) and the rerun annotation; a change to any of them asks for a new run."""
    spec = isvc.spec
    data = {
        "kvTransfer": spec.kv_transfer.model_dump(mode="json", by_alias=True),
        "tp": spec.prefill.parallelism.tensor,
        "revision": kv_revision(isvc),
        "rerun": isvc.metadata.annotations.get(labels.PREFLIGHT_RERUN, ""),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def geometry(isvc: InferenceService) -> KVCacheShape:
    g = isvc.spec.kv_transfer.preflight.geometry
    return KVCacheShape(g.layers, g.kv_heads, g.head_dim, DTYPE_BYTES[g.dtype])


def due(
    isvc: InferenceService,
    ready: bool,
    record: Mapping[str, Any] | None,
    since_attempt_s: float | None,
    current: str,
) -> bool:
    """Run now? Only on a ready service (its pods serve, so their path is the one to prove),
    once per fingerprint (`current`: the spec's, from `fingerprint`); a run that could not
    measure is retried RETRY_S after the last attempt (`since_attempt_s`, None when this
    operator has not tried this fingerprint)."""
    if not isvc.spec.kv_transfer.preflight.enabled or not ready:
        return False
    if _tried_recently(since_attempt_s):
        return False
    return not record or record.get("fingerprint") != current or bool(record.get("error"))


def retry_after_s(
    record: Mapping[str, Any] | None, since_attempt_s: float | None = None
) -> float | None:
    """When to come back: RETRY_S after the last attempt (`since_attempt_s` ago, None when
    this operator has not tried) at a run that could not measure, else never."""
    if not record or not record.get("error"):
        return None
    if _tried_recently(since_attempt_s):
        return RETRY_S - since_attempt_s
    return RETRY_S


def _tried_recently(since_attempt_s: float | None) -> TypeGuard[float]:
    return since_attempt_s is not None and since_attempt_s < RETRY_S


def same_outcome(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """A retry that ended as the last run did (the same failure): keep the old record, so a
    service whose pods cannot be measured costs no status write per retry."""
    if not old:
        return False

    def essence(record: Mapping[str, Any]) -> dict[str, Any]:
        # A null field is dropped by the status merge patch, so the stored record lacks
        # the keys that a fresh one carries as None.
        return {k: v for k, v in record.items() if k != "measuredTime" and v is not None}

    return essence(old) == essence(new)


def cleared(status: Mapping[str, Any]) -> dict[str, Any]:
    """The status without the preflight's record and condition (preflight disabled)."""
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != KV_TRANSPORT_READY]
    return {k: v for k, v in status.items() if k != "kvTransport"} | {"conditions": conditions}


def news(
    status: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    verdict: Verdict,
) -> bool:
    """Worth an Event: a run for a new fingerprint, or a verdict that changed."""
    before: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == KV_TRANSPORT_READY), {}
    )
    fresh = (old or {}).get("fingerprint") != new["fingerprint"]
    return fresh or before.get("reason") != verdict.reason


def proven(isvc: InferenceService, status: Mapping[str, Any] | None) -> bool:
    """Whether KV moves between two pods of the spec's revision: the preflight for this
    fingerprint measured with no broken verdict (or the preflight is off)."""
    if not isvc.spec.kv_transfer.preflight.enabled:
        return True
    record = (status or {}).get("kvTransport") or {}
    if record.get("fingerprint") != fingerprint(isvc) or record.get("error"):
        return False
    conditions = (status or {}).get("conditions") or []
    reasons = [c.get("reason") for c in conditions if c.get("type") == KV_TRANSPORT_READY]
    return not reasons or reasons[0] not in BROKEN


def _ready(pods: list[PodInfo], revision: str) -> PodInfo | None:
    return next(
        (
            p
            for p in pods
            if p.ready
            and p.pod_ip
            and not p.terminating
            and not p.draining_since
            # Pods made before revisions were labelled run the spec's.
            and p.kv_revision in (revision, None)
        ),
        None,
    )


def pick_pair(observed: Observed, revision: str) -> tuple[PodInfo, PodInfo] | None:
    """(prefill, decode) of the KV revision `revision` (during a paired rollout, the new one,
    before it serves): the lowest-ordinal ready pod of each pool, the pair that stays."""
    prefill = _ready(observed.pods_of(labels.ROLE_PREFILL), revision)
    decode = _ready(observed.pods_of(labels.ROLE_DECODE), revision)
    return (prefill, decode) if prefill and decode else None


def listener_url(pod_ip: str, port: int) -> str:
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}"


def request(isvc: InferenceService, prefill: PodInfo) -> PreflightRequest:
    """What POST /preflight/run asks of the decode pod (pdfleet_worker.preflight.transfer)."""
    pf = isvc.spec.kv_transfer.preflight
    assert prefill.pod_ip is not None
    return PreflightRequest(
        peer=listener_url(prefill.pod_ip, pf.port),
        tokens=pf.prompt_tokens,
        block_size=pf.block_size,
        geometry=geometry(isvc),
        tp=isvc.spec.prefill.parallelism.tensor,
        iterations=pf.iterations,
        timeout_s=RUN_TIMEOUT_S - 60,
    )


def expected_transfer_s(isvc: InferenceService, result: PreflightResult) -> float | None:
    """The typical prompt's KV over the measured link: one TP rank's share (ranks pull in
    parallel) at the measured bandwidth, plus one READ's latency."""
    bandwidth = result.bandwidth_bytes_per_s
    if not bandwidth:
        return None
    tokens = isvc.spec.kv_transfer.preflight.prompt_tokens
    per_token = geometry(isvc).bytes_per_token(isvc.spec.prefill.parallelism.tensor)
    return (result.latency_s or 0.0) + tokens * per_token / bandwidth


def record(
    isvc: InferenceService,
    result: PreflightResult,
    pair: tuple[PodInfo, PodInfo],
    now: datetime,
) -> dict[str, Any]:
    """status.kvTransport for a run."""
    bandwidth = result.bandwidth_bytes_per_s
    expected = expected_transfer_s(isvc, result)
    # With nulls: a figure this run could not measure removes the previous run's.
    return KVTransportStatus(
        fingerprint=fingerprint(isvc),
        measured_time=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        prefill_pod=pair[0].name,
        decode_pod=pair[1].name,
        transport=result.transport,
        transport_kind=result.transport_kind,
        memory=result.memory,
        bandwidth_gbps=None if bandwidth is None else round(bandwidth / 1e9, 3),
        latency_ms=None if result.latency_s is None else round(result.latency_s * 1e3, 3),
        payload_bytes=result.total_bytes,
        expected_transfer_seconds=None if expected is None else round(expected, 4),
        verified=result.verified,
        error="" if result.ok else (result.error or "failed")[:1000],
    ).wire(nulls=True)


def _figures(isvc: InferenceService, result: PreflightResult) -> str:
    bandwidth = result.bandwidth_bytes_per_s or 0.0
    expected = expected_transfer_s(isvc, result)
    memory = "GPU memory" if result.memory == "VRAM" else "host memory"
    latency = f"{result.latency_s * 1e3:.2f} ms" if result.latency_s is not None else "n/a"
    prompt = isvc.spec.kv_transfer.preflight.prompt_tokens
    when = f"{expected:.3f} s" if expected is not None else "n/a"
    return (
        f"{result.transport or 'unknown'} ({result.transport_kind}), {bandwidth / 1e9:.2f} GB/s, "
        f"latency {latency}, {memory}; a {prompt}-token prompt's KV moves in {when}"
    )


def verdict(
    isvc: InferenceService, result: PreflightResult, pair: tuple[PodInfo, PodInfo]
) -> Verdict:
    """KVTransportReady from one run. Order: could it measure, is the data right, is the side
    channel where the decode dials it, is it the transport the fabric asks for, is it fast
    enough."""
    prefill, decode = pair
    who = f"{decode.name} reading from {prefill.name}"
    if not result.ok and not result.verified and result.seconds:
        return Verdict(False, "DataMismatch", f"{who}: {result.error}")
    if not result.ok:
        return Verdict(False, "PreflightFailed", f"{who}: {result.error}")
    figures = _figures(isvc, result)
    channel = str(result.extra.get("sideChannel") or "")
    if channel:
        host = channel.rpartition(":")[0].strip("[]")
        if host != prefill.pod_ip:
            return Verdict(
                False,
                "SideChannelAddress",
                f"{who}: {prefill.name} advertises its NIXL side channel at {channel}, not at "
                f"its pod IP {prefill.pod_ip}; decode engines would dial the wrong address",
            )
        if not result.extra.get("sideChannelReachable"):
            return Verdict(
                False,
                "SideChannelUnreachable",
                f"{who}: the NIXL side channel {channel} does not accept connections from "
                "the decode pod (NetworkPolicy? engine not listening?)",
            )
    fabric = isvc.spec.kv_transfer.fabric
    if fabric is not None and fabric.rdma_resource and result.transport_kind not in _FAST:
        reason = "TCPFallback" if result.transport_kind == "tcp" else "NotRDMA"
        return Verdict(
            False,
            reason,
            f"{who}: {figures}; the fabric asks for {fabric.rdma_resource} but UCX did not "
            "use RDMA (see docs/kv-preflight.md)",
        )
    threshold = isvc.spec.kv_transfer.preflight.min_bandwidth_gbps
    bandwidth = (result.bandwidth_bytes_per_s or 0.0) / 1e9
    if threshold is not None and bandwidth < threshold:
        return Verdict(
            False, "LowBandwidth", f"{who}: {figures}; below minBandwidthGbps {threshold:g}"
        )
    return Verdict(True, "Measured", f"{who}: {figures}")
