"""The simulator's stand-in for NIXL: a side channel for the handshake, a data plane for
READs and notifications, both small HTTP/JSON listeners.

Where it fits: vLLM's decode engine handshakes once per remote prefill engine over that
engine's ZMQ side channel (`remote_host:remote_port`, VLLM_NIXL_SIDE_CHANNEL_HOST/PORT),
which answers with its NIXL agent metadata; from then on it READs blocks one-sidedly over
NIXL (UCX, on ephemeral ports) with a completion notification that frees them on the
prefill, and renews leases with "HB:" notifications. The simulator keeps that topology:
every sim serves a side channel on its side-channel port and a data plane on an ephemeral
port, and a decode sim really calls the prefill sim named in the params, so a prefill that
holds blocks, a dead prefill or an expired lease behave as they would with vLLM, and a side
channel that goes away after the handshake changes nothing. As vLLM's, the handshake answer
carries the prefill's compatibility hash, and a decode whose own differs refuses it: no READ,
a failed transfer.

Side channel:
    POST /kv/handshake            -> {"engine_id", "agent": {"host", "port"}, "compatibility_hash"}
    GET  /kv/held                                   -> {"held": {id: {...}}}  (not vLLM's)
Data plane (the prefill engine's agent):
    POST /nixl/read      {"request_id", "block_ids"} -> {"num_blocks"} | 400 (no such block)
    POST /nixl/notify    {"request_id"}              -> {"released": bool}  (READ done)
    POST /nixl/heartbeat {"request_ids": [...]}      -> {"extended": n}     ("HB:" notif)
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


def side_channel_app(engine: Engine, agent_host: str, agent_port: int) -> Starlette:
    """The handshake listener of a prefill engine whose data plane is agent_host:agent_port."""

    async def handshake(_: Request) -> JSONResponse:
        c = engine.config
        agent = {"host": agent_host, "port": agent_port}
        return JSONResponse(
            {"engine_id": c.engine_id, "agent": agent, "compatibility_hash": c.compat_hash}
        )

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
            Route("/kv/handshake", handshake, methods=["POST"]),
            Route("/kv/held", held, methods=["GET"]),
        ]
    )


def data_plane_app(engine: Engine) -> Starlette:
    """What a decode reaches after the handshake: READs, their notifications, heartbeats."""

    async def read(request: Request) -> JSONResponse:
        body = await _json(request)
        blocks = body.get("block_ids")
        if not isinstance(blocks, list) or not all(isinstance(b, int) for b in blocks):
            return JSONResponse({"error": "block_ids must be a list of ints"}, status_code=400)
        try:
            n = engine.nixl_read(str(body.get("request_id")), blocks)
        except PullError as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse({"num_blocks": n})

    async def notify(request: Request) -> JSONResponse:
        body = await _json(request)
        return JSONResponse({"released": engine.nixl_notify(str(body.get("request_id")))})

    async def heartbeat(request: Request) -> JSONResponse:
        body = await _json(request)
        ids = body.get("request_ids")
        ids = [str(i) for i in ids] if isinstance(ids, list) else []
        return JSONResponse({"extended": engine.nixl_heartbeat(ids)})

    return Starlette(
        routes=[
            Route("/nixl/read", read, methods=["POST"]),
            Route("/nixl/notify", notify, methods=["POST"]),
            Route("/nixl/heartbeat", heartbeat, methods=["POST"]),
        ]
    )


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def incompatibility(local_hash: str | None, answer: dict[str, Any], engine_id: str) -> str | None:
    """Why a decode refuses a prefill's handshake answer (vLLM: _nixl_handshake, which raises
    before it decodes the agent metadata), or None. `local_hash` None compares nothing
    (enforce_handshake_compat false).

    An answer without a hash is refused even then: vLLM decodes the answer as a
    NixlHandshakePayload, whose compatibility_hash is required, so the payload of a connector
    from before the hash fails to decode and the handshake fails."""
    remote_hash = answer.get("compatibility_hash")
    if not isinstance(remote_hash, str):
        return (
            f"handshake answer of engine {engine_id} has no compatibility_hash: "
            "a NIXL connector of another version"
        )
    if local_hash is not None and remote_hash != local_hash:
        return (
            f"NIXL compatibility hash mismatch with engine {engine_id}. Local: {local_hash}, "
            f"Remote: {remote_hash}. Prefill and decode instances have incompatible "
            "configurations (model, dtype, KV cache dtype or shape)."
        )
    return None


def _url(host: str, port: int, path: str) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"http://{h}:{port}{path}"


# The data planes are uvicorn servers, which close a connection after 5 s idle (uvicorn's
# timeout_keep_alive); httpx keeps idle connections 5 s too, so a read could go out on a
# connection the server was closing and fail with ReadError, a lost request under `fail`.
# The puller lets idle connections go well before the server does.
_IDLE_CONNECTION_S = 2.0


class HttpKvPuller:
    """The decode side: handshakes once per remote engine id (as vLLM keys its remote
    agents), then reads, notifies and heartbeats on that engine's data plane. A refused
    handshake is not remembered: the next request to that engine handshakes again.

    `compat_hash` is the decode engine's own; `build_sim` sets it from the engine's config
    (None: no hash is compared)."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        compat_hash: str | None = None,
    ) -> None:
        self._client = httpx.AsyncClient(
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(keepalive_expiry=_IDLE_CONNECTION_S),
        )
        self.agents: dict[str, str] = {}  # remote engine id -> its data plane's base URL
        self.compat_hash = compat_hash

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        try:
            resp = await self._client.post(url, json=body)
        except httpx.HTTPError as err:
            raise PullError(f"{url} unreachable: {err!r}") from err
        if resp.status_code != 200:
            raise PullError(f"{url}: {resp.status_code} {resp.text}")
        return resp.json()

    async def _agent(self, remote: RemotePrefill) -> str:
        known = self.agents.get(remote.engine_id)
        if known is not None:
            return known  # the side channel is not dialled again
        if remote.host is None or remote.port is None:
            raise PullError(f"no side channel to handshake with engine {remote.engine_id}")
        body = await self._post(_url(remote.host, remote.port, "/kv/handshake"), {})
        try:
            engine_id, agent = body["engine_id"], body["agent"]
            url = _url(str(agent["host"]), int(agent["port"]), "")
        except (KeyError, TypeError, ValueError) as err:
            raise PullError(f"malformed handshake answer {body!r}") from err
        why = incompatibility(self.compat_hash, body, remote.engine_id)
        if why is not None:
            raise PullError(why)
        if engine_id != remote.engine_id:
            raise PullError(f"remote engine id {engine_id} is not {remote.engine_id}")
        self.agents[remote.engine_id] = url
        return url

    async def read(self, remote: RemotePrefill) -> None:
        agent = await self._agent(remote)
        body = {"request_id": remote.request_id, "block_ids": list(remote.block_ids)}
        await self._post(f"{agent}/nixl/read", body)

    async def notify(self, remote: RemotePrefill) -> None:
        agent = await self._agent(remote)
        await self._post(f"{agent}/nixl/notify", {"request_id": remote.request_id})

    async def heartbeat(self, remote: RemotePrefill, request_ids: list[str]) -> None:
        agent = await self._agent(remote)  # a proactive handshake, as vLLM's heartbeat does
        await self._post(f"{agent}/nixl/heartbeat", {"request_ids": request_ids})

    async def aclose(self) -> None:
        await self._client.aclose()
