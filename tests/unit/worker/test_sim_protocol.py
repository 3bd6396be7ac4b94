"""The simulator's wire protocol against vLLM 0.33 (dataplane.md): the prefill's
`kv_transfer_params`, /metrics and /v1/models, in process; its NIXL P/D edge cases and
SIGTERM drain, against real processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import wait_until
from pdfleet.autoscale import promql
from pdfleet_worker.sim.procs import SimProc, start_sim
from pdfleet_worker.sim.server import build_parser, build_sim

FAST = ["--preset", "llama-3.1-8b-h200", "--time-scale", "0.1"]
MODEL_PATH = "meta-llama/Llama-3.1-8B-Instruct"
SERVED = "llama-8b"


@contextlib.asynccontextmanager
async def in_process(extra: Sequence[str] = ()) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the simulator that `pdfleet-sim MODEL_PATH ...` would run, with its
    engine loop on this event loop and no sockets."""
    args = build_parser().parse_args(
        [MODEL_PATH, "--served-model-name", SERVED, "--time-scale", "0.01", *extra]
    )
    sim = build_sim(args)
    stepping = asyncio.create_task(sim.engine.run())
    transport = httpx.ASGITransport(app=sim.app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            yield client
    finally:
        stepping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stepping


# ----- the prefill's kv_transfer_params ----------------------------------------------------

# What vllm-router (and vLLM's toy proxy) put in the prefill request.
ROUTER_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# The fields and types of 0.33 NixlPullConnectorScheduler.request_finished (dataplane.md 1.3).
PREFILL_RESPONSE_TYPES: dict[str, type] = {
    "do_remote_prefill": bool,
    "do_remote_decode": bool,
    "remote_block_ids": list,
    "remote_engine_id": str,
    "remote_request_id": str,
    "remote_host": str,
    "remote_port": int,
    "tp_size": int,
    "dcp_size": int,
    "pp_size": int,
    "remote_num_tokens": int,
    "remote_blocks_expiry_time": type(None),
    "remote_registration_generation": int,
    "transfer_mode": str,
}
PREFILL_WORKER = [
    "--tensor-parallel-size",
    "2",
    "--side-channel-host",
    "10.244.1.7",
    "--side-channel-port",
    "5601",
    "--kv-transfer-config",
    '{"kv_connector":"NixlConnector","kv_role":"kv_producer","engine_id":"prefill-a"}',
]


def _assert_prefill_params(params: Any, prompt_tokens: int, request_id: str) -> None:
    assert isinstance(params, dict)
    assert {k: type(v) for k, v in params.items()} == PREFILL_RESPONSE_TYPES
    blocks = params.pop("remote_block_ids")
    # 0.20+: one list of block ids per KV-cache group; Llama has one group (full attention).
    assert len(blocks) == 1 and all(type(b) is int for b in blocks[0]), blocks
    assert len(set(blocks[0])) == len(blocks[0]) == -(-prompt_tokens // 16)  # 16-token blocks
    # The P-side internal id: the response id plus vLLM's "-<8 hex>" suffix.
    assert re.fullmatch(rf"{re.escape(request_id)}-[0-9a-f]{{8}}", params.pop("remote_request_id"))
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-a",
        "remote_host": "10.244.1.7",  # VLLM_NIXL_SIDE_CHANNEL_HOST
        "remote_port": 5601,  # VLLM_NIXL_SIDE_CHANNEL_PORT + DP index 0
        "tp_size": 2,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": prompt_tokens,
        "remote_blocks_expiry_time": None,
        "remote_registration_generation": 1,
        "transfer_mode": "pull",
    }


async def test_prefill_response_carries_vllm_033_kv_transfer_params() -> None:
    prompts = {
        "/v1/completions": {"prompt": list(range(100))},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi " * 40}]},
    }
    async with in_process(PREFILL_WORKER) as client:
        for path, prompt in prompts.items():
            body = {"model": SERVED, **prompt, "max_tokens": 1, "stream": False}
            r = await client.post(
                path,
                headers={"X-Request-Id": "r1"},
                json={**body, "kv_transfer_params": ROUTER_PREFILL_PARAMS},
            )
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["choices"][0]["finish_reason"] == "length"  # max_tokens=1
            assert out["id"] == ("cmpl-r1" if path == "/v1/completions" else "chatcmpl-r1")
            tokens = out["usage"]["prompt_tokens"]
            _assert_prefill_params(out["kv_transfer_params"], tokens, out["id"])
        # Streaming: the params ride on the final chunk only.
        r = await client.post(
            "/v1/completions",
            headers={"X-Request-Id": "r2"},
            json={
                "model": SERVED,
                "prompt": list(range(100)),
                "max_tokens": 1,
                "stream": True,
                "kv_transfer_params": ROUTER_PREFILL_PARAMS,
            },
        )
        lines = r.text.splitlines()
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert ["kv_transfer_params" in c for c in chunks] == [False] * (len(chunks) - 1) + [True]
        _assert_prefill_params(chunks[-1]["kv_transfer_params"], 100, "cmpl-r2")
        # A plain request (no do_remote_decode) gets no params: its blocks are freed.
        r = await client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 1})
        assert r.json()["kv_transfer_params"] is None


