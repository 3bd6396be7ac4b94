"""`pdfleet-sim`: the simulator process (HTTP API, side channel, SIGTERM drain).

Where it fits: run wherever a vLLM 0.33 worker would run. It takes vLLM's own flags (unknown
ones are ignored with a warning, so the agent's `vllm serve` command line can be replayed
against it) plus simulator flags (--preset, --time-scale, --kv-bandwidth). One process is one
engine (DP=1): it serves the OpenAI API on --port, the KV side channel on
VLLM_NIXL_SIDE_CHANNEL_PORT and the simulated NIXL data plane on an ephemeral port, like a
vLLM instance with NixlConnector.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pdfleet_worker.perfmodel import PRESETS, PerfModel, preset
from pdfleet_worker.sim import openai
from pdfleet_worker.sim.engine import Engine, EngineConfig, Finished, KvPuller, Token
from pdfleet_worker.sim.engine import Request as EngineRequest
from pdfleet_worker.sim.kvparams import (
    MODEL_DTYPES,
    compatibility_hash,
    parse_remote_prefill,
    wants_remote_decode,
)
from pdfleet_worker.sim.metrics import CONTENT_TYPE, EngineMetrics, parse_histogram_buckets
from pdfleet_worker.sim.sidechannel import HttpKvPuller, data_plane_app, side_channel_app
from pdfleet_worker.sim.tokens import count_text_tokens

log = logging.getLogger("pdfleet.sim")

VLLM_VERSION = "0.33.0"
# What vLLM's engine client raises for a request that arrives while it shuts down (its
# executor is closed); the API server answers it as any unexpected error: HTTP 500.
SHUTDOWN_MESSAGE = "cannot schedule new futures after shutdown"
# vLLM's scale-out endpoints, answered 403 unless `vllm serve --enable-scale-out` (which the
# simulator does not model).
SCALE_OUT_PATHS = (
    "/v1/completions/render",
    "/v1/chat/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
    "/v1/completions/derender",
    "/v1/chat/completions/derender",
    "/inference/v1/generate",
)
SCALE_OUT_MESSAGE = (
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
)


class Sim:
    """The API of one simulated vLLM instance."""

    def __init__(
        self,
        engine: Engine,
        served_model_name: str,
        default_output_tokens: int,
        model_path: str | None = None,
    ):
        self.engine = engine
        self.model_name = served_model_name
        self.model_path = model_path or served_model_name
        self.default_output_tokens = default_output_tokens
        self.in_flight = 0
        self.created = int(time.time())
        c = engine.config
        self.fingerprint = openai.system_fingerprint(
            VLLM_VERSION, c.tp_size, f"{self.model_path}|{engine.model.name}|{c.max_model_len}"
        )

    # ----- plain endpoints ---------------------------------------------------------------

    async def health(self, _: Request) -> Response:
        # vLLM: 200 unless the engine is dead, also while draining.
        return Response(status_code=200)

    async def models(self, _: Request) -> JSONResponse:
        return JSONResponse(
            openai.model_list(
                self.model_name, self.model_path, self.engine.config.max_model_len, self.created
            )
        )

    async def metrics(self, _: Request) -> Response:
        return Response(self.engine.metrics.exposition(), media_type=CONTENT_TYPE)

    async def load(self, _: Request) -> JSONResponse:
        return JSONResponse({"server_load": self.in_flight})

    async def version(self, _: Request) -> JSONResponse:
        return JSONResponse({"version": VLLM_VERSION})

    async def tokenize(self, request: Request) -> JSONResponse:
        body = await _body(request)
        n = count_text_tokens(str(body.get("prompt", "")) if isinstance(body, dict) else "")
        return JSONResponse(
            {
                "count": n,
                "max_model_len": self.engine.config.max_model_len,
                "tokens": list(range(n)),
                "token_strs": None,
            }
        )

    async def scale_out_disabled(self, _: Request) -> JSONResponse:
        return _error(SCALE_OUT_MESSAGE, 403)

    async def stats(self, _: Request) -> JSONResponse:
        e = self.engine
        return JSONResponse(
            {
                **e.stats.as_dict(),
                "engine_id": e.config.engine_id,
                "running": len(e.running),
                "waiting": len(e.waiting),
                "held_now": len(e.held),
                "kv_free_blocks": e.pool.free,
                "kv_total_blocks": e.pool.num_blocks,
                "accepting": e.accepting,
                "in_flight_http": self.in_flight,
                "time_scale": e.config.time_scale,
            }
        )

    # ----- inference -----------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._generate("completion", request)

    async def chat(self, request: Request) -> Response:
        return await self._generate("chat", request)

    async def _generate(self, kind: openai.Kind, request: Request) -> Response:
        body = await _body(request)
        if body is _INVALID:
            return _error("invalid JSON body", 400)
        try:
            ask = openai.parse_request(kind, body, self.default_output_tokens)
        except openai.BadRequestError as err:
            return _error(str(err), 400)
        if ask.model and ask.model != self.model_name:
            return _error(f"The model `{ask.model}` does not exist.", 404)
        e = self.engine
        if not e.accepting:
            e.stats.rejected_draining += 1
            return _error(SHUTDOWN_MESSAGE, 500)
        why = e.validate(ask.prompt_tokens, ask.max_tokens)
        if why:
            return _error(why, 400)
        hold = wants_remote_decode(ask.kv_transfer_params)
        remote, invalid = parse_remote_prefill(ask.kv_transfer_params)
        if hold:
            e.stats.prefill_requests += 1
        elif invalid is not None:
            e.stats.recompute_invalid_params += 1
            log.warning(
                "Got invalid KVTransferParams: %s (%s). This request will not utilize KVTransfer",
                ask.kv_transfer_params,
                invalid,
            )
        elif remote is None:
            e.stats.plain_requests += 1
        response_id = openai.new_response_id(kind, request.headers.get("x-request-id"))
        req = e.submit(
            openai.engine_request_id(kind, response_id),
            ask.prompt_tokens,
            ask.max_tokens,
            ask.limit_reason,
            remote=remote,
            hold_for_remote_decode=hold,
        )
        if ask.stream:
            return StreamingResponse(
                self._stream(kind, ask, req, response_id), media_type="text/event-stream"
            )
        with self._counted():
            try:
                text, done = await _collect(req)
            except asyncio.CancelledError:
                e.abort(req)
                raise
        if done.reason == "error":
            return _error("KV transfer failed (kv_load_failure_policy=fail)", 500)
        return JSONResponse(
            openai.full_response(
                kind,
                response_id,
                self.model_name,
                text,
                done.reason,
                done.prompt_tokens,
                done.completion_tokens,
                done.kv_transfer_params,
                self.fingerprint,
            )
        )

    async def _stream(
        self, kind: openai.Kind, ask: openai.Ask, req: EngineRequest, response_id: str
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        first = True
        with self._counted():
            try:
                while True:
                    ev = await req.events.get()
                    if isinstance(ev, Token) and not ev.final:
                        yield openai.chunk(
                            kind, response_id, self.model_name, created, ev.text, first=first
                        )
                        first = False
                        continue
                    text = ev.text if isinstance(ev, Token) else ""
                    done = ev if isinstance(ev, Finished) else await _finished(req)
                    if done.reason == "error":
                        yield openai.sse(openai.error_body("KV transfer failed", 500))
                        break
                    yield openai.chunk(
                        kind,
                        response_id,
                        self.model_name,
                        created,
                        text,
                        finish=done.reason,
                        first=first,
                        kv_transfer_params=done.kv_transfer_params,
                    )
                    if ask.include_usage:
                        yield openai.usage_chunk(
                            kind,
                            response_id,
                            self.model_name,
                            created,
                            done.prompt_tokens,
                            done.completion_tokens,
                        )
                    break
                yield openai.DONE
            finally:
                # Client gone mid-stream (or stream over): free the request's blocks.
                self.engine.abort(req)

    @contextlib.contextmanager
    def _counted(self) -> Generator[None, None, None]:
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/load", self.load, methods=["GET"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/ping", self.health, methods=["GET", "POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/sim/stats", self.stats, methods=["GET"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                *(Route(p, self.scale_out_disabled, methods=["POST"]) for p in SCALE_OUT_PATHS),
            ]
        )


_INVALID = object()


async def _body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return _INVALID


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse(openai.error_body(message, status), status_code=status)


async def _finished(req: EngineRequest) -> Finished:
    while True:
        ev = await req.events.get()
        if isinstance(ev, Finished):
            return ev


async def _collect(req: EngineRequest) -> tuple[str, Finished]:
    parts: list[str] = []
    while True:
        ev = await req.events.get()
        if isinstance(ev, Token):
            parts.append(ev.text)
        else:
            return "".join(parts), ev


# ----- command line ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdfleet-sim",
        description="vLLM 0.33-faithful worker simulator (OpenAI API, metrics, NIXL P/D).",
    )
    p.add_argument("model_tag", nargs="?", help="model, as in `vllm serve MODEL`")
    p.add_argument("--model", help="model name (default: the positional MODEL)")
    p.add_argument("--served-model-name", help="name in the API and metrics labels")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--preset",
        default="llama-3.1-8b-h200",
        choices=sorted(PRESETS),
        help="latency/KV model (pdfleet_worker.perfmodel)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per simulated second (0.1 = 10x faster)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=0.0,
        help="on SIGTERM: 0 aborts in-flight requests; >0 drains up to this many wall seconds",
    )
    p.add_argument(
        "--kv-transfer-config", type=json.loads, default=None, help="vLLM KVTransferConfig JSON"
    )
    p.add_argument(
        "--kv-role",
        choices=["kv_producer", "kv_consumer", "kv_both"],
        help="shorthand for kv_transfer_config.kv_role",
    )
    p.add_argument(
        "--kv-bandwidth",
        type=float,
        default=50e9,
        help="KV transfer bandwidth in bytes/s (50e9 = one 400G NIC)",
    )
    p.add_argument(
        "--kv-lease-duration",
        type=float,
        default=None,
        help="seconds a prefill keeps unread KV (default: kv_connector_extra_config"
        ".kv_lease_duration or 30)",
    )
    p.add_argument(
        "--side-channel-host", default=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
    )
    p.add_argument(
        "--side-channel-port",
        type=int,
        default=int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")),
    )
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    # Modelled only in the NIXL compatibility hash, which refuses a prefill that differs.
    p.add_argument("--dtype", default="auto", choices=sorted(MODEL_DTYPES))
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--num-gpu-blocks-override", type=int)
    p.add_argument(
        "--custom-histogram-buckets",
        type=_histogram_buckets,
        default=None,
        help="JSON: bucket family -> bounds, replacing vLLM's defaults for that family",
    )
    p.add_argument(
        "--default-output-tokens",
        type=int,
        default=128,
        help="output length when a chat request sets no max_tokens",
    )
    p.add_argument("--log-level", default="warning")
    return p


def _histogram_buckets(text: str) -> dict[str, tuple[float, ...]]:
    try:
        return parse_histogram_buckets(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def model_from_args(args: argparse.Namespace) -> PerfModel:
    m = preset(args.preset)
    overrides: dict[str, Any] = {}
    if args.max_num_seqs:
        overrides["max_num_seqs"] = args.max_num_seqs
    if args.max_num_batched_tokens:
        overrides["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.block_size:
        overrides["block_size"] = args.block_size
    block = overrides.get("block_size", m.block_size)
    if args.num_gpu_blocks_override:
        overrides["kv_capacity_tokens"] = args.num_gpu_blocks_override * block
    elif args.block_size:
        overrides["kv_capacity_tokens"] = m.kv_capacity_tokens - m.kv_capacity_tokens % block
    return dataclasses.replace(m, **overrides) if overrides else m


def kv_role_from_args(args: argparse.Namespace) -> str | None:
    """The KV connector's role, None without a connector (then vLLM serves no `vllm:nixl_*`
    families). The simulator acts as prefill or decode per request whatever the role, as
    vLLM's `kv_both` does; the role only decides which metric families exist."""
    ktc = args.kv_transfer_config or {}
    role = args.kv_role or ktc.get("kv_role")
    return str(role) if role else ("kv_both" if ktc else None)


