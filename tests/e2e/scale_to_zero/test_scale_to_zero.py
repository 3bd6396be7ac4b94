"""Scale to zero on the local cluster: sleep after idleAfter, wake on held requests, and a wake
that cannot be placed (docs/design/scale-to-zero.md).

The demo fleet runs with `scaleToZero {idleAfter: 1m, maxWait: 2m}`; clients reach it through
its two activator pods (`pdfleet activator`, run by the bridge like the router), which forward
to the real vllm-router. A second service in the namespace, `stranded`, has a prefill node
selector no node matches and `maxWait: 20s`. The tests:

* a long stream keeps the service awake, completes in full, and the service sleeps idleAfter
  after it ended, not after it began; then no worker pod and no GPU is left;
* 20 requests to the sleeping service are all answered; the first one's first token is the
  wake, split into scheduling, engine start and the rest (the router and the activator);
* the stranded service's wake cannot be placed: every held request gets the documented 503
  with Retry-After after maxWait, the status names the cause, and the demo service is not
  disturbed.

Run inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/scale_to_zero``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from e2e.platform.cluster import Cluster, wait_until
from e2e.platform.fleet import MODEL, Fleet, condition, fleet_manifest, running_fleet
from e2e.platform.loadgen import OK, Phase, one_request
from e2e.platform.sleep import (
    activator_urls,
    gpus_requested,
    sleep_state,
    status_of,
    wait_asleep,
    wait_awake,
    wake_split,
    worker_pods,
)
from pdfleet import labels
from tests.e2e.support import api_client, bridge_cluster
from tests.spec_cases import merge_patch

__all__ = ["api_client", "bridge_cluster"]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TIME_SCALE = 10.0
IDLE_AFTER_S = 60.0
SLEEPS = {"spec": {"autoscaling": {"scaleToZero": {"idleAfter": "1m", "maxWait": "2m"}}}}

STRANDED = "stranded"
STRANDED_MAX_WAIT_S = 20.0
NOWHERE = {"pdfleet.dev/e2e-nowhere": "true"}
#: Long enough to outlast a few autoscaler intervals while streaming.
LONG = Phase("long", 0.0, 0.0, 32, 800)
SHORT = Phase("held", 0.0, 0.0, 64, 16)


class StateLog:
    """The service's sleep state, read every second in the background: (wall time, state)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.seen: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.seen.append((time.time(), sleep_state(self.fleet.status())))

    def first(self, state: str, after: float = 0.0) -> float | None:
        return next((t for t, s in self.seen if s == state and t >= after), None)

    def __enter__(self) -> StateLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def fleet(
    bridge_cluster: Cluster, api_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The demo fleet with scaleToZero, in a namespace of its own, with Prometheus, a bridge
    for that namespace and a real operator process, Ready."""
    workdir = tmp_path_factory.mktemp("scale-to-zero")
    namespace = f"sleep-{uuid.uuid4().hex[:8]}"

    def sleepy(manifest: dict[str, Any]) -> dict[str, Any]:
        return dict(merge_patch(manifest, SLEEPS))

    with running_fleet(
        bridge_cluster, api_client, workdir, namespace, TIME_SCALE, edit=sleepy
    ) as running:
        yield running


@pytest.fixture(scope="module")
def stranded(fleet: Fleet, bridge_cluster: Cluster) -> Iterator[str]:
    """The second service, applied at once so that its idleAfter runs beside the tests before."""
    manifest = fleet_manifest(fleet.prometheus.url, fleet.namespace, STRANDED)
    manifest = merge_patch(manifest, SLEEPS)
    manifest = merge_patch(
        manifest,
        {"spec": {"prefill": {"nodeSelector": NOWHERE},
                  "autoscaling": {"scaleToZero": {"maxWait": "20s"}}}},
    )  # fmt: skip
    bridge_cluster.apply([manifest])
    yield STRANDED


def ready_soon(fleet: Fleet, within_s: float = 60.0) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        found = condition(fleet.status(), "Ready") or {}
        return found if found.get("status") == "True" else None

    return wait_until(ready, within_s, f"{fleet.name} Ready")


def test_an_idle_service_sleeps_after_its_last_request_ends(fleet: Fleet, stranded: str) -> None:
    api, namespace = fleet.api, fleet.namespace
    urls = activator_urls(api, namespace, fleet.name)
    assert len(urls) == 2, urls
    assert sleep_state(fleet.status()) == "Awake"

    async def stream() -> tuple[Any, float]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
            record = await one_request(http, urls[0], MODEL, LONG, 0.0, TIME_SCALE)
            return record, time.time()

    with StateLog(fleet) as states:
        started = time.time()
        record, ended = asyncio.run(stream())
        assert record.outcome == OK and record.tokens == LONG.output_tokens, record
        print(f"the stream lasted {ended - started:.1f}s")
        status = wait_asleep(api, namespace, fleet.name, IDLE_AFTER_S + 120)
    fell_asleep = states.first("Idle")
    assert fell_asleep is not None
    # counted from the stream's end: one interval (5 s) and a read of slack before it
    assert fell_asleep >= ended + IDLE_AFTER_S - 6, (fell_asleep - ended, states.seen[-5:])
    assert not [t for t, s in states.seen if s == "Idle" and t < ended]
    ready = condition(status, "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("True", "Idle"), status
    assert status["scaleToZero"]["lastBusy"]["prefill"] >= 1
    apps = client.AppsV1Api(api)
    for role in labels.WORKER_ROLES:
        sts = apps.read_namespaced_stateful_set(f"{fleet.name}-{role}", namespace)
        assert sts.spec.replicas == 0, (role, sts.spec.replicas)
    assert gpus_requested(worker_pods(api, namespace, fleet.name)) == 0
    print(f"asleep {fell_asleep - ended:.1f}s after the last request ended:", status["scaleToZero"])


def test_twenty_requests_to_a_sleeping_service_are_all_answered(fleet: Fleet) -> None:
    api, namespace = fleet.api, fleet.namespace
    wait_asleep(api, namespace, fleet.name, IDLE_AFTER_S + 120)
    urls = activator_urls(api, namespace, fleet.name)

    async def burst() -> list[Any]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as http:
            return list(
                await asyncio.gather(
                    *(one_request(http, urls[i % len(urls)], MODEL, SHORT, 0.0, TIME_SCALE)
                      for i in range(20))
                )
            )  # fmt: skip

    sent = time.time()
    records = asyncio.run(burst())
    bad = [r for r in records if r.outcome != OK]
    assert not bad, bad
    first_token_s = min(r.ttft_s for r in records) * TIME_SCALE  # wall seconds

    status = wait_awake(api, namespace, fleet.name, 60)
    wake_s = status["scaleToZero"]["wakeSeconds"]
    split = wake_split(worker_pods(api, namespace, fleet.name), sent, sent + first_token_s)
    print(f"first token {first_token_s:.1f}s after the burst; status.wakeSeconds {wake_s}")
    for part, seconds in split.items():
        print(f"  {part}: {seconds:.1f}s")
    assert first_token_s <= 120.0
    assert 0 < wake_s <= first_token_s + 6
    held = 0.0
    for url in urls:
        page = httpx.get(f"{url}/metrics", timeout=5).text
        held += sum(
            float(line.split()[-1])
            for line in page.splitlines()
            if line.startswith("pdfleet_activator_held_total")
        )
    assert held >= 20, held


def test_a_wake_that_cannot_be_placed_answers_503_after_max_wait(
    fleet: Fleet, stranded: str
) -> None:
    api, namespace = fleet.api, fleet.namespace
    wait_asleep(api, namespace, stranded, IDLE_AFTER_S + 180)
    # The demo service may be in a step of its own (the wake before this test, a scale-down
    # after it: Ready is False until the StatefulSet has rolled the step out).
    assert ready_soon(fleet)
    urls = activator_urls(api, namespace, stranded)

    async def held() -> list[tuple[int, dict[str, str], dict[str, Any], float]]:
        async def one(url: str) -> tuple[int, dict[str, str], dict[str, Any], float]:
            t0 = time.monotonic()
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
            async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
                response = await http.post(f"{url}/v1/completions", json=body)
            return (response.status_code, dict(response.headers), response.json(),
                    time.monotonic() - t0)  # fmt: skip

        return list(await asyncio.gather(*(one(urls[i % len(urls)]) for i in range(3))))

    answers = asyncio.run(held())
    for code, headers, body, waited in answers:
        assert code == 503, (code, body)
        assert "retry-after" in headers, headers
        assert "maxWait" in body["error"]["message"], body
        assert STRANDED_MAX_WAIT_S - 1 <= waited <= STRANDED_MAX_WAIT_S + 10, waited
    status = status_of(api, namespace, stranded)
    assert sleep_state(status) == "Waking", status.get("scaleToZero")
    capacity = condition(status, "InsufficientCapacity") or {}
    assert capacity.get("status") == "True", status["conditions"]
    ready = condition(status, "Ready") or {}
    assert ready.get("status") == "False" and ready.get("reason") == "InsufficientCapacity", ready
    print(f"stranded: {capacity.get('message')}")
    # ...and the demo service was not disturbed: Ready (serving, or Idle by its own
    # idleAfter) once its own autoscaling steps settle
    assert ready_soon(fleet)
