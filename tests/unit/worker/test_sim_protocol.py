"""The simulator's wire protocol against vLLM 0.33 (dataplane.md) and what a real vLLM showed
e2e/scenarios/differential.py: the prefill's `kv_transfer_params`, the answers' shapes and ids,
/metrics and /v1/models, in process; its NIXL P/D edge cases and SIGTERM drain, against real
processes."""

from __future__ import annotations

import json
import math
import re
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from e2e.platform.cluster import wait_until
from e2e.scenarios.differential import json_shape
from pdfleet.autoscale import promql
from pdfleet_worker.sim.procs import SimProc, free_port, start_sim
from pdfleet_worker.sim.server import build_parser

if TYPE_CHECKING:
    from tests.unit.worker.conftest import InProcess

FAST = ["--preset", "llama-3.1-8b-h200", "--time-scale", "0.1"]
MODEL_PATH = "meta-llama/Llama-3.1-8B-Instruct"
SERVED = "llama-8b"


async def in_process(sims: InProcess, extra: Sequence[str] = ()) -> httpx.AsyncClient:
    """A client of the simulator that `pdfleet-sim MODEL_PATH ...` would run."""
    argv = [MODEL_PATH, "--served-model-name", SERVED, "--time-scale", "0.01", *extra]
    return (await sims.start(argv))[1]


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
    "remote_prefill_cached_tokens": int,
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


# The prefill's internal request id after the answer's id: completions add the prompt's
# index, both 8 random hex digits.
ENGINE_ID_SUFFIX = {"cmpl": "-0-[0-9a-f]{8}", "chatcmpl": "-[0-9a-f]{8}"}


def _assert_prefill_params(params: Any, prompt_tokens: int, request_id: str) -> None:
    assert isinstance(params, dict)
    assert {k: type(v) for k, v in params.items()} == PREFILL_RESPONSE_TYPES
    blocks = params.pop("remote_block_ids")
    # 0.20+: one list of block ids per KV-cache group; Llama has one group (full attention).
    assert len(blocks) == 1 and all(type(b) is int for b in blocks[0]), blocks
    assert len(set(blocks[0])) == len(blocks[0]) == -(-prompt_tokens // 16)  # 16-token blocks
    suffix = ENGINE_ID_SUFFIX[request_id.split("-")[0]]
    assert re.fullmatch(re.escape(request_id) + suffix, params.pop("remote_request_id"))
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
        "remote_prefill_cached_tokens": 0,  # no prefix cache
    }


async def test_prefill_response_carries_vllm_033_kv_transfer_params(sims: InProcess) -> None:
    prompts: dict[str, dict[str, Any]] = {
        "/v1/completions": {"prompt": list(range(100))},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi " * 40}]},
    }
    client = await in_process(sims, PREFILL_WORKER)
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


# ----- the answers ------------------------------------------------------------------------

# The keys and JSON types (e2e/scenarios/differential.py's json_shape) of the non-streaming answers
# a real vLLM gave e2e/scenarios/differential.py; what the simulator does not model is null.
USAGE_SHAPE = {
    "completion_tokens": "number",
    "completion_tokens_details": "null",
    "prompt_tokens": "number",
    "prompt_tokens_details": "null",
    "total_tokens": "number",
}
ANSWER_SHAPE = {
    "created": "number",
    "ec_transfer_params": "null",
    "id": "string",
    "kv_transfer_params": "null",
    "metrics": "null",
    "model": "string",
    "object": "string",
    "service_tier": "null",
    "system_fingerprint": "string",
    "usage": USAGE_SHAPE,
}
CHOICE_SHAPE = {
    "finish_reason": "string",
    "index": "number",
    "logprobs": "null",
    "routed_experts": "null",
    "stop_reason": "null",
    "token_ids": "null",
}
COMPLETION_SHAPE = {
    **ANSWER_SHAPE,
    "choices": [
        {**CHOICE_SHAPE, "prompt_logprobs": "null", "prompt_token_ids": "null", "text": "string"}
    ],
}
CHAT_MESSAGE_SHAPE = {
    "annotations": "null",
    "audio": "null",
    "content": "string",
    "function_call": "null",
    "reasoning": "null",
    "refusal": "null",
    "role": "string",
}
CHAT_SHAPE = {
    **ANSWER_SHAPE,
    "choices": [{**CHOICE_SHAPE, "message": CHAT_MESSAGE_SHAPE}],
    "prompt_logprobs": "null",
    "prompt_text": "null",
    "prompt_token_ids": "null",
}
CHAT_PROMPT = {"messages": [{"role": "user", "content": "hi"}]}
ANSWERS = [
    ("/v1/completions", {"prompt": "a b c"}, COMPLETION_SHAPE, "cmpl"),
    ("/v1/chat/completions", CHAT_PROMPT, CHAT_SHAPE, "chatcmpl"),
]


