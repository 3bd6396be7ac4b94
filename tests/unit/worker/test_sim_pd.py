"""What a decode simulator does with the kv_transfer_params it is given, as vLLM 0.33's pull
decode does: which params it trusts, that it reads the given blocks one-sidedly (a stale
request id is read all the same), that it dials the prefill's side channel once per remote
engine, that it refuses a prefill whose compatibility hash differs from its own, and what a
failed transfer does under each kv_load_failure_policy. A prefill and a decode run in process,
joined by an in-memory network instead of sockets."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from pdfleet_worker.sim.engine import KvState, Request, heartbeat_batches
from pdfleet_worker.sim.kvparams import RemotePrefill, parse_remote_prefill
from pdfleet_worker.sim.server import Sim
from pdfleet_worker.sim.sidechannel import (
    HttpKvPuller,
    data_plane_app,
    incompatibility,
    side_channel_app,
)

if TYPE_CHECKING:
    from tests.unit.worker.conftest import InProcess

SIDE_CHANNEL = ("10.0.0.1", 5600)
AGENT = ("10.0.0.1", 41234)  # the prefill's data plane, an ephemeral port as UCX's
PROMPT = "the prefill computes and the decode loads its cache blocks"  # 10 tokens
# A lease far longer than any test: nothing here expires unless a test says so.
COMMON = ["llama", "--served-model-name", "m", "--time-scale", "0.01"]
COMMON += ["--kv-lease-duration", "1000"]


def _ktc(role: str, **extra: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, **extra})


PREFILL = [
    *COMMON,
    *("--side-channel-host", SIDE_CHANNEL[0], "--side-channel-port", str(SIDE_CHANNEL[1])),
    *("--kv-transfer-config", _ktc("kv_producer", engine_id="prefill-a")),
]


class Network(httpx.AsyncBaseTransport):
    """The pod network, in memory: ASGI apps by host and port; an address where nothing
    listens refuses the connection."""

    def __init__(self) -> None:
        self.listeners: dict[tuple[str, int], httpx.ASGITransport] = {}

    def listen(self, address: tuple[str, int], app: Starlette) -> None:
        self.listeners[address] = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        listener = self.listeners.get((request.url.host, request.url.port or 80))
        if listener is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await listener.handle_async_request(request)


@dataclass
class Pair:
    network: Network
    prefill: Sim
    prefill_client: httpx.AsyncClient
    decode_sim: Sim
    decode_client: httpx.AsyncClient

    async def prefill_params(self) -> dict[str, Any]:
        ask = {"do_remote_decode": True}
        body = {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": ask}
        r = await self.prefill_client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        params: dict[str, Any] = r.json()["kv_transfer_params"]
        return params

    async def decode(self, params: dict[str, Any]) -> tuple[int, str]:
        """(status, where the decode's prompt came from), as e2e/scenarios/differential.py tells."""
        before = await by_source(self.decode_client)
        body = {"prompt": PROMPT, "max_tokens": 4, "kv_transfer_params": params}
        r = await self.decode_client.post("/v1/completions", json=body)
        after = await by_source(self.decode_client)
        moved = {k: v - before[k] for k, v in after.items() if v > before[k]}
        return r.status_code, max(moved, key=lambda k: moved[k]) if moved else "none"


async def metric(client: httpx.AsyncClient, sample: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )


async def by_source(client: httpx.AsyncClient) -> dict[str, float]:
    sources = ("local_compute", "local_cache_hit", "external_kv_transfer")
    name = "vllm:prompt_tokens_by_source_total"
    return {s: await metric(client, name, source=s) for s in sources}


async def start_pair(
    sims: InProcess, policy: str = "fail", decode_flags: Sequence[str] = ()
) -> Pair:
    network = Network()
    prefill, prefill_client = await sims.start(PREFILL)
    network.listen(SIDE_CHANNEL, side_channel_app(prefill.engine, *AGENT))
    network.listen(AGENT, data_plane_app(prefill.engine))
    config = _ktc("kv_consumer", kv_load_failure_policy=policy)
    decode_sim, decode_client = await sims.start(
        [*COMMON, "--kv-transfer-config", config, *decode_flags], HttpKvPuller(transport=network)
    )
    return Pair(network, prefill, prefill_client, decode_sim, decode_client)


def _without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda p: {k: v for k, v in p.items() if k != key}


def _with(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda p: {**p, **changes}


LOADED = (200, "external_kv_transfer")
COMPUTED = (200, "local_compute")
FAILED = (500, "none")  # kv_load_failure_policy=fail: the request errors


class Case(NamedTuple):
    name: str
    change: Callable[[dict[str, Any]], dict[str, Any]]  # of the prefill's params
    outcome: tuple[int, str]
    policy: str = "fail"
    handshake_first: bool = False  # one good P/D before, so the engine id is known
    gone: tuple[tuple[str, int], ...] = ()  # listeners of the prefill gone when it comes
    failed_transfers: int = 0


TRANSFER_FAILED: dict[str, Any] = {"outcome": FAILED, "failed_transfers": 1}
RECOMPUTED: dict[str, Any] = {"outcome": COMPUTED, "policy": "recompute", "failed_transfers": 1}
NO_SIDE_CHANNEL: dict[str, Any] = {"change": _with(), "gone": (SIDE_CHANNEL,)}
NO_SUCH_BLOCK: dict[str, Any] = {"change": _with(remote_block_ids=[[10**9]])}
DECODE_CASES = [
    Case("valid", _with(), LOADED),
    Case("without tp_size", _without("tp_size"), LOADED),
    Case("stale request id", _with(remote_request_id="cmpl-stale-0-00000000"), LOADED),
    Case(
        "host, port None", _with(remote_host=None, remote_port=None), LOADED, handshake_first=True
    ),
    Case(
        "side channel gone after a handshake",
        **NO_SIDE_CHANNEL,
        outcome=LOADED,
        handshake_first=True,
    ),
    Case(
        "prefill gone after a handshake",
        _with(),
        handshake_first=True,
        gone=(SIDE_CHANNEL, AGENT),
        **TRANSFER_FAILED,
    ),
    Case("side channel gone, no handshake", **NO_SIDE_CHANNEL, **TRANSFER_FAILED),
    Case("side channel gone, no handshake", **NO_SIDE_CHANNEL, **RECOMPUTED),
    Case("host None, no handshake", _with(remote_host=None), **TRANSFER_FAILED),
    Case("another engine id", _with(remote_engine_id="prefill-b"), **RECOMPUTED),
    Case("block ids the prefill lacks", **NO_SUCH_BLOCK, **TRANSFER_FAILED),
    Case("block ids the prefill lacks", **NO_SUCH_BLOCK, **RECOMPUTED),
    # Params vLLM does not trust: computed here, no transfer tried.
    Case("without remote_request_id", _without("remote_request_id"), COMPUTED),
    Case("without remote_port", _without("remote_port"), COMPUTED),
    Case("empty block ids", _with(remote_block_ids=[]), COMPUTED),
    Case("do_remote_prefill false", _with(do_remote_prefill=False), COMPUTED),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=[f"{c.name} ({c.policy})" for c in DECODE_CASES])
async def test_what_a_decode_does_with_its_kv_transfer_params(sims: InProcess, case: Case) -> None:
    pair = await start_pair(sims, case.policy)
    if case.handshake_first:
        assert await pair.decode(await pair.prefill_params()) == LOADED
    for address in case.gone:
        del pair.network.listeners[address]
    assert await pair.decode(case.change(await pair.prefill_params())) == case.outcome
    failed = await metric(pair.decode_client, "vllm:nixl_num_failed_transfers_total")
    assert failed == case.failed_transfers


async def test_a_stale_id_reads_the_blocks_and_the_prefill_counts_a_late_notification(
    sims: InProcess,
) -> None:
    pair = await start_pair(sims)
    params = await pair.prefill_params()
    stale = {**params, "remote_request_id": "cmpl-stale-0-00000000"}
    assert await pair.decode(stale) == LOADED
    # The READ's notification names a request the prefill does not hold: counted as after
    # expiry, and the request it does hold stays held until read or expired.
    after_expiry = "vllm:nixl_num_notifications_after_expiry_total"
    assert await metric(pair.prefill_client, after_expiry) == 1
    rid = params["remote_request_id"]
    async with httpx.AsyncClient(transport=pair.network, base_url="http://10.0.0.1:5600") as side:
        held = (await side.get("/kv/held")).json()["held"]
        assert list(held) == [rid] and held[rid]["num_blocks"] == 1
        # Held blocks are in use until the READ's notification frees them.
        assert await metric(pair.prefill_client, "vllm:kv_cache_usage_perc") > 0
        assert await pair.decode(params) == LOADED
        assert (await side.get("/kv/held")).json() == {"held": {}}
    assert await metric(pair.prefill_client, "vllm:kv_cache_usage_perc") == 0
    assert pair.prefill.engine.stats.kv_served_reads == 2
    assert pair.prefill.engine.stats.kv_released == 1


async def test_a_decode_counts_each_transfer_as_nixl_does(sims: InProcess) -> None:
    pair = await start_pair(sims)
    params = await pair.prefill_params()
    assert await pair.decode(params) == LOADED
    d = pair.decode_client
    blocks = len(params["remote_block_ids"][0])  # 10 tokens: one 16-token block
    bytes_per_block = 16 * pair.prefill.engine.model.kv_bytes_per_token
    for histogram in ("xfer_time_seconds", "post_time_seconds", "bytes_transferred"):
        assert await metric(d, f"vllm:nixl_{histogram}_count") == 1
    assert await metric(d, "vllm:nixl_num_descriptors_sum") == blocks == 1
    assert await metric(d, "vllm:nixl_bytes_transferred_sum") == blocks * bytes_per_block
    # The transfer lasts what the latency model says for the prompt at --kv-bandwidth.
    modelled = pair.prefill.engine.model.kv_transfer_seconds(10, 50e9)
    assert await metric(d, "vllm:nixl_xfer_time_seconds_sum") == pytest.approx(modelled)
    # Every prompt token came from the prefill: a p2p cache hit of the KV connector.
    tokens = 10
    assert await metric(d, "vllm:external_prefix_cache_hits_total") == tokens
    assert await metric(d, "vllm:prompt_tokens_cached_by_source_total", source="p2p") == tokens
    assert await metric(d, "vllm:prompt_tokens_cached_total") == tokens


# (params, trusted, heartbeats): vLLM's pull scheduler trusts params whose block ids are
# non-empty and that have the four remote keys (a None value counts); tp_size only decides
# whether the decode heartbeats the prefill's lease.
VALID = {
    "do_remote_prefill": True,
    "remote_block_ids": [[3, 4]],
    "remote_engine_id": "e",
    "remote_request_id": "cmpl-x-0-12345678",
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}
PARAMS_CASES = [
    ("complete", VALID, True, True),
    ("tp_size missing", _without("tp_size")(VALID), True, False),
    ("tp_size None", _with(tp_size=None)(VALID), True, False),
    ("remote_host None", _with(remote_host=None)(VALID), True, False),
    ("flat block ids (0.11)", _with(remote_block_ids=[3, 4])(VALID), True, True),
    ("remote_engine_id missing", _without("remote_engine_id")(VALID), False, False),
    ("block ids empty", _with(remote_block_ids=[[]])(VALID), False, False),
    ("block ids not ints", _with(remote_block_ids=[["3"]])(VALID), False, False),
]


@pytest.mark.parametrize(
    ("params", "trusted", "heartbeats"),
    [case[1:] for case in PARAMS_CASES],
    ids=[case[0] for case in PARAMS_CASES],
)
def test_which_params_a_decode_trusts(params: Any, trusted: bool, heartbeats: bool) -> None:
    remote, why = parse_remote_prefill(params)
    assert (remote is not None, why is None) == (trusted, trusted)
    if remote is not None:
        assert remote.block_ids == (3, 4) and remote.heartbeat == heartbeats


def _waiting(name: str, engine_id: str, state: KvState, heartbeat: bool = True) -> Request:
    remote = RemotePrefill(engine_id, f"p-{name}", "10.0.0.1", 5600, (0,), heartbeat)
    return Request(name, 10, 1, "length", 0.0, remote=remote, kv_state=state)


def test_heartbeats_go_once_per_remote_engine_for_kv_still_to_read() -> None:
    waiting = [
        _waiting("a", "e1", "pending"),
        _waiting("b", "e1", "transferring"),
        _waiting("c", "e2", "pending"),
        _waiting("d", "e2", "ready"),  # read already
        _waiting("e", "e3", "pending", heartbeat=False),  # params without tp_size
    ]
    batches = heartbeat_batches(waiting)
    assert {engine: ids for engine, (_, ids) in batches.items()} == {
        "e1": ["p-a", "p-b"],
        "e2": ["p-c"],
    }


async def test_a_heartbeat_extends_the_lease_of_the_kv_a_prefill_holds(sims: InProcess) -> None:
    pair = await start_pair(sims)
    params = await pair.prefill_params()
    remote, _ = parse_remote_prefill(params)
    assert remote is not None
    held = pair.prefill.engine.held[remote.request_id]
    lease_end = held.expires_at
    puller = HttpKvPuller(transport=pair.network)
    await puller.heartbeat(remote, [remote.request_id, "gone"])
    await puller.aclose()
    assert held.expires_at > lease_end


# ----- the compatibility hash of the handshake ----------------------------------------------

FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers_total"
# (decode flags besides the prefill's, outcome): vLLM hashes the model `vllm serve` loaded, its
# dtype, the KV cache dtype and the KV shape; not the served name, nor the block size (checked
# after the handshake, where P and D may differ).
PAIRINGS = [
    ("same launch", (), LOADED),
    ("another served name", ("--served-model-name", "n"), LOADED),
    ("another block size", ("--block-size", "32"), LOADED),
    ("dtype bfloat16, the prefill's auto", ("--dtype", "bfloat16"), LOADED),
    ("another model", ("--model", "other-llama"), FAILED),
    ("another KV shape", ("--preset", "llama-3.1-70b-h200-tp4"), FAILED),
    ("another KV cache dtype", ("--kv-cache-dtype", "fp8"), FAILED),
    ("another dtype", ("--dtype", "float16"), FAILED),
]


@pytest.mark.parametrize(
    ("decode_flags", "outcome"), [p[1:] for p in PAIRINGS], ids=[p[0] for p in PAIRINGS]
)
async def test_a_decode_reads_only_from_a_prefill_with_its_compatibility_hash(
    sims: InProcess, decode_flags: tuple[str, ...], outcome: tuple[int, str]
) -> None:
    pair = await start_pair(sims, decode_flags=decode_flags)
    assert await pair.decode(await pair.prefill_params()) == outcome
    refused = outcome == FAILED
    assert await metric(pair.decode_client, FAILED_TRANSFERS) == refused
    # Refused at the handshake: not a block of the prefill was read.
    assert pair.prefill.engine.stats.kv_served_reads == (not refused)


async def test_a_refused_prefill_is_handshaken_again_and_recomputed_each_time(
    sims: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    pair = await start_pair(sims, "recompute", ("--model", "other-llama"))
    with caplog.at_level(logging.WARNING, logger="pdfleet.sim.engine"):
        for _ in range(2):
            assert await pair.decode(await pair.prefill_params()) == COMPUTED
    assert await metric(pair.decode_client, FAILED_TRANSFERS) == 2
    assert pair.prefill.engine.stats.kv_served_reads == 0
    local, remote = (
        pair.decode_sim.engine.config.compat_hash,
        pair.prefill.engine.config.compat_hash,
    )
    assert local != remote
    # One warning line per refused request, naming the remote engine and both hashes.
    lines = [r.getMessage() for r in caplog.records if r.name == "pdfleet.sim.engine"]
    assert len(lines) == 2
    assert all(f"engine prefill-a. Local: {local}, Remote: {remote}." in line for line in lines)


def _consumer(**extra: Any) -> tuple[str, str]:
    return ("--kv-transfer-config", json.dumps({"kv_role": "kv_consumer", **extra}))


async def test_enforce_handshake_compat_false_reads_from_another_model(sims: InProcess) -> None:
    no_check = _consumer(kv_connector_extra_config={"enforce_handshake_compat": False})
    pair = await start_pair(sims, decode_flags=("--model", "other-llama", *no_check))
    assert await pair.decode(await pair.prefill_params()) == LOADED


def _hashless_side_channel() -> Starlette:
    """A prefill whose connector predates the hash: its answer has none."""

    async def handshake(_: HttpRequest) -> JSONResponse:
        agent = {"host": AGENT[0], "port": AGENT[1]}
        return JSONResponse({"engine_id": "prefill-a", "agent": agent})

    return Starlette(routes=[Route("/kv/handshake", handshake, methods=["POST"])])


@pytest.mark.parametrize("enforce", [True, False])
async def test_a_handshake_answer_without_a_hash_is_refused(sims: InProcess, enforce: bool) -> None:
    flags = _consumer(kv_connector_extra_config={"enforce_handshake_compat": enforce})
    pair = await start_pair(sims, decode_flags=flags)
    pair.network.listen(SIDE_CHANNEL, _hashless_side_channel())
    assert await pair.decode(await pair.prefill_params()) == FAILED
    assert await metric(pair.decode_client, FAILED_TRANSFERS) == 1
    assert pair.prefill.engine.stats.kv_served_reads == 0


def test_incompatibility_names_both_hashes_and_the_engine() -> None:
    assert incompatibility("h1", {"compatibility_hash": "h1"}, "p") is None
    assert incompatibility(None, {"compatibility_hash": "h2"}, "p") is None
    why = incompatibility("h1", {"compatibility_hash": "h2"}, "p")
    assert why is not None and "engine p" in why and "h1" in why and "h2" in why
    assert incompatibility(None, {}, "p") is not None
