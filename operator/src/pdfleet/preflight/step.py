"""One pass's KV transport preflight: start a run when one is due, record its outcome.

Where it fits: the controller calls `step()` in every pass with the status it computed and
the service's memory (reconcile/memory.py). The decisions are preflight/plan.py, the HTTP
call preflight/io.py; the run itself goes on `runner`, beside the passes, because it can take
seconds (UCX set-up, a slow fabric) up to its timeout and the service's passes (drains,
scale-ups) must not wait for it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor
from typing import Any

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.kube.writer import Writer
from pdfleet.preflight import io, plan
from pdfleet.reconcile.memory import Pass, PreflightRun
from pdfleet.reconcile.observed import PodInfo
from pdfleet.reconcile.status import READY, condition_status, merge_foreign_condition
from pdfleet.rollout.revision import kv_revision
from pdfleet_wire.preflight import failed

log = logging.getLogger(__name__)

# How soon a pass looks again at a run it left in flight.
PREFLIGHT_POLL_S = 1.0


def step(
    this: Pass, status: dict[str, Any], writer: Writer, runner: Executor
) -> tuple[dict[str, Any], float | None]:
    """status.kvTransport and KVTransportReady after a KV transport preflight, when one is
    due (preflight/plan.py); and when to come back to retry a run that failed.

    The run is one HTTP call to a decode pod, which READs from a prefill pod over NIXL. It
    runs beside the passes (on `runner`): a pass starts it when due and a later
    pass (every PREFLIGHT_POLL_S meanwhile) records its outcome."""
    body, isvc, observed, now, memory = this.body, this.isvc, this.observed, this.now, this.memory
    record = status.get("kvTransport")
    if not isvc.spec.kv_transfer.preflight.enabled:
        memory.preflight_run = None
        return plan.cleared(status), None
    fingerprint = plan.fingerprint(isvc)
    run = memory.preflight_run
    if run is None or run.fingerprint != fingerprint:  # none in flight for this spec
        since = memory.since_preflight(fingerprint)
        ready = condition_status(status, READY) == "True"
        pair = plan.pick_pair(observed, kv_revision(isvc))
        if pair is None or not plan.due(isvc, ready, record, since, fingerprint):
            return status, plan.retry_after_s(record, since)
        memory.preflight_tried = (fingerprint, time.monotonic())
        run = memory.preflight_run = _start(runner, isvc, fingerprint, pair)
    if not run.result.done():
        return status, PREFLIGHT_POLL_S
    memory.preflight_run = None
    since = memory.since_preflight()
    pair = run.pair
    try:
        result = run.result.result()
    except Exception as err:  # the run's own failure is a result, never a failed pass
        result = failed(f"preflight run: {type(err).__name__}: {err}")
    verdict = plan.verdict(isvc, result, pair)
    new_record = plan.record(isvc, result, pair, now)
    if plan.same_outcome(record, new_record):
        return status, plan.retry_after_s(new_record, since)
    if plan.news(status, record, new_record, verdict):
        kind = "Normal" if verdict.status else "Warning"
        writer.event(body, f"KVTransport{verdict.reason}", verdict.message, kind)
    log.info(
        "%s/%s KV transport preflight: %s %s",
        isvc.metadata.namespace,
        isvc.metadata.name,
        verdict.reason,
        verdict.message,
    )
    conditions = merge_foreign_condition(
        status["conditions"], verdict.condition, isvc.metadata.generation, now
    )
    new = {**status, "kvTransport": new_record, "conditions": conditions}
    return new, plan.retry_after_s(new_record, since)


def _start(
    runner: Executor, isvc: InferenceService, fingerprint: str, pair: tuple[PodInfo, PodInfo]
) -> PreflightRun:
    prefill, decode = pair
    assert decode.pod_ip is not None
    port = isvc.spec.kv_transfer.preflight.port
    url = plan.listener_url(decode.pod_ip, port) + "/preflight/run"
    body = plan.request(isvc, prefill).to_json()
    future = runner.submit(io.run, url, body, plan.RUN_TIMEOUT_S)
    return PreflightRun(fingerprint, pair, future)