@pytest.mark.parametrize(("path", "prompt", "shape", "prefix"), ANSWERS, ids=["completion", "chat"])
async def test_answers_have_vllm_keys_ids_and_fingerprint(
    sims: InProcess, path: str, prompt: dict[str, Any], shape: Any, prefix: str
) -> None:
    client = await in_process(sims)
    body = {**prompt, "max_tokens": 2}
    out = (await client.post(path, json=body)).json()
    assert json_shape(out) == shape
    assert re.fullmatch(prefix + "-[0-9a-f]{16}", out["id"])  # no X-Request-Id: random
    # vLLM's default fingerprint: version, then 8 hex digits of its configuration's hash.
    assert re.fullmatch(r"vllm-0\.33\.0-[0-9a-f]{8}", out["system_fingerprint"])
    again = (await client.post(path, json=body, headers={"X-Request-Id": "abc"})).json()
    assert again["id"] == f"{prefix}-abc"
    assert again["system_fingerprint"] == out["system_fingerprint"]


async def test_the_fingerprint_names_tensor_parallelism(sims: InProcess) -> None:
    client = await in_process(sims, ["--tensor-parallel-size", "2"])
    out = (await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})).json()
    assert re.fullmatch(r"vllm-0\.33\.0-tp2-[0-9a-f]{8}", out["system_fingerprint"])


# (method, path, JSON body sent, JSON answer; None: an empty 200)
PLAIN: list[tuple[str, str, dict[str, Any] | None, Any]] = [
    ("GET", "/health", None, None),
    ("GET", "/ping", None, None),
    ("GET", "/load", None, {"server_load": 0}),
    ("GET", "/version", None, {"version": "0.33.0"}),
    (
        "POST",
        "/tokenize",
        {"prompt": "a b"},
        {"count": 2, "max_model_len": 4096, "tokens": [0, 1], "token_strs": None},
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "answer"), PLAIN)
async def test_plain_endpoints(
    sims: InProcess, method: str, path: str, body: Any, answer: Any
) -> None:
    client = await in_process(sims, ["--max-model-len", "4096"])
    r = await client.request(method, path, json=body)
    assert r.status_code == 200
    assert (r.json() if answer is not None else r.content) == (answer or b"")


# (path, body, status, error type): what vLLM refuses before scheduling anything.
REFUSED = [
    ("/v1/completions", {"model": "other", "prompt": "a"}, 404, "NotFoundError"),
    ("/v1/completions", {"prompt": "a " * 4000, "max_tokens": 100}, 400, "BadRequestError"),
    ("/v1/completions", {"prompt": "a", "n": 2}, 400, "BadRequestError"),
    ("/v1/chat/completions", {"messages": []}, 400, "BadRequestError"),
    ("/v1/completions", {"prompt": "a", "stream_options": {}}, 400, "BadRequestError"),
]


@pytest.mark.parametrize(("path", "body", "status", "kind"), REFUSED)
async def test_requests_vllm_refuses(
    sims: InProcess, path: str, body: dict[str, Any], status: int, kind: str
) -> None:
    client = await in_process(sims, ["--max-model-len", "4096"])
    r = await client.post(path, json=body)
    assert (r.status_code, r.json()["error"]["type"]) == (status, kind)


