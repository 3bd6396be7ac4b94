"""The NixlConnector `kv_transfer_params` protocol of vLLM 0.33 (pull mode), as pure functions.

Where it fits: the simulator's request handlers use these to decide whether a request is the
prefill half (`do_remote_decode`), a decode half that may pull KV from a prefill worker
(`do_remote_prefill` with complete params) or a plain request, and to build the exact params a
0.33 prefill worker returns. Field names and validity rules follow
distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py: a decode request uses the
remote KV when `remote_block_ids` is non-empty and the four remote fields are present (a
None value counts as present); `tp_size` only decides whether the decode heartbeats.
The compatibility hash a prefill's handshake answer carries is here too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# A decode request uses the remote KV only if all of these keys are present (0.33 pull
# scheduler, update_state_after_alloc: `all(p in params for p in ...)`).
REQUIRED_DECODE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
# What the decode needs besides those to heartbeat the prefill's lease (on_new_request).
HEARTBEAT_FIELDS = (*REQUIRED_DECODE_FIELDS, "tp_size")


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode request finds its prompt's KV blocks. The request id is opaque here:
    the decode reads the given block ids whether or not the prefill still knows it."""

    engine_id: str
    request_id: str
    host: str | None  # the prefill's side channel, dialled only to handshake
    port: int | None
    block_ids: tuple[int, ...]
    heartbeat: bool  # every field of HEARTBEAT_FIELDS is set


def wants_remote_decode(params: Any) -> bool:
    """True for the prefill half of a P/D request (the proxy's first call)."""
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def parse_remote_prefill(params: Any) -> tuple[RemotePrefill | None, str | None]:
    """(remote, None) when a decode request may pull KV; (None, why) when it must recompute.

    `why` is None when no transfer was asked for at all (a plain request).
    """
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None, None
    missing = [f for f in REQUIRED_DECODE_FIELDS if f not in params]
    if missing:
        return None, f"missing {', '.join(missing)}"
    flat = _flatten_block_ids(params.get("remote_block_ids"))
    if not flat:
        return None, "remote_block_ids empty or malformed"
    host, port = params["remote_host"], params["remote_port"]
    return (
        RemotePrefill(
            engine_id=str(params["remote_engine_id"]),
            request_id=str(params["remote_request_id"]),
            host=None if host is None else str(host),
            port=_port(port),
            block_ids=tuple(flat),
            heartbeat=all(params.get(f) is not None for f in HEARTBEAT_FIELDS),
        ),
        None,
    )


def _port(value: Any) -> int | None:
    # A port that is not a number cannot be dialled: the handshake, if needed, fails.
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _flatten_block_ids(blocks: Any) -> list[int] | None:
    # 0.20+: one list per KV-cache group ([[1, 2, 3]]); 0.11 sent a flat list.
    if not isinstance(blocks, list):
        return None
    out: list[int] = []
    for b in blocks:
        if isinstance(b, list):
            if not all(isinstance(i, int) for i in b):
                return None
            out.extend(b)
        elif isinstance(b, int):
            out.append(b)
        else:
            return None
    return out


def prefill_response_params(
    *,
    block_ids: list[int],
    engine_id: str,
    request_id: str,
    host: str,
    port: int,
    tp_size: int,
    num_tokens: int,
    registration_generation: int = 1,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """The `kv_transfer_params` a 0.33 NixlConnector prefill worker returns (pull mode)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(block_ids)],
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": num_tokens,
        "remote_blocks_expiry_time": None,
        "remote_registration_generation": registration_generation,
        "transfer_mode": "pull",
        # Prompt tokens the prefill found in its prefix cache (none: the simulator has none).
        "remote_prefill_cached_tokens": cached_tokens,
    }


# vLLM's --dtype "auto" takes the model's own dtype; every preset models a BF16 checkpoint.
MODEL_DTYPES = {
    "auto": "bfloat16",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}


def compatibility_hash(model: str, dtype: str, cache_dtype: str, kv_bytes_per_token: int) -> str:
    """The NIXL compatibility hash of an engine (vLLM: nixl/metadata.py,
    compute_nixl_compatibility_hash), from the factors the simulator has: the model as
    `vllm serve` loaded it (not the served name), its resolved dtype, the KV cache dtype as
    given, and the preset's KV bytes per token standing for the layers, KV heads and head size.
    Left out as vLLM leaves them out: block size, TP size and KV layout, which vLLM checks
    after the handshake and may differ; left out as the simulator has none: the vLLM and
    connector versions, the attention backend, the hybrid allocator and speculative config."""
    factors = {
        "model": model,
        "dtype": MODEL_DTYPES.get(dtype, dtype),
        "cache_dtype": cache_dtype,
        "kv_bytes_per_token": kv_bytes_per_token,
    }
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()
