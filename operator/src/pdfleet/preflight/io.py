"""The preflight's only I/O in the operator: one HTTP call to a decode pod's listener.

Where it fits: the controller calls `run()` when preflight.plan says a run is due; the decode
pod's agent does the NIXL work (pdfleet_worker.preflight) and answers with the result. An
unreachable listener or a bad answer becomes a failed result, which the plan reports and
retries; it never raises into the reconcile pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx

from pdfleet import httpclient
from pdfleet_wire.preflight import PreflightResult, failed

log = logging.getLogger(__name__)


def run(url: str, body: Mapping[str, Any], timeout_s: float) -> PreflightResult:
    """POST the request to `url` (the decode pod's /preflight/run) and parse the answer."""
    try:
        response = httpclient.shared().post(
            url, json=dict(body), timeout=httpx.Timeout(timeout_s, connect=5)
        )
        data = response.json()
    except (httpx.HTTPError, ValueError) as err:
        log.info("preflight %s: %s", url, err)
        return failed(f"decode preflight listener {url}: {err}")
    if response.status_code != 200 or not isinstance(data, dict):
        return failed(f"decode preflight listener {url}: HTTP {response.status_code} {data}")
    return PreflightResult.from_json(data)