# (path, body, prompt tokens, completion tokens, finish reason). Prompts count one token per
# word or punctuation mark, a chat message 4 more for its template. The output is exactly
# max_tokens (as with ignore_eos); without one, vLLM's completions default of 16, and for
# chat --default-output-tokens ending in a simulated EOS.
LENGTHS = [
    ("/v1/completions", {"prompt": "a b, c", "max_tokens": 5}, 4, 5, "length"),
    ("/v1/completions", {"prompt": list(range(9))}, 9, 16, "length"),
    ("/v1/chat/completions", {**CHAT_PROMPT, "max_completion_tokens": 3}, 5, 3, "length"),
    ("/v1/chat/completions", CHAT_PROMPT, 5, 7, "stop"),
]


@pytest.mark.parametrize(("path", "body", "prompt", "output", "finish"), LENGTHS)
async def test_token_counts(
    sims: InProcess, path: str, body: dict[str, Any], prompt: int, output: int, finish: str
) -> None:
    client = await in_process(sims, ["--default-output-tokens", "7"])
    out = (await client.post(path, json=body)).json()
    usage = out["usage"]
    got = (usage["prompt_tokens"], usage["completion_tokens"], out["choices"][0]["finish_reason"])
    assert got == (prompt, output, finish)


# The routes vllm-router's cache-aware policies call, refused unless `--enable-scale-out`.
SCALE_OUT = ["/v1/completions/render", "/v1/chat/completions/render", "/inference/v1/generate"]


@pytest.mark.parametrize("path", SCALE_OUT)
async def test_scale_out_endpoints_are_forbidden(sims: InProcess, path: str) -> None:
    client = await in_process(sims)
    r = await client.post(path, json={"model": SERVED, "prompt": "a"})
    assert r.status_code == 403
    assert r.json() == {
        "error": {
            "message": "Scale-out endpoints are disabled. Restart vllm serve with "
            "--enable-scale-out to enable them.",
            "type": "PermissionDeniedError",
            "param": None,
            "code": 403,
        }
    }


# ----- /metrics and /v1/models ------------------------------------------------------------

# vLLM's bucket boundaries (v1/metrics/buckets.py, nixl/stats.py, and the pages of a real
# engine), written out here rather than read from the simulator so that a wrong boundary
# there fails.
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
ITERATION_BUCKETS = (
    *(1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0),
    *(4096.0, 8192.0, 16384.0),
)
NIXL_POST_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0),
    *(5.0,),
)
NIXL_DESCRIPTOR_BUCKETS = (
    *(10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0, 2000.0),
    *(4000.0, 10000.0, 20000.0, 50000.0),
)
ENGINE = frozenset({"model_name", "engine"})

# A family as the Prometheus parser names it (counters without `_total`): its type, its
# histogram buckets and its label names (None: not compared).
Family = tuple[str, tuple[float, ...] | None, frozenset[str] | None]


def _gauge(*extra: str) -> Family:
    return "gauge", None, ENGINE | set(extra)


def _counter(*extra: str) -> Family:
    return "counter", None, ENGINE | set(extra)


def _histogram(buckets: tuple[float, ...]) -> Family:
    return "histogram", buckets, ENGINE


