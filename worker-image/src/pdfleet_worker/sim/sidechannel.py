"""The simulator's stand-in for the NIXL side channel and READ: a small HTTP/JSON listener.

Where it fits: vLLM's decode engine contacts the prefill engine at `remote_host:remote_port`
(the ZMQ side channel, VLLM_NIXL_SIDE_CHANNEL_HOST/PORT) and then READs the blocks over
NIXL, notifying the prefill when done. The simulator keeps that topology: every sim listens on
its side-channel port, and a decode sim really calls the prefill sim named in the params, so a
prefill that holds blocks, a dead prefill or an expired lease behave as they would with vLLM.

    POST /kv/read       {"engine_id", "request_id"}  -> {"num_tokens", "num_blocks"} | 404
    POST /kv/release    {"request_id"}               -> {"released": bool}   (the READ notif)
    POST /kv/heartbeat  {"request_ids": [...]}       -> {"extended": n}      ("HB:" notif)
    GET  /kv/held                                    -> {"held": {id: {...}}}
"""

from __future__ import annotations

from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pdfleet_worker.sim.engine import Engine, PullError
from pdfleet_worker.sim.kvparams import RemotePrefill


def side_channel_app(engine: Engine) -> Starlette:
    async def read(request: Request) -> JSONResponse:
        body = await _json(request)
        try:
            held = engine.kv_read(str(body.get("engine_id")), str(body.get("request_id")))
        except PullError as err:
            return JSONResponse({"error": str(err)}, status_code=404)
        return JSONResponse({"num_tokens": held.num_tokens, "num_blocks": len(held.blocks)})

    async def release(request: Request) -> JSONResponse:
        body = await _json(request)
        return JSONResponse({"released": engine.kv_release(str(body.get("request_id")))})

    async def heartbeat(request: Request) -> JSONResponse:
        body = await _json(request)
        ids = body.get("request_ids")
        ids = [str(i) for i in ids] if isinstance(ids, list) else []
        return JSONResponse({"extended": engine.kv_heartbeat(ids)})

    async def held(_: Request) -> JSONResponse:
        now = engine.now()
        return JSONResponse(
            {
                "held": {
                    rid: {
                        "num_tokens": h.num_tokens,
                        "num_blocks": len(h.blocks),
                        "expires_in": round(h.expires_at - now, 3),
                        "reading": h.reading,
                    }
                    for rid, h in engine.held.items()
                }
            }
        )

    return Starlette(
        routes=[
            Route("/kv/read", read, methods=["POST"]),
            Route("/kv/release", release, methods=["POST"]),
            Route("/kv/heartbeat", heartbeat, methods=["POST"]),
            Route("/kv/held", held, methods=["GET"]),
        ]
    )


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class HttpKvPuller:
    """The decode side: reads, releases and heartbeats against the prefill's side channel."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self._client = httpx.AsyncClient(timeout=timeout_s)

    @staticmethod
    def _url(host: str, port: int, path: str) -> str:
        h = f"[{host}]" if ":" in host else host
        return f"http://{h}:{port}{path}"

    async def _post(self, host: str, port: int, path: str, body: dict[str, Any]) -> Any:
        try:
            resp = await self._client.post(self._url(host, port, path), json=body)
        except httpx.HTTPError as err:
            raise PullError(f"side channel {host}:{port} unreachable: {err!r}") from err
        if resp.status_code != 200:
            raise PullError(f"side channel {host}:{port}{path}: {resp.status_code} {resp.text}")
        return resp.json()

    async def read(self, remote: RemotePrefill, requester: str) -> int:
        body = await self._post(
            remote.host,
            remote.port,
            "/kv/read",
            {
                "engine_id": remote.engine_id,
                "request_id": remote.request_id,
                "requester": requester,
            },
        )
        return int(body["num_tokens"])

    async def release(self, remote: RemotePrefill) -> None:
        await self._post(remote.host, remote.port, "/kv/release", {"request_id": remote.request_id})

    async def heartbeat(self, host: str, port: int, request_ids: list[str]) -> None:
        await self._post(host, port, "/kv/heartbeat", {"request_ids": request_ids})

    async def aclose(self) -> None:
        await self._client.aclose()
