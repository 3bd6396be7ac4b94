"""Which request targets are the client API (pdfleet.clientpaths): the table both fronts, the
HTTPRoute and the activator, keep clients to."""

from __future__ import annotations

import pytest

from pdfleet.clientpaths import is_client_path

WORKER = "http%3A%2F%2F10.0.0.7%3A8000"


@pytest.mark.parametrize(
    "target",
    [
        "/v1/completions",
        "/v1/chat/completions?stream=true",
        "/v1/models",
        "/v1/x%2Fy/completions",  # an encoded slash inside a segment climbs nowhere
        "/v1/a..b",
        "/v1/.well-known",
        "/liveness",
        "/readiness",
    ],
)
def test_the_client_api_passes(target: str) -> None:
    assert is_client_path(target)


@pytest.mark.parametrize(
    "target",
    [
        f"/workers/{WORKER}",
        f"/remove_worker?url={WORKER}",
        "/add_worker",
        "/flush_cache",
        "/workers",
        "/v1",
        "/liveness/x",
        "/metrics",
        f"/v1/../workers/{WORKER}",
        f"/v1/%2e%2e/workers/{WORKER}",
        f"/v1/%2E%2E/workers/{WORKER}",
        f"/v1/..%2fworkers/{WORKER}",
        f"/v1//../workers/{WORKER}",
        "/v1/%252e%252e/flush_cache",  # decoded twice on the way
        "/v1/..\\flush_cache",
        "/v1/./../flush_cache",
        "/v1/..",
    ],
)
def test_the_admin_api_and_paths_that_climb_out_of_v1_do_not(target: str) -> None:
    assert not is_client_path(target)
