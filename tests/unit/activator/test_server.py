"""The activator as a process sees it: a real aiohttp router stand-in on 127.0.0.1, a real
activator in front of it, and an HTTP client. Forward and stream while the router is ready;
hold and release in arrival order while it is not; hold again, in its place, a request the
router turns away because its last pair left between two polls, and pass on a 503 of a router
that is still ready; 503 past maxWait; 502 when the router does not answer; its own /healthz
and /metrics (what the operator reads to wake the service)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.activator import server
from tests.unit.activator.fakes import Fleet, until

pytestmark = pytest.mark.timeout(30)


async def metric_values(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as client, client.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("pdfleet_activator_")
    }


def expect_values(values: dict[str, float], **want: float) -> None:
    """The activator's series named in `want` (without the pdfleet_activator_ prefix)."""
    got = {name: values.get(f"pdfleet_activator_{name}") for name in want}
    assert got == want


async def held(activator: server.Activator, count: int) -> None:
    await until(lambda: activator.queue.held == count)


async def post(
    client: aiohttp.ClientSession, url: str, seq: int, **kwargs: Any
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with client.post(url, json={"seq": seq}, headers={"X-Seq": str(seq)}, **kwargs) as r:
        return r.status, await r.json(), dict(r.headers)


async def test_forwards_at_once_while_ready_and_streams_events_as_they_come(fleet: Fleet) -> None:
    fleet.router.ready = True
    activator, url = await fleet.start_activator(await fleet.start_router())
    assert activator.ready  # polled once before serving

    async with (
        aiohttp.ClientSession() as client,
        client.post(url + "/v1/stream", json={"stream": True}, headers={"X-Seq": "0"}) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream"
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
        # The router has sent one event and waits for this reader: nothing was buffered.
        assert first == b"data: 1\n\n"
        assert not fleet.router.stream_finished
        fleet.router.read_first.set()
        rest = await r.content.read()
    assert rest == b"data: 2\n\ndata: [DONE]\n\n"
    assert fleet.router.waited_for_reader is True
    values = await metric_values(url)
    assert values["pdfleet_activator_held_total"] == 0
    assert values["pdfleet_activator_forwarded_total"] == 1


async def test_passes_method_path_query_headers_and_body_as_they_are(fleet: Fleet) -> None:
    fleet.router.ready = True
    _, url = await fleet.start_activator(await fleet.start_router())
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding", "User-Agent")) as client,
        client.put(
            url + "/v1/x%2Fy/completions?b=2&a=%20",
            data=b'{"prompt": "hi"}',
            headers={
                "Content-Type": "application/json",
                "Authorization": "Bearer sk-1",
                "Connection": "keep-alive, X-Per-Hop",
                "X-Per-Hop": "1",
                "X-Seq": "7",
            },
        ) as r,
    ):
        assert r.status == 200
        echo = await r.json()
        assert r.headers["X-From-Router"] == "1"
    assert echo["method"] == "PUT"
    assert echo["path_qs"] == "/v1/x%2Fy/completions?b=2&a=%20"
    assert echo["body"] == '{"prompt": "hi"}'
    got = {name.lower(): value for name, value in echo["headers"]}
    assert got["authorization"] == "Bearer sk-1"
    assert got["content-type"] == "application/json"
    assert got["content-length"] == "16"
    assert "x-per-hop" not in got
    # None added on the way: the router would compress for a client that cannot read it.
    assert "accept-encoding" not in got
    assert "user-agent" not in got


async def test_holds_twenty_and_forwards_all_in_arrival_order(fleet: Fleet) -> None:
    activator, url = await fleet.start_activator(await fleet.start_router(), max_wait_s=20.0)
    assert not activator.ready
    async with aiohttp.ClientSession() as client:
        requests = []
        for seq in range(20):
            requests.append(asyncio.create_task(post(client, url + "/v1/completions", seq)))
            await held(activator, seq + 1)
        await asyncio.sleep(0.1)  # a few more polls and dispatcher turns: still held
        assert activator.queue.held == 20
        assert fleet.router.seen == []
        values = await metric_values(url)
        expect_values(
            values,
            requests_held=20,
            requests_in_flight=20,
            upstream_ready=0,
        )

        fleet.router.ready = True
        answers = await asyncio.wait_for(asyncio.gather(*requests), 10)

    assert [status for status, _, _ in answers] == [200] * 20
    assert [json.loads(echo["body"])["seq"] for _, echo, _ in answers] == list(range(20))
    assert fleet.router.seen == [str(seq) for seq in range(20)]
    values = await metric_values(url)
    expect_values(
        values,
        held_total=20,
        forwarded_total=20,
        expired_total=0,
        requests_held=0,
        requests_in_flight=0,
    )


async def test_a_request_held_past_max_wait_gets_503_with_retry_after(fleet: Fleet) -> None:
    _, url = await fleet.start_activator(
        await fleet.start_router(), max_wait_s=0.3, retry_after_s=7.0
    )
    started = time.monotonic()
    async with aiohttp.ClientSession() as client:
        status, body, headers = await post(client, url + "/v1/completions", 0)
    waited = time.monotonic() - started
    assert status == 503
    assert headers["Retry-After"] == "7"
    assert body == {
        "error": {
            "message": "pdfleet activator: ns/svc had no ready prefill/decode pair within "
            "maxWait 0.3s; retry later",
            "type": "service_unavailable",
            "param": None,
            "code": 503,
        }
    }
    assert 0.3 <= waited < 1.5
    assert fleet.router.seen == []
    values = await metric_values(url)
    expect_values(
        values,
        expired_total=1,
        forwarded_total=0,
        requests_held=0,
        oldest_held_timestamp_seconds=0,
    )


async def test_the_oldest_held_arrival_is_exported_while_held_and_0_after_release(
    fleet: Fleet,
) -> None:
    """What the operator reads to wake the service (held > 0) and how long it has waited."""
    now = [1_700_000_000.0]
    activator, url = await fleet.start_activator(
        await fleet.start_router(), max_wait_s=20.0, wall_clock=lambda: now[0]
    )
    values = await metric_values(url)
    assert values["pdfleet_activator_oldest_held_timestamp_seconds"] == 0
    async with aiohttp.ClientSession() as client:
        first = asyncio.create_task(post(client, url + "/v1/completions", 0))
        await held(activator, 1)
        now[0] += 5.0
        second = asyncio.create_task(post(client, url + "/v1/completions", 1))
        await held(activator, 2)
        now[0] += 5.0
        values = await metric_values(url)
        assert values["pdfleet_activator_requests_held"] == 2
        assert values["pdfleet_activator_oldest_held_timestamp_seconds"] == 1_700_000_000.0

        first.cancel()  # its client left: the next one is the oldest now
        await held(activator, 1)
        values = await metric_values(url)
        assert values["pdfleet_activator_oldest_held_timestamp_seconds"] == 1_700_000_005.0

        fleet.router.ready = True
        status, _, _ = await asyncio.wait_for(second, 10)
    assert status == 200
    values = await metric_values(url)
    expect_values(
        values,
        requests_held=0,
        oldest_held_timestamp_seconds=0,
        last_activity_timestamp_seconds=1_700_000_010.0,
    )


async def test_a_router_that_refuses_while_ready_gets_a_502(fleet: Fleet) -> None:
    fleet.router.ready = True
    upstream = await fleet.start_router()
    activator, url = await fleet.start_activator(upstream, poll_idle_s=60.0)
    assert activator.ready
    assert fleet.router_server is not None
    await fleet.router_server.close()  # e.g. the router's SIGTERM: its listener closes at once

    async with aiohttp.ClientSession() as client:
        status, body, _ = await post(client, url + "/v1/completions", 0)
    assert status == 502
    assert body["error"]["type"] == "bad_gateway"
    assert body["error"]["message"].startswith(
        f"pdfleet activator: the router at {upstream} did not answer: "
    )
    values = await metric_values(url)
    assert values["pdfleet_activator_upstream_errors_total"] == 1
    assert values["pdfleet_activator_forwarded_total"] == 0


async def test_a_stream_that_breaks_off_is_cut_not_ended(fleet: Fleet) -> None:
    fleet.router.ready = True
    _, url = await fleet.start_activator(await fleet.start_router())
    async with aiohttp.ClientSession() as client, client.post(url + "/v1/broken") as r:
        assert r.status == 200
        assert await r.content.readuntil(b"\n\n") == b"data: 1\n\n"
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.content.read()
    values = await metric_values(url)
    assert values["pdfleet_activator_upstream_errors_total"] == 1


async def test_a_client_that_leaves_while_held_is_never_forwarded(fleet: Fleet) -> None:
    activator, url = await fleet.start_activator(await fleet.start_router(), max_wait_s=20.0)
    async with aiohttp.ClientSession() as client:
        gone = asyncio.create_task(post(client, url + "/v1/completions", 0))
        await until(lambda: activator.queue.held == 1)
        gone.cancel()
        await until(lambda: activator.queue.held == 0 and activator.activity.in_flight == 0)
        fleet.router.ready = True
        await until(lambda: activator.ready)
        status, _, _ = await post(client, url + "/v1/completions", 1)
    assert status == 200
    assert fleet.router.seen == ["1"]


async def test_metrics_and_healthz_are_the_activators_own(fleet: Fleet) -> None:
    fleet.router.ready = True
    activator, url = await fleet.start_activator(
        await fleet.start_router(), max_wait_s=0.2, wall_clock=lambda: 1_700_000_000.0
    )
    async with aiohttp.ClientSession() as client:
        async with client.get(url + "/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok\n")
        assert (await post(client, url + "/v1/completions", 0))[0] == 200
        fleet.router.ready = False
        await until(lambda: not activator.ready)
        assert (await post(client, url + "/v1/completions", 1))[0] == 503
        async with client.post(url + "/metrics") as r:
            assert r.status == 405
    assert fleet.router.seen == ["0"]  # /healthz and /metrics never reached the router
    values = await metric_values(url)
    assert {name: values[name] for name in values if not name.endswith("_created")} == {
        "pdfleet_activator_requests_total": 2,
        "pdfleet_activator_held_total": 1,
        "pdfleet_activator_rehold_total": 0,
        "pdfleet_activator_expired_total": 1,
        "pdfleet_activator_forwarded_total": 1,
        "pdfleet_activator_refused_total": 0,
        "pdfleet_activator_upstream_errors_total": 0,
        "pdfleet_activator_requests_held": 0,
        "pdfleet_activator_oldest_held_timestamp_seconds": 0,
        "pdfleet_activator_requests_in_flight": 0,
        "pdfleet_activator_upstream_ready": 0,
        "pdfleet_activator_last_activity_timestamp_seconds": 1_700_000_000.0,
    }


async def test_the_routers_admin_api_is_answered_404_and_never_held_or_forwarded(
    fleet: Fleet,
) -> None:
    activator, url = await fleet.start_activator(
        await fleet.start_router(), wall_clock=lambda: 1_700_000_000.0
    )
    async with aiohttp.ClientSession() as client:
        admin = (("DELETE", "/workers/http%3A%2F%2F10.0.0.7%3A8000"),
                 ("POST", "/remove_worker?url=x"), ("POST", "/flush_cache"))  # fmt: skip
        for method, path in admin:
            async with client.request(method, url + path) as r:
                assert r.status == 404
                assert "not served to clients" in (await r.json())["error"]["message"]
        # a raw dot segment (aiohttp's client would resolve it before sending)
        reader, writer = await asyncio.open_connection(*url[len("http://") :].split(":"))
        writer.write(
            b"POST /v1/%2e%2e/flush_cache HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
        )
        assert (await reader.readline()).startswith(b"HTTP/1.1 404")
        writer.close()
    # not held although the router has no pair: a probe of the admin API wakes nothing
    assert activator.queue.held == 0 and fleet.router.seen == []
    expect_values(
        await metric_values(url),
        refused_total=4,
        requests_total=0,
        held_total=0,
        last_activity_timestamp_seconds=1_700_000_000.0,
    )


async def test_a_request_the_router_turns_away_as_its_last_pair_leaves_is_held_and_sent_again(
    fleet: Fleet,
) -> None:
    """The drain to zero between two polls: the activator still takes the router for ready,
    forwards, and gets "503 No available workers"; /readiness, asked at once, says 503. The
    client never sees that 503: the request is held and sent again once a pair is back."""
    now = [1_700_000_000.0]
    fleet.router.ready = True
    activator, url = await fleet.start_activator(
        await fleet.start_router(), poll_idle_s=60.0, max_wait_s=20.0, wall_clock=lambda: now[0]
    )
    assert activator.ready
    fleet.router.leave_at_next_request = True
    async with aiohttp.ClientSession() as client:
        answer = asyncio.create_task(post(client, url + "/v1/completions", 0))
        await held(activator, 1)
        assert fleet.router.seen == ["0"]
        assert not activator.ready  # learned from the re-check, not from a poll 60 s away
        now[0] += 3.0
        values = await metric_values(url)
        expect_values(
            values,
            rehold_total=1,
            held_total=0,
            requests_held=1,  # the operator's wake
            oldest_held_timestamp_seconds=1_700_000_000.0,
            requests_in_flight=1,
            upstream_ready=0,
            forwarded_total=0,
        )
        await asyncio.sleep(0.1)  # several held polls: not sent again while not ready
        assert fleet.router.seen == ["0"]

        fleet.router.ready = True  # a pair is back
        status, echo, _ = await asyncio.wait_for(answer, 10)
    assert status == 200
    assert json.loads(echo["body"]) == {"seq": 0}  # the body, sent again in full
    assert fleet.router.seen == ["0", "0"]
    values = await metric_values(url)
    expect_values(
        values,
        requests_total=1,
        rehold_total=1,
        forwarded_total=1,
        expired_total=0,
        upstream_errors_total=0,
        requests_held=0,
        oldest_held_timestamp_seconds=0,
        requests_in_flight=0,
        last_activity_timestamp_seconds=1_700_000_003.0,
    )


async def test_a_request_turned_away_goes_back_ahead_of_those_that_came_after_it(
    fleet: Fleet,
) -> None:
    now = [1_700_000_000.0]
    fleet.router.ready = True
    gate = fleet.router.gate = asyncio.Event()
    activator, url = await fleet.start_activator(
        await fleet.start_router(), max_wait_s=20.0, wall_clock=lambda: now[0]
    )
    async with aiohttp.ClientSession() as client:
        first = asyncio.create_task(post(client, url + "/v1/completions", 0))
        await until(lambda: fleet.router.seen == ["0"])
        fleet.router.ready = False  # the pair leaves while the router has the first request
        await until(lambda: not activator.ready)  # a poll saw it
        now[0] += 5.0
        second = asyncio.create_task(post(client, url + "/v1/completions", 1))
        await held(activator, 1)
        gate.set()  # the router answers the first: 503 No available workers
        await held(activator, 2)
        oldest = activator.queue.oldest()
        assert oldest is not None and oldest.seq == 0
        values = await metric_values(url)
        expect_values(
            values,
            oldest_held_timestamp_seconds=1_700_000_000.0,
            requests_held=2,
            requests_in_flight=2,
            held_total=1,
            rehold_total=1,
        )

        fleet.router.ready = True
        answers = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert [status for status, _, _ in answers] == [200, 200]
    assert fleet.router.seen == ["0", "0", "1"]  # the first still first


async def test_a_503_from_a_router_that_is_still_ready_goes_to_the_client_unchanged(
    fleet: Fleet,
) -> None:
    fleet.router.ready = True
    activator, url = await fleet.start_activator(await fleet.start_router(), poll_idle_s=60.0)
    asked = fleet.router.readiness_asked
    async with aiohttp.ClientSession() as client:
        status, body, headers = await asyncio.wait_for(post(client, url + "/v1/overloaded", 0), 5)
    assert status == 503
    assert body == {"error": "overloaded"}
    assert headers["Retry-After"] == "2"
    assert headers["X-From-Router"] == "1"
    assert headers["Content-Type"].startswith("application/json")
    assert fleet.router.readiness_asked == asked + 1  # asked once, right after the 503
    assert fleet.router.seen == ["0"]  # sent once
    assert activator.ready
    values = await metric_values(url)
    expect_values(
        values,
        rehold_total=0,
        held_total=0,
        forwarded_total=1,
        requests_held=0,
        requests_in_flight=0,
    )


async def test_a_request_turned_away_past_max_wait_since_its_arrival_gets_the_503(
    fleet: Fleet,
) -> None:
    """maxWait counts from the request's arrival, not from its re-hold: the router's answer
    came 6 s (on the activator's clock, which stands still otherwise) after the request, past
    maxWait 5 s, so it expires at once."""
    clock = [1000.0]
    fleet.router.ready = True
    gate = fleet.router.gate = asyncio.Event()
    _, url = await fleet.start_activator(
        await fleet.start_router(),
        poll_idle_s=60.0,
        max_wait_s=5.0,
        retry_after_s=7.0,
        clock=lambda: clock[0],
    )
    fleet.router.leave_at_next_request = True
    async with aiohttp.ClientSession() as client:
        answer = asyncio.create_task(post(client, url + "/v1/completions", 0))
        await until(lambda: fleet.router.seen == ["0"])
        clock[0] += 6.0
        gate.set()
        status, body, headers = await asyncio.wait_for(answer, 5)
    assert status == 503
    assert headers["Retry-After"] == "7"
    assert body["error"]["type"] == "service_unavailable"
    assert body["error"]["message"] == (
        "pdfleet activator: ns/svc had no ready prefill/decode pair within maxWait 5s; retry later"
    )
    assert fleet.router.seen == ["0"]
    values = await metric_values(url)
    expect_values(
        values,
        rehold_total=1,
        expired_total=1,
        forwarded_total=0,
        requests_held=0,
        oldest_held_timestamp_seconds=0,
        requests_in_flight=0,
    )


async def test_a_client_that_leaves_while_held_again_is_not_sent_again(fleet: Fleet) -> None:
    fleet.router.ready = True
    activator, url = await fleet.start_activator(
        await fleet.start_router(), poll_idle_s=60.0, max_wait_s=20.0
    )
    fleet.router.leave_at_next_request = True
    async with aiohttp.ClientSession() as client:
        gone = asyncio.create_task(post(client, url + "/v1/completions", 0))
        await held(activator, 1)
        gone.cancel()
        await until(lambda: activator.queue.held == 0 and activator.activity.in_flight == 0)
        fleet.router.ready = True
        await until(lambda: activator.ready)
        status, _, _ = await post(client, url + "/v1/completions", 1)
    assert status == 200
    assert fleet.router.seen == ["0", "1"]
    values = await metric_values(url)
    expect_values(
        values,
        rehold_total=1,
        requests_held=0,
        oldest_held_timestamp_seconds=0,
    )


async def test_a_wait_cancelled_as_its_event_comes_is_cancelled() -> None:
    """The loops stop on shutdown: on Python 3.11, `asyncio.wait_for` returned the event's
    result and dropped a cancel that came in the same turn (a held request's handler, cancelled
    by the shutdown, kicks the dispatcher as the shutdown cancels it), and the dispatcher kept
    on turning, so the shutdown never ended."""
    event = asyncio.Event()
    waiting = asyncio.create_task(server._wait(event, 10.0))
    await asyncio.sleep(0)  # it waits
    event.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
