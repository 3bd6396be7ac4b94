"""What the activator passes on, which of the router's answers it takes for "no pair", and
what it answers itself."""

from __future__ import annotations

import json

import pytest

from pdfleet.activator import proxying


def test_request_headers_lose_hop_by_hop_ones_and_those_the_client_sets() -> None:
    headers = [
        ("Host", "svc.ns:8000"),
        ("Connection", "keep-alive, X-Per-Hop"),
        ("X-Per-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("TE", "trailers"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic eA=="),
        ("Content-Length", "12"),
        ("Expect", "100-continue"),
        ("Authorization", "Bearer sk-1"),
        ("Content-Type", "application/json"),
        ("X-Request-Id", "a"),
        ("X-Request-Id", "b"),
    ]
    assert proxying.request_headers(headers) == [
        ("Authorization", "Bearer sk-1"),
        ("Content-Type", "application/json"),
        ("X-Request-Id", "a"),
        ("X-Request-Id", "b"),
    ]


def test_response_headers_keep_length_and_encoding_the_body_passes_unchanged() -> None:
    headers = [
        ("Content-Type", "text/event-stream"),
        ("Content-Length", "42"),
        ("Content-Encoding", "gzip"),
        ("Transfer-Encoding", "chunked"),
        ("connection", "close"),
        ("x-request-id", "cmpl-1"),
    ]
    assert proxying.response_headers(headers) == [
        ("Content-Type", "text/event-stream"),
        ("Content-Length", "42"),
        ("Content-Encoding", "gzip"),
        ("x-request-id", "cmpl-1"),
    ]


def test_expired_is_a_503_with_retry_after_naming_the_service() -> None:
    answer = proxying.expired(service="ns/svc", max_wait_s=300.0, retry_after_s=29.2)
    assert answer.status == 503
    assert dict(answer.headers) == {"Content-Type": "application/json", "Retry-After": "30"}
    assert json.loads(answer.body) == {
        "error": {
            "message": "pdfleet activator: ns/svc had no ready prefill/decode pair within "
            "maxWait 300s; retry later",
            "type": "service_unavailable",
            "param": None,
            "code": 503,
        }
    }


def test_retry_after_is_a_whole_second_at_least() -> None:
    answer = proxying.expired(service="", max_wait_s=0.5, retry_after_s=0.1)
    assert dict(answer.headers)["Retry-After"] == "1"
    assert "the service had no ready" in json.loads(answer.body)["error"]["message"]
    assert "maxWait 0.5s" in json.loads(answer.body)["error"]["message"]


def test_upstream_failed_is_a_502_naming_the_router() -> None:
    answer = proxying.upstream_failed(upstream="http://r:8000", error="Connection refused")
    assert answer.status == 502
    assert json.loads(answer.body)["error"] == {
        "message": "pdfleet activator: the router at http://r:8000 did not answer: "
        "Connection refused",
        "type": "bad_gateway",
        "param": None,
        "code": 502,
    }


@pytest.mark.parametrize(
    ("status", "ready", "recheck", "rehold"),
    [
        # The pair left between two polls: the router's "503 No available workers", and its
        # /readiness asked right after says no.
        (503, False, True, True),
        # Still ready: the 503 is the router's answer (overload, a failing worker), passed on.
        (503, True, True, False),
        # Any other status is the router's answer, whatever /readiness says.
        (200, True, False, False),
        (200, False, False, False),
        (502, False, False, False),
        (504, False, False, False),
        (429, False, False, False),
        (500, False, False, False),
    ],
)
def test_only_a_503_from_a_router_with_no_ready_pair_is_held_again(
    status: int, ready: bool, recheck: bool, rehold: bool
) -> None:
    assert proxying.recheck(status) is recheck
    assert proxying.rehold(status=status, ready=ready) is rehold
