"""The Prometheus source against malformed and hostile answers: the policy holds.

The real `prometheus-api-client` talks to a small HTTP server on loopback that answers every
query with one canned response: NaN, infinite, negative and huge values, JSON of the wrong
shape, HTML error pages, truncated bodies. Reading a window must never raise, and every
window that cannot be trusted must make the policy hold (MetricsMissing or MetricsNaN).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from pdfleet.autoscale.metrics import PrometheusSource, parse_scalar
from pdfleet.autoscale.policy import PolicyConfig, RoleReplicas, decide, metrics_problem

CFG = PolicyConfig(ttft_target_s=1.0, itl_target_s=0.02, prefill_max=8, decode_max=8)
NOW = 1000.0
HTML_502 = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


def _vector(value: Any) -> bytes:
    sample = {"metric": {}, "value": [NOW, value]}
    body = {"status": "success", "data": {"resultType": "vector", "result": [sample]}}
    return json.dumps(body).encode()


class Canned(BaseHTTPRequestHandler):
    """Answers every request with the class's (status, content type, body, declared length)."""

    answer: ClassVar[tuple[int, str, bytes, int | None]] = (200, "application/json", b"", None)

    def do_GET(self) -> None:
        status, content_type, body, length = self.answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_POST = do_GET  # noqa: N815 (the name http.server dispatches to)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


JSON = "application/json"
HOSTILE: dict[str, tuple[int, str, bytes, int | None]] = {
    "nan": (200, JSON, _vector("NaN"), None),
    "inf": (200, JSON, _vector("+Inf"), None),
    "minus-inf": (200, JSON, _vector("-Inf"), None),
    "negative": (200, JSON, _vector("-5"), None),
    "overflow": (200, JSON, _vector("1e400"), None),
    "not-a-number": (200, JSON, _vector("fast"), None),
    "null-value": (200, JSON, _vector(None), None),
    "value-not-a-pair": (200, JSON, json.dumps({"status": "success", "data": {
        "resultType": "vector", "result": [{"metric": {}, "value": "7"}]}}).encode(), None),
    "result-not-a-list": (200, JSON, b'{"status":"success","data":{"result":{"a":1}}}', None),
    "no-data": (200, JSON, b'{"status":"success"}', None),
    "json-list": (200, JSON, b"[1, 2, 3]", None),
    "empty-vector": (200, JSON, b'{"status":"success","data":{"result":[]}}', None),
    "error-status": (200, JSON, b'{"status":"error","error":"query timed out"}', None),
    "html-error-page": (502, "text/html", HTML_502, None),
    "html-with-200": (200, "text/html", HTML_502, None),
    "truncated": (200, JSON, _vector("3")[:20], len(_vector("3"))),
    "empty-body": (200, JSON, b"", None),
}  # fmt: skip


@pytest.mark.parametrize("answer", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_makes_the_policy_hold(
    prometheus: str, answer: tuple[int, str, bytes, int | None]
) -> None:
    Canned.answer = answer
    window = PrometheusSource(prometheus, timeout_s=2).window("ns", "svc", NOW, 90, 120)
    assert metrics_problem(NOW, CFG, window) in ("MetricsMissing", "MetricsNaN")
    fleet = RoleReplicas(current=3, ready=3)
    decision = decide(CFG, NOW, fleet, fleet, window)
    assert (decision.prefill, decision.decode) == (3, 3)
    assert decision.conditions[0].status == "False"


def test_a_huge_but_finite_load_scales_up_inside_the_bounds(prometheus: str) -> None:
    Canned.answer = (200, JSON, _vector("1e300"), None)
    window = PrometheusSource(prometheus, timeout_s=2).window("ns", "svc", NOW, 90, 120)
    assert metrics_problem(NOW, CFG, window) is None
    fleet = RoleReplicas(current=3, ready=3)
    decision = decide(CFG, NOW, fleet, fleet, window)
    assert 3 <= decision.prefill <= CFG.prefill_max and 3 <= decision.decode <= CFG.decode_max


@pytest.mark.parametrize(
    "result",
    [None, "x", {}, [{}], [{"value": [1]}], [{"value": [1, "NaN"]}], [{"value": [1, "-1"]}],
     [{"value": [1, "1"]}, {"value": [1, "2"]}]],
)  # fmt: skip
def test_parse_scalar_is_nan_for_anything_but_one_usable_sample(result: Any) -> None:
    assert math.isnan(parse_scalar(result))


def test_parse_scalar_reads_one_sample() -> None:
    assert parse_scalar([{"metric": {}, "value": [NOW, "0.25"]}]) == 0.25
