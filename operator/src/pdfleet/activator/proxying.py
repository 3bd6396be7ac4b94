"""The activator's proxy rules, pure: which headers pass, which of the router's answers are
no answer, and what it answers by itself.

Where it fits: pdfleet.activator.server copies requests to the router and answers back through
`request_headers()` and `response_headers()`; it asks `recheck()` and `rehold()` whether the
router's answer goes to the client or the request waits again for a pair; and it answers with
`expired()` (a request held past maxWait), `upstream_failed()` (the router could not be
reached) or `not_client_path()` (the router's admin API, never forwarded) when no answer of the
router's can be passed on. The errors take the OpenAI shape that
vLLM and its clients read: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

# RFC 9110 7.6.1: they describe one connection, not the message, so a proxy drops them (and
# any header the Connection header names).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The client for the router sets these itself: Host is the router Service's own name;
# Content-Length follows the body the activator read in full; an Expect: 100-continue, already
# answered to the client, would make the router's client wait for a second "100".
REQUEST_SET_BY_CLIENT = frozenset({"host", "content-length", "expect"})


def _passed(headers: Iterable[tuple[str, str]], dropped: frozenset[str]) -> list[tuple[str, str]]:
    headers = list(headers)
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
    }
    return [(n, v) for n, v in headers if (low := n.lower()) not in dropped and low not in named]


def request_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's headers as the router gets them, repeated ones kept, in order."""
    return _passed(headers, HOP_BY_HOP | REQUEST_SET_BY_CLIENT)


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The router's headers as the client gets them. Content-Length and Content-Encoding
    stay: the body passes byte for byte, never decompressed."""
    return _passed(headers, HOP_BY_HOP)


# What vllm-router (0.1.17) answers at once, without sending the request to any worker, when it
# has no prefill or no decode: "503 No available workers: 1 prefill, 0 decode".
NO_PAIR_STATUS = 503


def recheck(status: int) -> bool:
    """Whether the router's answer may be "no pair" rather than its answer to the request: the
    pair can leave between two readiness polls (a drain to zero), and then a request the
    activator took for servable gets this. Asked before a byte of the answer goes to the
    client, so the request, its body read in full, can still be sent again."""
    return status == NO_PAIR_STATUS


def rehold(*, status: int, ready: bool) -> bool:
    """Whether the request waits again for a pair, given the router's answer and what its
    /readiness said right after. A 503 from a router that is still ready is its real answer
    (overload, a failing worker) and goes to the client unchanged; one from a router that has
    no pair is the pair gone: the request is held again, in the place it arrived in. The body
    ("No available workers") is not read: the readiness is the router's own word on it."""
    return recheck(status) and not ready


@dataclass(frozen=True)
class Answer:
    """A response of the activator's own."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def _error(status: int, kind: str, message: str, *extra: tuple[str, str]) -> Answer:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return Answer(status, (("Content-Type", "application/json"), *extra), json.dumps(body).encode())


def expired(*, service: str, max_wait_s: float, retry_after_s: float) -> Answer:
    """503 for a request held `max_wait_s` while the router had no prefill/decode pair."""
    who = service or "the service"
    return _error(
        503,
        "service_unavailable",
        f"pdfleet activator: {who} had no ready prefill/decode pair within maxWait "
        f"{max_wait_s:g}s; retry later",
        ("Retry-After", str(max(1, math.ceil(retry_after_s)))),
    )


def not_client_path(path: str) -> Answer:
    """404 for a path that is not the client API (pdfleet.clientpaths): the router's admin
    API shares its serving port, and the activator is the front clients reach it through."""
    return _error(404, "not_found", f"pdfleet activator: {path} is not served to clients")


def upstream_failed(*, upstream: str, error: str) -> Answer:
    """502 for a request forwarded to a router that did not answer (refused, reset, timed
    out before its response began)."""
    return _error(
        502, "bad_gateway", f"pdfleet activator: the router at {upstream} did not answer: {error}"
    )
