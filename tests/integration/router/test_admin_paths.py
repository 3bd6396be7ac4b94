"""The router's admin API is out of reach through the rendered HTTPRoute: shown on the real
vllm-router 0.1.17.

vllm-router serves `DELETE /workers/<url>` and `POST /remove_worker` on its serving port with
no authentication (reference/router-behaviour.md §2). pdfleet puts a path filter in front:
the HTTPRoute from `pdfleet render --http-route` forwards only `/v1/*` and the probes. No
Gateway runs locally, so this test applies the route's matching rules to each request (as a
Gateway that does NOT normalise paths would: the worst case) and sends what passes, raw and
unnormalised, to a real router in front of four simulators. Removal attempts disguised under
`/v1/` must leave every worker registered; the same removal sent directly (what the
NetworkPolicy keeps clients from doing) does remove one, so the check can fail.

With `autoscaling.scaleToZero`, clients reach the router through the activator, which is a
front of its own (pdfleet.clientpaths): a real `pdfleet activator` in front of the same real
router answers 404 to every admin path and every one disguised with dot segments, and forwards
none of them.
"""

from __future__ import annotations

import http.client
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.clientpaths import is_client_path
from pdfleet.render.network import http_route
from pdfleet_worker.sim.procs import Proc, SimProc, free_port, wait_http
from tests.http_route import route_allows

# The four simulators and the real router of the P/D routing tests.
from tests.integration.router.test_router_pd import fleet  # noqa: F401
from tests.spec_cases import sample

Fleet = tuple[str, list[SimProc], list[SimProc]]


def _attacks(worker: str) -> list[tuple[str, str]]:
    """(method, raw path) removals of `worker` hidden under an allowed prefix."""
    enc = quote(worker, safe="")
    return [
        ("DELETE", f"/v1/../workers/{enc}"),
        ("DELETE", f"/v1/%2e%2e/workers/{enc}"),
        ("DELETE", f"/v1/..%2fworkers/{enc}"),
        ("DELETE", f"/v1//../workers/{enc}"),
        ("DELETE", f"/v1/workers/{enc}"),
        ("POST", f"/v1/../remove_worker?url={enc}"),
        ("POST", f"/v1/%2e%2e/remove_worker?url={enc}"),
        ("POST", f"/v1/remove_worker?url={enc}"),
        ("POST", f"/v1/../add_worker?url={enc}"),
        ("POST", "/v1/../flush_cache"),
    ]


def _raw(router: str, method: str, path: str) -> int:
    """Send `path` byte for byte (httpx would normalise the dot segments away)."""
    parts = urlsplit(router)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, path, body=b"{}", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def assert_serves_completions(front: str) -> None:
    model = httpx.get(f"{front}/v1/models", timeout=10).json()["data"][0]["id"]
    reply = httpx.post(
        f"{front}/v1/completions",
        json={"model": model, "prompt": "hello", "max_tokens": 2},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text


def _registered(router: str) -> set[str]:
    body = httpx.get(f"{router}/workers", timeout=5).json()
    return {w["url"] for w in body["workers"]}


def test_admin_paths_do_not_pass_the_route_and_disguised_ones_do_nothing(
    fleet: Fleet,  # noqa: F811
) -> None:
    router, prefills, decodes = fleet
    route = http_route(InferenceService.model_validate(sample("minimal")), "gw", "public")
    everyone = {p.url for p in prefills + decodes}
    assert _registered(router) == everyone
    victim = decodes[1].url
    enc = quote(victim, safe="")

    # The route refuses the admin API outright.
    for path in (f"/workers/{enc}", f"/remove_worker?url={enc}", "/workers", "/list_workers"):
        assert not route_allows(route, path.split("?")[0]), path

    # What it lets through cannot remove a worker, however the path is spelled.
    sent = []
    for method, path in _attacks(victim):
        if route_allows(route, path.split("?")[0]):
            sent.append((method, path, _raw(router, method, path)))
    assert len(sent) >= 6, sent
    assert _registered(router) == everyone, sent
    # Clients still get served through it.
    assert route_allows(route, "/v1/completions")
    assert_serves_completions(router)

    # Control: the same removal sent straight to the router works. This is what a client in
    # another pod could do without the NetworkPolicy, and it proves the check above can fail.
    assert _raw(router, "DELETE", f"/workers/{enc}") == 200
    assert _registered(router) == everyone - {victim}
    print("\nthrough the route:", *(f"{m} {p} -> {s}" for m, p, s in sent), sep="\n  ")


@pytest.fixture
def activator(fleet: Fleet, tmp_path: Path) -> Iterator[str]:  # noqa: F811
    router = fleet[0]
    port = free_port()
    argv = [sys.executable, "-m", "pdfleet.cli", "activator", "--upstream", router,
            "--service", "default/admin", "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    proc = Proc(argv, os.path.join(tmp_path, "activator.log")).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", 20.0, proc.popen)
        yield url
    finally:
        proc.stop()


def test_the_activator_answers_404_to_admin_paths_and_forwards_none(
    fleet: Fleet,  # noqa: F811
    activator: str,
) -> None:
    router, prefills, decodes = fleet
    everyone = {p.url for p in prefills + decodes}
    victim = decodes[1].url
    enc = quote(victim, safe="")
    admin = [("DELETE", f"/workers/{enc}"), ("POST", f"/remove_worker?url={enc}"),
             ("POST", f"/add_worker?url={enc}"), ("POST", "/flush_cache"),
             ("GET", "/workers"), ("GET", "/list_workers")]  # fmt: skip
    answers = [(m, p, _raw(activator, m, p)) for m, p in admin + _attacks(victim)]
    refused = [a for a in answers if a[2] == 404 and not is_client_path(a[1])]
    # What stays under /v1/ without climbing out is the router's to answer (it has no such
    # path); everything else the activator refused itself.
    passed = [a for a in answers if is_client_path(a[1])]
    assert len(refused) + len(passed) == len(answers) and len(refused) >= 12, answers
    assert _registered(router) == everyone, answers
    metrics = httpx.get(f"{activator}/metrics", timeout=5).text
    assert f"pdfleet_activator_refused_total {float(len(refused))}" in metrics
    assert f"pdfleet_activator_requests_total {float(len(passed))}" in metrics
    # Clients still get served through it, and the router's probes pass.
    assert_serves_completions(activator)
    assert httpx.get(f"{activator}/readiness", timeout=5).status_code == 200