def cache_info(model: PerfModel, args: argparse.Namespace) -> dict[str, str]:
    """Labels of `vllm:cache_config_info`: the CacheConfig fields the simulator has (vLLM's
    page has more, renamed from release to release; nothing in pdfleet reads them)."""
    return {
        "block_size": str(model.block_size),
        "cache_dtype": args.kv_cache_dtype,
        "enable_prefix_caching": "False",
        "num_gpu_blocks": str(model.kv_capacity_blocks),
        "num_gpu_blocks_override": str(args.num_gpu_blocks_override),
    }


def config_from_args(
    args: argparse.Namespace, model_name: str, compat_hash: str = ""
) -> EngineConfig:
    ktc: dict[str, Any] = dict(args.kv_transfer_config or {})
    extra = ktc.get("kv_connector_extra_config") or {}
    lease = args.kv_lease_duration
    if lease is None:
        lease = float(extra.get("kv_lease_duration", 30.0))
    return EngineConfig(
        model_name=model_name,
        time_scale=args.time_scale,
        engine_id=str(ktc.get("engine_id") or uuid.uuid4()),
        side_channel_host=args.side_channel_host,
        side_channel_port=args.side_channel_port,
        tp_size=args.tensor_parallel_size,
        kv_bandwidth_bytes_per_s=args.kv_bandwidth,
        kv_load_failure_policy=str(ktc.get("kv_load_failure_policy", "fail")),
        kv_lease_s=lease,
        max_model_len=args.max_model_len,
        compat_hash=compat_hash,
        enforce_handshake_compat=bool(extra.get("enforce_handshake_compat", True)),
    )


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM/SIGINT to the simulator's drain logic."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def build_sim(args: argparse.Namespace, puller: KvPuller | None = None) -> Sim:
    """The API and engine a command line describes (its loop not started yet)."""
    model_path = args.model or args.model_tag
    model_name = args.served_model_name or model_path or "sim-model"
    model = model_from_args(args)
    metrics = EngineMetrics(
        model_name,
        max_model_len=args.max_model_len,
        kv_role=kv_role_from_args(args),
        cache_info=cache_info(model, args),
        histogram_buckets=args.custom_histogram_buckets,
    )
    compat = compatibility_hash(
        model_path or model_name, args.dtype, args.kv_cache_dtype, model.kv_bytes_per_token
    )
    config = config_from_args(args, model_name, compat)
    if isinstance(puller, HttpKvPuller) and config.enforce_handshake_compat:
        puller.compat_hash = config.compat_hash  # the decode compares the prefill's with its own
    engine = Engine(model, config, metrics, puller)
    return Sim(engine, model_name, args.default_output_tokens, model_path)


