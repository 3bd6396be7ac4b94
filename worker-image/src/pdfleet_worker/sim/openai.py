"""OpenAI-compatible request parsing and response bodies, shaped like vLLM 0.33's.

Where it fits: pure helpers for the simulator's /v1/completions and /v1/chat/completions
handlers (server.py): what a request asks for, and the JSON objects and SSE chunks vLLM
sends back (ids, `usage`, top-level `kv_transfer_params`, `[DONE]`). The non-streaming
answers carry exactly the keys of vLLM's CompletionResponse and ChatCompletionResponse (the
fields the simulator does not model are null), which e2e/scenarios/differential.py compares.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pdfleet_worker.sim.tokens import count_chat_tokens, count_prompt_tokens

Kind = Literal["completion", "chat"]
# vLLM's CompletionRequest default; chat has none (the model stops at EOS).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class BadRequestError(ValueError):
    pass


@dataclass(frozen=True)
class Ask:
    """What one OpenAI request asks of the engine."""

    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int
    limit_reason: str  # finish_reason when max_tokens is reached
    stream: bool
    include_usage: bool
    kv_transfer_params: Any


def parse_request(kind: Kind, body: Any, default_output_tokens: int) -> Ask:
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    kvp = body.get("kv_transfer_params")
    try:
        if kind == "completion":
            if "prompt" not in body:
                raise BadRequestError("field 'prompt' is required")
            prompt_tokens = count_prompt_tokens(body["prompt"])
        else:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequestError("field 'messages' must be a non-empty list")
            forwarded = kvp.get("prompt_token_ids") if isinstance(kvp, dict) else None
            if isinstance(forwarded, list) and forwarded:
                prompt_tokens = len(forwarded)
            else:
                prompt_tokens = count_chat_tokens(messages)
    except ValueError as err:
        raise BadRequestError(str(err)) from err
    cap = body.get("max_completion_tokens") if kind == "chat" else None
    if cap is None:
        cap = body.get("max_tokens")
    if cap is None and kind == "completion":
        cap = COMPLETIONS_DEFAULT_MAX_TOKENS
    if cap is None:
        max_tokens, reason = default_output_tokens, "stop"
    else:
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise BadRequestError("max_tokens must be a positive integer")
        max_tokens, reason = cap, "length"
    if body.get("n", 1) != 1:
        raise BadRequestError("only n=1 is supported by the simulator")
    opts = body.get("stream_options")
    if opts is not None and not body.get("stream"):
        # vLLM's request models refuse it (completion/protocol.py, chat_completion/protocol.py).
        raise BadRequestError("Stream options can only be defined when `stream=True`.")
    return Ask(
        kind=kind,
        model=str(body.get("model", "")),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        limit_reason=reason,
        stream=bool(body.get("stream", False)),
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage")),
        kv_transfer_params=kvp,
    )


def new_response_id(kind: Kind, header: str | None) -> str:
    """The answer's id: the client's X-Request-Id, else 16 random hex digits."""
    return f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-{header or uuid.uuid4().hex[:16]}"


def engine_request_id(kind: Kind, response: str) -> str:
    """The id inside the engine (a prefill's `remote_request_id`): completions add the
    prompt's index in the batch, both add 8 random characters so that retries with the same
    X-Request-Id stay distinct."""
    index = "-0" if kind == "completion" else ""
    return f"{response}{index}-{uuid.uuid4().hex[:8]}"


def system_fingerprint(version: str, tp_size: int, identity: str) -> str:
    """vLLM's default ("full") fingerprint: version, parallelism above 1, and 8 hex digits
    of a hash of the engine's configuration (here: whatever identifies the simulated one)."""
    parallel = [f"tp{tp_size}"] if tp_size > 1 else []
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return "-".join([f"vllm-{version}", *parallel, digest])


def error_body(message: str, status: int) -> dict[str, Any]:
    kinds = {
        400: "BadRequestError",
        403: "PermissionDeniedError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }
    return {
        "error": {
            "message": message,
            "type": kinds.get(status, "Error"),
            "param": None,
            "code": status,
        }
    }


def model_list(served_name: str, model_path: str, max_model_len: int, created: int) -> Any:
    """GET /v1/models: vLLM's ModelList with one ModelCard (`root` is the model path that
    `vllm serve` loaded, `id` the served name) and its default ModelPermission."""
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": served_name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model_path,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


# Keys of a non-streaming choice that only matter for what the simulator does not model
# (token ids returned on request, MoE routing).
_UNMODELLED_CHOICE = {"token_ids": None, "routed_experts": None}
_UNMODELLED_PROMPT = {"prompt_logprobs": None, "prompt_token_ids": None}


def _choice(kind: Kind, text: str, finish: str | None, stream: bool, first: bool) -> Any:
    if kind == "completion":
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return choice if stream else {**choice, **_UNMODELLED_CHOICE, **_UNMODELLED_PROMPT}
    if stream:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta = {"role": "assistant", "content": text}
        return {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
    return {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        },
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        **_UNMODELLED_CHOICE,
    }


def full_response(
    kind: Kind,
    response_id: str,
    model: str,
    text: str,
    finish: str,
    prompt: int,
    completion: int,
    kv_transfer_params: dict[str, Any] | None,
    fingerprint: str,
) -> dict[str, Any]:
    # A chat answer also echoes the prompt (on request only, so null here).
    prompt_echo = {} if kind == "completion" else {**_UNMODELLED_PROMPT, "prompt_text": None}
    return {
        "id": response_id,
        "object": "text_completion" if kind == "completion" else "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(kind, text, finish, stream=False, first=True)],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt, completion),
        **prompt_echo,
        "kv_transfer_params": kv_transfer_params,
        "ec_transfer_params": None,  # the encoder-cache connector's, never set here
        "metrics": None,
    }


def chunk(
    kind: Kind,
    response_id: str,
    model: str,
    created: int,
    text: str,
    finish: str | None = None,
    first: bool = False,
    kv_transfer_params: dict[str, Any] | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "id": response_id,
        "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [_choice(kind, text, finish, stream=True, first=first)],
    }
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return sse(body)


def usage_chunk(
    kind: Kind, response_id: str, model: str, created: int, prompt: int, completion: int
) -> bytes:
    return sse(
        {
            "id": response_id,
            "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(prompt, completion),
        }
    )


def sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


DONE = b"data: [DONE]\n\n"