# ----- /metrics and /v1/models ------------------------------------------------------------

# vLLM's bucket boundaries (v1/metrics/buckets.py, dataplane.md 2), written out here rather
# than read from the simulator so that a wrong boundary there fails.
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
# The 1-2-5 series up to --max-model-len 4096.
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
# vLLM 0.33's metrics as registered (counters gain `_total` on the wire), with the bucket
# boundaries of each histogram; None where dataplane.md gives none.
VLLM_033_METRICS: dict[str, tuple[str, tuple[float, ...] | None]] = {
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:num_requests_waiting_by_reason": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:prefix_cache_queries": ("counter", None),
    "vllm:prefix_cache_hits": ("counter", None),
    "vllm:external_prefix_cache_queries": ("counter", None),
    "vllm:external_prefix_cache_hits": ("counter", None),
    "vllm:num_preemptions": ("counter", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:request_success": ("counter", None),
    "vllm:request_prompt_tokens": ("histogram", TOKEN_BUCKETS),
    "vllm:request_generation_tokens": ("histogram", TOKEN_BUCKETS),
    "vllm:request_params_max_tokens": ("histogram", TOKEN_BUCKETS),
    "vllm:request_max_num_generation_tokens": ("histogram", TOKEN_BUCKETS),
    "vllm:iteration_tokens_total": (
        "histogram",
        (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0),
    ),
    "vllm:request_params_n": ("histogram", (1.0, 2.0, 5.0, 10.0, 20.0)),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": ("histogram", ITL_BUCKETS),
    "vllm:request_time_per_output_token_seconds": ("histogram", ITL_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("histogram", LATENCY_BUCKETS),
    "vllm:request_queue_time_seconds": ("histogram", LATENCY_BUCKETS),
    "vllm:request_inference_time_seconds": ("histogram", LATENCY_BUCKETS),
    "vllm:request_prefill_time_seconds": ("histogram", LATENCY_BUCKETS),
    "vllm:request_decode_time_seconds": ("histogram", LATENCY_BUCKETS),
    "vllm:request_num_preemptions": ("histogram", (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)),
    # NixlConnector (nixl/stats.py): bytes buckets 2^(10+i), i = 1, 3, ..., 23. dataplane.md
    # names these; the types are those of vLLM's metrics docs (NIXL KV Connector Metrics).
    "vllm:nixl_xfer_time_seconds": ("histogram", None),
    "vllm:nixl_post_time_seconds": ("histogram", None),
    "vllm:nixl_bytes_transferred": ("histogram", tuple(2.0 ** (10 + i) for i in range(1, 24, 2))),
    "vllm:nixl_num_descriptors": ("histogram", None),
    "vllm:nixl_num_failed_transfers": ("counter", None),
    "vllm:nixl_num_failed_notifications": ("counter", None),
    "vllm:nixl_num_kv_expired_reqs": ("counter", None),
    "vllm:nixl_num_notifications_after_expiry": ("counter", None),
}
FINISHED_REASONS = {"stop", "length", "abort", "error", "repetition"}
# What pdfleet reads: the autoscaler's PromQL and the drain hook (running + waiting).
READ_BY_PDFLEET = {
    promql.TTFT,
    promql.ITL,
    promql.REQUESTS,
    promql.PROMPT_TOKENS,
    promql.GENERATION_TOKENS,
    promql.WAITING,
    promql.KV_USAGE,
    "vllm:num_requests_running",
}


async def test_metrics_exposition_is_vllm_033s() -> None:
    async with in_process(["--max-model-len", "4096"]) as client:
        r = await client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3})
        assert r.status_code == 200
        r = await client.get("/metrics")
    assert r.status_code == 200
    media_type, *params = (part.strip() for part in r.headers["content-type"].split(";"))
    assert (media_type, params[0]) == ("text/plain", "version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    wire_names = set()
    for name, family in families.items():
        assert name in VLLM_033_METRICS, f"{name} is not a vLLM 0.33 metric"
        kind, buckets = VLLM_033_METRICS[name]
        assert family.type == kind, name
        for sample in family.samples:
            wire_names.add(sample.name)
            labels = dict(sample.labels)
            assert labels.pop("model_name") == SERVED and labels.pop("engine") == "0", sample
            if kind == "counter":
                assert sample.name == f"{name}_total", sample
            if name == "vllm:request_success":
                assert labels.pop("finished_reason") in FINISHED_REASONS, sample
            if sample.name.endswith("_bucket"):
                labels.pop("le")
            assert labels == {}, sample
        if kind == "histogram" and buckets is not None:
            les = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            assert les == [*buckets, math.inf], name
    assert {n.removesuffix("_bucket") for n in wire_names} >= READ_BY_PDFLEET
    # The request above shows up where vLLM would count it.
    got = {s.name: s.value for f in families.values() for s in f.samples if not s.labels.get("le")}
    assert got["vllm:prompt_tokens_total"] == 3 and got["vllm:generation_tokens_total"] == 3
    assert got["vllm:time_to_first_token_seconds_count"] == 1
    assert got["vllm:inter_token_latency_seconds_count"] == 2


async def test_models_is_vllm_model_list() -> None:
    async with in_process(["--max-model-len", "4096"]) as client:
        r = await client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"object", "data"} and body["object"] == "list"
    [card] = body["data"]
    [permission] = card.pop("permission")
    assert isinstance(card.pop("created"), int)
    # ModelCard: `id` the served name, `root` the model `vllm serve` loaded.
    assert card == {
        "id": SERVED,
        "object": "model",
        "owned_by": "vllm",
        "root": MODEL_PATH,
        "parent": None,
        "max_model_len": 4096,
    }
    assert re.fullmatch(r"modelperm-[0-9a-f]{32}", permission.pop("id"))
    assert isinstance(permission.pop("created"), int)
    # ModelPermission's defaults: sampling, logprobs and view allowed, nothing else.
    allowed = ("sampling", "logprobs", "view")
    denied = ("create_engine", "search_indices", "fine_tuning")
    assert permission == {
        "object": "model_permission",
        **{f"allow_{a}": True for a in allowed},
        **{f"allow_{a}": False for a in denied},
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


# ----- real processes: NIXL P/D edge cases and drain ------------------------------------


def _post(sim: SimProc, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{sim.url}/v1/completions",
        timeout=20.0,
        json={"model": "sim-model", "prompt": "a b c d", **body},
    )


def test_prefill_holds_until_lease_expiry_and_decode_fallbacks(tmp_path: Path) -> None:
    # Lease 20 simulated s = 2 wall s: long enough to see it held on a loaded machine.
    p = start_sim(str(tmp_path), extra=[*FAST, "--kv-lease-duration", "20"], name="p")
    d = start_sim(str(tmp_path), extra=FAST, name="d")
    try:
        r = _post(p, {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        params = r.json()["kv_transfer_params"]
        assert params["remote_port"] == p.side_channel_port and params["do_remote_prefill"]
        assert p.stats()["held_now"] == 1  # held, visible on the prefill
        # Incomplete params: the decode recomputes locally (vLLM's warning path).
        bad = {k: v for k, v in params.items() if k != "remote_request_id"}
        assert _post(d, {"max_tokens": 3, "kv_transfer_params": bad}).status_code == 200
        assert d.stats()["recompute_invalid_params"] == 1
        wait_until(lambda: p.stats()["held_now"] == 0, 10, "the lease to expire", 0.05)
        assert p.stats()["kv_expired"] == 1
        # Valid params but the blocks are gone: kv_load_failure_policy=fail -> 500.
        r = _post(d, {"max_tokens": 3, "kv_transfer_params": params})
        assert r.status_code == 500
        assert d.stats()["kv_pull_failures"] == 1 and d.stats()["kv_pulls"] == 0
    finally:
        p.stop()
        d.stop()


def test_recompute_policy_and_successful_pull(tmp_path: Path) -> None:
    p = start_sim(str(tmp_path), extra=FAST, name="p")
    d = start_sim(
        str(tmp_path),
        extra=[
            *FAST,
            "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_role":"kv_both",'
            '"kv_load_failure_policy":"recompute"}',
        ],
        name="d",
    )
    try:
        params = _post(
            p, {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        ).json()["kv_transfer_params"]
        assert _post(d, {"max_tokens": 2, "kv_transfer_params": params}).status_code == 200
        assert d.stats()["kv_pulls"] == 1 and p.stats()["kv_released"] == 1
        # Read already: a second decode with the same params recomputes instead of failing.
        r = _post(d, {"max_tokens": 2, "kv_transfer_params": params})
        assert r.status_code == 200 and d.stats()["kv_pull_failures"] == 1
    finally:
        p.stop()
        d.stop()


def test_sigterm_drains_in_flight_then_exits(tmp_path: Path) -> None:
    sim = start_sim(str(tmp_path), extra=[*FAST, "--shutdown-timeout", "10"])
    try:
        result: list[httpx.Response] = []
        t = threading.Thread(target=lambda: result.append(_post(sim, {"max_tokens": 2000})))
        t.start()  # 2000 tokens x ~5 ms x 0.1 = ~1 s wall
        # Signal only once the request runs, and post only once the drain began: fixed sleeps
        # lost both races on a loaded machine (SIGTERM before the request arrived, the drain
        # then over at once).
        wait_until(lambda: sim.stats()["running"] == 1, 10, "the request to run", 0.01)
        sim.signal(signal.SIGTERM)
        wait_until(lambda: not sim.stats()["accepting"], 10, "the drain to begin", 0.01)
        late = _post(sim, {"max_tokens": 1})
        assert late.status_code == 503
        t.join(10)
        assert result and result[0].status_code == 200
        assert result[0].json()["usage"]["completion_tokens"] == 2000
        assert sim.popen.wait(10) == 0
    finally:
        sim.stop()


def test_sigterm_without_timeout_aborts(tmp_path: Path) -> None:
    sim = start_sim(str(tmp_path), extra=["--preset", "llama-3.1-8b-h200"])
    try:
        errors: list[BaseException] = []
        statuses: list[int] = []

        def run() -> None:
            try:
                statuses.append(_post(sim, {"max_tokens": 2000}).status_code)  # ~10 s
            except httpx.HTTPError as err:
                errors.append(err)

        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: sim.stats()["running"] == 1, 10, "the request to run", 0.01)
        sim.signal(signal.SIGTERM)
        assert sim.popen.wait(10) == 0
        t.join(10)
        # Aborted: vLLM answers the in-flight request with finish_reason "abort" or drops it.
        assert errors or statuses
    finally:
        sim.stop()