def _ephemeral_socket(host: str) -> socket.socket:
    """A TCP socket bound to a free port. The protocol is named: asyncio sets TCP_NODELAY
    only on sockets whose proto says TCP, and without it every answer waits out the peer's
    delayed ACK (about 40 ms a call)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind((host, 0))
    return sock


def _listener(app: Starlette, host: str, port: int, level: str) -> _QuietServer:
    return _QuietServer(
        uvicorn.Config(app, host=host, port=port, log_level=level, access_log=False, lifespan="off")
    )


async def serve(args: argparse.Namespace) -> int:
    if args.data_parallel_size != 1:
        log.warning("simulator runs one engine per process; --data-parallel-size ignored")
    puller = HttpKvPuller()
    sim = build_sim(args, puller)
    engine = sim.engine
    level = args.log_level.lower()
    # The data plane listens where UCX would: an ephemeral port, announced by the handshake.
    data_socket = _ephemeral_socket(args.host)
    bound, agent_port = data_socket.getsockname()[:2]
    # A wildcard bind is announced under the side channel's host, which the decode reached.
    agent_host = args.side_channel_host if bound in ("0.0.0.0", "::") else str(bound)
    api = _listener(sim.app(), args.host, args.port, level)
    side = _listener(
        side_channel_app(engine, agent_host, agent_port), args.host, args.side_channel_port, level
    )
    data = _listener(data_plane_app(engine), args.host, 0, level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine_task = loop.create_task(engine.run())
    servers = [
        loop.create_task(api.serve()),
        loop.create_task(side.serve()),
        loop.create_task(data.serve(sockets=[data_socket])),
    ]
    stopper = loop.create_task(stop.wait())
    done, _ = await asyncio.wait([*servers, stopper], return_when=asyncio.FIRST_COMPLETED)
    rc = 0
    if stopper in done:
        await drain(engine, args.shutdown_timeout)
    else:
        rc = 1  # a listener failed (e.g. port in use)
        stopper.cancel()
    api.should_exit = side.should_exit = data.should_exit = True
    engine_task.cancel()
    await asyncio.gather(*servers, engine_task, return_exceptions=True)
    await puller.aclose()
    return rc


async def drain(engine: Engine, timeout_s: float) -> None:
    """vLLM >= 0.18 --shutdown-timeout: stop accepting, finish in-flight work, then exit."""
    engine.stop_accepting()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not engine.has_work():
            break
        await asyncio.sleep(0.02)  # polled: work ends in the engine loop and the side channel
    for req in [*engine.running, *engine.waiting]:
        engine.abort(req)  # timeout 0 ("abort" mode) or drain timed out
    # Let handlers flush the final events of aborted requests.
    await asyncio.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if unknown:
        log.warning("ignoring vLLM flags the simulator does not model: %s", " ".join(unknown))
    sys.exit(asyncio.run(serve(args)))


if __name__ == "__main__":
    main()