# vLLM 0.33's families on every engine.
VLLM_033_METRICS: dict[str, Family] = {
    "vllm:num_requests_running": _gauge(),
    "vllm:num_requests_waiting": _gauge(),
    "vllm:num_requests_waiting_by_reason": _gauge("reason"),
    "vllm:engine_sleep_state": _gauge("sleep_state"),
    "vllm:kv_cache_usage_perc": _gauge(),
    "vllm:cache_config_info": ("gauge", None, None),  # the CacheConfig's fields as labels
    "vllm:prefix_cache_queries": _counter(),
    "vllm:prefix_cache_hits": _counter(),
    "vllm:external_prefix_cache_queries": _counter(),
    "vllm:external_prefix_cache_hits": _counter(),
    "vllm:mm_cache_queries": _counter(),
    "vllm:mm_cache_hits": _counter(),
    "vllm:num_preemptions": _counter(),
    "vllm:prompt_tokens": _counter(),
    "vllm:prompt_tokens_by_source": _counter("source"),
    "vllm:prompt_tokens_cached": _counter(),
    "vllm:prompt_tokens_cached_by_source": _counter("source"),
    "vllm:generation_tokens": _counter(),
    "vllm:request_success": _counter("finished_reason"),
    "vllm:admission_rejections": ("counter", None, frozenset({"model_name", "reason"})),
    "vllm:estimated_flops_per_gpu": _counter(),
    "vllm:estimated_read_bytes_per_gpu": _counter(),
    "vllm:estimated_write_bytes_per_gpu": _counter(),
    "vllm:request_prompt_tokens": _histogram(TOKEN_BUCKETS),
    "vllm:request_generation_tokens": _histogram(TOKEN_BUCKETS),
    "vllm:request_params_max_tokens": _histogram(TOKEN_BUCKETS),
    "vllm:request_max_num_generation_tokens": _histogram(TOKEN_BUCKETS),
    "vllm:request_prefill_kv_computed_tokens": _histogram(TOKEN_BUCKETS),
    "vllm:iteration_tokens_total": _histogram(ITERATION_BUCKETS),
    "vllm:request_params_n": _histogram((1.0, 2.0, 5.0, 10.0, 20.0)),
    "vllm:request_num_preemptions": _histogram((1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)),
    "vllm:time_to_first_token_seconds": _histogram(TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": _histogram(ITL_BUCKETS),
    "vllm:request_time_per_output_token_seconds": _histogram(ITL_BUCKETS),
    "vllm:e2e_request_latency_seconds": _histogram(LATENCY_BUCKETS),
    "vllm:request_queue_time_seconds": _histogram(LATENCY_BUCKETS),
    "vllm:request_inference_time_seconds": _histogram(LATENCY_BUCKETS),
    "vllm:request_prefill_time_seconds": _histogram(LATENCY_BUCKETS),
    "vllm:request_decode_time_seconds": _histogram(LATENCY_BUCKETS),
}
# The NixlConnector's (nixl/stats.py), with a KV connector configured: the transfer time
# starts at 5 ms, the post time at 1 ms; bytes 2^(10+i), i = 1, 3, ..., 23.
NIXL_METRICS: dict[str, Family] = {
    "vllm:nixl_xfer_time_seconds": _histogram(NIXL_POST_BUCKETS[1:]),
    "vllm:nixl_post_time_seconds": _histogram(NIXL_POST_BUCKETS),
    "vllm:nixl_bytes_transferred": _histogram(tuple(2.0 ** (10 + i) for i in range(1, 24, 2))),
    "vllm:nixl_num_descriptors": _histogram(NIXL_DESCRIPTOR_BUCKETS),
    "vllm:nixl_num_failed_transfers": _counter(),
    "vllm:nixl_num_failed_notifications": _counter(),
    "vllm:nixl_num_kv_expired_reqs": _counter(),
    "vllm:nixl_num_notifications_after_expiry": _counter(),
}
# A KV consumer's (kv_consumer or kv_both), i.e. a decode's.
KV_FETCH_METRICS = {"vllm:num_requests_kv_fetch_by_stage": _gauge("stage")}
# The values of the extra labels, every one served from the start.
LABEL_VALUES = {
    "reason": {"capacity", "deferred", "max_num_queued_reqs", "max_num_queued_tokens"},
    "sleep_state": {"awake", "weights_offloaded", "discard_all"},
    "source": {"local_compute", "local_cache_hit", "external_kv_transfer"}
    | {"device", "host", "p2p", "disk", "external_unspecified"},
    "finished_reason": {"stop", "length", "abort", "error", "repetition"},
    "stage": {"waiting_to_start", "in_progress", "completed_waiting"},
}
KV_ROLES = [
    ("no connector", None, VLLM_033_METRICS),
    ("kv_producer", "kv_producer", {**VLLM_033_METRICS, **NIXL_METRICS}),
    ("kv_consumer", "kv_consumer", {**VLLM_033_METRICS, **NIXL_METRICS, **KV_FETCH_METRICS}),
    ("kv_both", "kv_both", {**VLLM_033_METRICS, **NIXL_METRICS, **KV_FETCH_METRICS}),
]
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


def _kv_args(role: str | None, **extra: str) -> list[str]:
    if role is None:
        return []
    config = {"kv_connector": "NixlConnector", "kv_role": role, **extra}
    return ["--kv-transfer-config", json.dumps(config)]


@pytest.mark.parametrize(
    ("role", "expected"), [r[1:] for r in KV_ROLES], ids=[r[0] for r in KV_ROLES]
)
async def test_metrics_families_are_vllm_033s(
    sims: InProcess, role: str | None, expected: dict[str, Family]
) -> None:
    client = await in_process(sims, ["--max-model-len", "4096", *_kv_args(role)])
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    # Every counter and histogram has its `_created` series, which the parser reads as a
    # gauge family of its own, as it does on vLLM's page.
    created = {f"{name}_created" for name, (kind, _, _) in expected.items() if kind != "gauge"}
    assert set(families) == set(expected) | created
    for name in created:
        assert families[name].type == "gauge" and families[name].samples, name
    for name, (kind, buckets, labels) in expected.items():
        family = families[name]
        assert family.type == kind, name
        names = {k for s in family.samples for k in s.labels} - {"le"}
        assert labels is None or names == labels, name
        for sample in family.samples:
            for label in names & set(LABEL_VALUES):
                assert sample.labels[label] in LABEL_VALUES[label], sample
            ours = {"engine": "0", "model_name": SERVED}
            assert all(sample.labels[k] == v for k, v in ours.items() if k in names), sample
        assert _bounds(family) == ([*buckets, math.inf] if buckets else []), name
    wire = {s.name.removesuffix("_bucket") for f in families.values() for s in f.samples}
    assert wire >= READ_BY_PDFLEET


def _bounds(family: Metric) -> list[float]:
    """The `le` of a family's bucket samples, in page order."""
    return [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]


def _les(text: str, name: str) -> list[float]:
    return _bounds(next(f for f in text_string_to_metric_families(text) if f.name == name))


async def test_custom_histogram_buckets_replace_a_familys_defaults(sims: InProcess) -> None:
    """vLLM's --custom-histogram-buckets: a family's bounds replace the defaults of every
    histogram in it (inter_token_latency: ITL and per-request TPOT), the rest keep theirs."""
    itl = [0.005, 0.01, 0.015, 0.02]
    buckets = json.dumps({"inter_token_latency": itl, "kv_cache_residency": [1.0]})
    client = await in_process(sims, ["--custom-histogram-buckets", buckets])
    text = (await client.get("/metrics")).text
    assert _les(text, "vllm:inter_token_latency_seconds") == [*itl, math.inf]
    assert _les(text, "vllm:request_time_per_output_token_seconds") == [*itl, math.inf]
    assert _les(text, "vllm:time_to_first_token_seconds") == [*TTFT_BUCKETS, math.inf]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"itl": [0.01]}', "unknown bucket family 'itl'"),
        ('{"inter_token_latency": []}', "must not be empty"),
        ('{"inter_token_latency": [0.02, 0.01]}', "must be strictly increasing"),
        ('{"inter_token_latency": [0.0, 0.01]}', "must be finite and greater than 0"),
        ('{"inter_token_latency": [true]}', "must be a number"),
        ("[0.01]", "must be a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_bad_custom_histogram_buckets_are_refused_naming_the_family(
    value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--custom-histogram-buckets", value])
    err = capsys.readouterr().err
    assert "--custom-histogram-buckets" in err and says in err, err


def sample_sum(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


# (sample, labels, value) after one plain 3-token prompt with max_tokens 3.
COUNTED_ONCE = [
    ("vllm:prompt_tokens_total", {}, 3),
    ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}, 3),
    ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"}, 0),
    ("vllm:prompt_tokens_cached_total", {}, 0),
    ("vllm:prefix_cache_queries_total", {}, 3),
    ("vllm:generation_tokens_total", {}, 3),
    ("vllm:request_success_total", {"finished_reason": "length"}, 1),
    ("vllm:time_to_first_token_seconds_count", {}, 1),
    ("vllm:inter_token_latency_seconds_count", {}, 2),
    ("vllm:request_time_per_output_token_seconds_count", {}, 1),
    ("vllm:request_params_n_sum", {}, 1),
    ("vllm:request_params_max_tokens_sum", {}, 3),
    ("vllm:request_max_num_generation_tokens_sum", {}, 3),
    ("vllm:request_num_preemptions_count", {}, 1),
    ("vllm:request_num_preemptions_sum", {}, 0),
    ("vllm:request_prefill_kv_computed_tokens_sum", {}, 3),
    ("vllm:engine_sleep_state", {"sleep_state": "awake"}, 1),
    ("vllm:engine_sleep_state", {"sleep_state": "discard_all"}, 0),
    ("vllm:num_requests_waiting", {}, 0),
]


