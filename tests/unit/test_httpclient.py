"""The operator's shared HTTP client (`pdfleet.httpclient`)."""

from __future__ import annotations

import socket

from pdfleet import httpclient
from pdfleet.preflight import io as preflight_io


def test_one_client_for_the_process_with_quick_defaults() -> None:
    assert httpclient.shared() is httpclient.shared()
    assert httpclient.shared().timeout == httpclient.TIMEOUT


def test_preflight_answers_a_failed_result_through_the_shared_client() -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = preflight_io.run(f"http://127.0.0.1:{port}/preflight/run", {}, 5.0)
    assert not result.ok
    assert "decode preflight listener" in result.error
    assert not httpclient.shared().is_closed
