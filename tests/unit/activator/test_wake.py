"""The wake signal through the real kubernetes client, against a stand-in API server on
127.0.0.1: one merge patch of one annotation, in a thread, and the API server's refusal raised
to the caller (the activator's wake task counts it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from pdfleet import labels
from pdfleet.activator.wake import AnnotationWake, wake_patch
from pdfleet.kube.errors import APIError

MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
PATH = "/apis/pdfleet.dev/v1alpha1/namespaces/ns/inferenceservices/svc"


class APIServer:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.status = 200

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type"),
                "body": await request.json(),
            }
        )
        if self.status != 200:
            return web.json_response(
                {"kind": "Status", "message": 'inferenceservices "svc" not found'},
                status=self.status,
            )
        return web.json_response({"metadata": {"name": "svc"}})


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[APIServer, client.ApiClient]]:
    fake = APIServer()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    api = client.ApiClient(configuration)
    try:
        yield fake, api
    finally:
        api.close()  # type: ignore[no-untyped-call]
        await server.close()


def test_the_patch_sets_only_the_annotation_in_rfc3339() -> None:
    assert wake_patch(MOMENT) == {
        "metadata": {"annotations": {"pdfleet.dev/wake-requested": "2026-01-02T03:04:05.678Z"}}
    }
    assert labels.WAKE_REQUESTED == "pdfleet.dev/wake-requested"


async def test_wake_merge_patches_the_inference_service(
    api_server: tuple[APIServer, client.ApiClient],
) -> None:
    fake, api = api_server
    wake = AnnotationWake(api, "ns", "svc", now=lambda: MOMENT)
    # The stand-in API server runs on this event loop: the patch can only get its answer if
    # it runs in another thread, leaving the loop free.
    await asyncio.wait_for(wake(), 10)
    assert fake.seen == [
        {
            "method": "PATCH",
            "path": PATH,
            "query": {"fieldManager": "pdfleet-activator"},
            "content_type": "application/merge-patch+json",
            "body": json.loads(json.dumps(wake_patch(MOMENT))),
        }
    ]


async def test_a_refusal_is_raised_as_an_api_error(
    api_server: tuple[APIServer, client.ApiClient],
) -> None:
    fake, api = api_server
    fake.status = 404
    with pytest.raises(APIError) as raised:
        await asyncio.wait_for(AnnotationWake(api, "ns", "svc", now=lambda: MOMENT)(), 10)
    assert raised.value.status == 404
    assert raised.value.message == 'inferenceservices "svc" not found'