async def test_metrics_count_a_request_where_vllm_would(sims: InProcess) -> None:
    client = await in_process(sims, ["--max-model-len", "4096"])
    r = await client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3})
    assert r.status_code == 200
    text = (await client.get("/metrics")).text
    got = [(name, labels, sample_sum(text, name, **labels)) for name, labels, _ in COUNTED_ONCE]
    assert got == COUNTED_ONCE


async def test_models_is_vllm_model_list(sims: InProcess) -> None:
    client = await in_process(sims, ["--max-model-len", "4096"])
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


# How the agent starts a prefill and a decode (NixlConnector, kv_producer / kv_consumer).
PREFILL = [*FAST, *_kv_args("kv_producer")]
DECODE = [*FAST, *_kv_args("kv_consumer")]


def _post(sim: SimProc, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{sim.url}/v1/completions",
        timeout=20.0,
        json={"model": "sim-model", "prompt": "a b c d", **body},
    )


def _prefill(p: SimProc) -> dict[str, Any]:
    r = _post(p, {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status_code == 200, r.text
    params: dict[str, Any] = r.json()["kv_transfer_params"]
    return params


def _metric(sim: SimProc, name: str) -> float:
    return sample_sum(httpx.get(f"{sim.url}/metrics", timeout=5.0).text, name)


def test_prefill_holds_until_lease_expiry_and_a_late_read_still_loads(tmp_path: Path) -> None:
    # Lease 20 simulated s = 2 wall s: long enough to see it held on a loaded machine.
    p = start_sim(str(tmp_path), extra=[*PREFILL, "--kv-lease-duration", "20"], name="p")
    d = start_sim(str(tmp_path), extra=DECODE, name="d")
    try:
        params = _prefill(p)
        assert params["remote_port"] == p.side_channel_port and params["do_remote_prefill"]
        assert p.stats()["held_now"] == 1  # held, visible on the prefill
        # Incomplete params: the decode recomputes locally (vLLM's warning path).
        bad = {k: v for k, v in params.items() if k != "remote_request_id"}
        assert _post(d, {"max_tokens": 3, "kv_transfer_params": bad}).status_code == 200
        assert d.stats()["recompute_invalid_params"] == 1
        wait_until(lambda: p.stats()["held_now"] == 0, 10, "the lease to expire", 0.05)
        assert p.stats()["kv_expired"] == 1
        assert _metric(p, "vllm:nixl_num_kv_expired_reqs_total") == 1
        # vLLM's decode READs the given blocks one-sidedly: they may hold other KV by now,
        # but the read succeeds, and the prefill counts a notification after expiry.
        r = _post(d, {"max_tokens": 3, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        assert d.stats()["kv_pulls"] == 1 and d.stats()["kv_pull_failures"] == 0
        assert _metric(p, "vllm:nixl_num_notifications_after_expiry_total") == 1
    finally:
        p.stop()
        d.stop()


def test_a_decode_dials_a_prefill_side_channel_once(tmp_path: Path) -> None:
    p = start_sim(str(tmp_path), extra=PREFILL, name="p")
    recompute = _kv_args("kv_consumer", kv_load_failure_policy="recompute")
    d = start_sim(str(tmp_path), extra=[*FAST, *recompute], name="d")
    try:
        assert _post(d, {"max_tokens": 2, "kv_transfer_params": _prefill(p)}).status_code == 200
        assert d.stats()["kv_pulls"] == 1 and p.stats()["kv_released"] == 1
        # The engine is known now: params naming a port where nothing listens still load,
        # since the READ goes to the data plane the handshake named.
        dead = {**_prefill(p), "remote_port": free_port()}
        assert _post(d, {"max_tokens": 2, "kv_transfer_params": dead}).status_code == 200
        assert d.stats()["kv_pulls"] == 2 and p.stats()["kv_released"] == 2
        # An engine never handshaken with, at that port: no transfer; recompute.
        unknown = {**dead, "remote_engine_id": "elsewhere"}
        assert _post(d, {"max_tokens": 2, "kv_transfer_params": unknown}).status_code == 200
        assert d.stats()["kv_pull_failures"] == 1
        assert _metric(d, "vllm:nixl_num_failed_transfers_total") == 1
    finally:
        p.stop()
        d.stop()


def _assert_refused_while_draining(sim: SimProc) -> None:
    """vLLM during its shutdown drain: a new request fails as its engine client does (500),
    while /health and /metrics keep answering."""
    late = _post(sim, {"max_tokens": 1})
    assert late.status_code == 500
    assert late.json()["error"] == {
        "message": "cannot schedule new futures after shutdown",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    assert httpx.get(f"{sim.url}/health", timeout=5.0).status_code == 200
    assert httpx.get(f"{sim.url}/metrics", timeout=5.0).status_code == 200


def test_sigterm_drains_in_flight_then_exits(tmp_path: Path) -> None:
    sim = start_sim(str(tmp_path), extra=[*FAST, "--shutdown-timeout", "10"])
    try:
        result: list[httpx.Response] = []
        t = threading.Thread(target=lambda: result.append(_post(sim, {"max_tokens": 2000})))
        t.start()  # 2000 tokens x ~5 ms x 0.1 = ~1 s wall
        # Signal only once the request runs, and post only once the drain began: a fixed sleep
        # can lose either race on a loaded machine (SIGTERM before the request arrives, the
        # drain then over at once).
        wait_until(lambda: sim.stats()["running"] == 1, 10, "the request to run", 0.01)
        sim.signal(signal.SIGTERM)
        wait_until(lambda: not sim.stats()["accepting"], 10, "the drain to begin", 0.01)
        _assert_refused_while_draining(sim)
        t.join(10)
        assert result and result[0].status_code == 200
        assert result[0].json()["usage"]["completion_tokens"] == 2000
        assert sim.popen.wait(10) == 0
    finally:
        sim.stop()


def test_a_draining_prefill_serves_the_kv_it_holds_then_exits(tmp_path: Path) -> None:
    p = start_sim(str(tmp_path), extra=[*PREFILL, "--shutdown-timeout", "10"], name="p")
    d = start_sim(str(tmp_path), extra=DECODE, name="d")
    try:
        params = _prefill(p)
        p.signal(signal.SIGTERM)
        wait_until(lambda: not p.stats()["accepting"], 10, "the drain to begin", 0.01)
        _assert_refused_while_draining(p)
        assert p.popen.poll() is None  # it waits for the decode to read what it holds
        assert _post(d, {"max_tokens": 2, "kv_transfer_params": params}).status_code == 200
        assert d.stats()["kv_pulls"] == 1
        assert p.popen.wait(10) == 0
    finally:
        p.stop()
        d.stop()


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
