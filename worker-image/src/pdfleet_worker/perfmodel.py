"""Latency model of one vLLM engine instance (prefill, decode step, KV transfer).

Where it fits: the worker simulator (`pdfleet_worker.sim`) steps its engine loop with these
times, and the fleet simulator used by the autoscaler benchmarks imports the same presets, so
both agree on what a GPU can do. Pure: no I/O, no clocks.

Coefficients are least-squares fits to aiconfigurator per-op predictions for vLLM on H100/H200
(BF16), see docs/simulator.md for provenance and limits:

    prefill_ms(n)       = a + b*n + c*n^2          n = new tokens computed in the batch
    decode_step_ms(B,c) = d0 + d1*B + d2*B*c       B = running sequences, c = mean context
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Some prefill fits have a negative intercept (70B H200 TP4: a = -3.31 ms); a forward pass
# never takes less than a kernel launch, so short batches are clamped to this floor.
_MIN_PREFILL_MS = 0.5
_MS = 1e-3

# GPU memory (bytes, decimal GB as vendors quote it) and what vLLM leaves for the KV cache.
_GPU_MEMORY_BYTES = {"h200": 141e9, "h100": 80e9}
_GPU_MEMORY_UTILIZATION = 0.9  # vLLM --gpu-memory-utilization default
_ACTIVATION_RESERVE_BYTES = 4e9  # per GPU: activations, CUDA graphs, NCCL buffers

_LLAMA_8B_PARAMS = 8.03e9
_LLAMA_70B_PARAMS = 70.6e9
_LLAMA_8B_KV_BYTES = 2 * 32 * 8 * 128 * 2  # 2 (K,V) * layers * kv heads * head dim * bf16
_LLAMA_70B_KV_BYTES = 2 * 80 * 8 * 128 * 2


@dataclass(frozen=True)
class PerfModel:
    """Latency coefficients and capacity of one engine (one TP group, one DP rank)."""

    name: str
    prefill_a_ms: float
    prefill_b_ms: float
    prefill_c_ms: float
    decode_d0_ms: float
    decode_d1_ms: float
    decode_d2_ms: float
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256

    def prefill_seconds(self, tokens: int) -> float:
        """Time of one forward pass that computes `tokens` new prompt tokens."""
        n = max(0, tokens)
        ms = self.prefill_a_ms + self.prefill_b_ms * n + self.prefill_c_ms * n * n
        return max(ms, _MIN_PREFILL_MS) * _MS

    def decode_step_seconds(self, batch: int, mean_context: float) -> float:
        """Time of one decode step producing one token for each of `batch` sequences."""
        b = max(0, batch)
        ctx = max(0.0, mean_context)
        ms = self.decode_d0_ms + self.decode_d1_ms * b + self.decode_d2_ms * b * ctx
        return ms * _MS

    def step_seconds(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_batch: int,
        decode_mean_context: float,
    ) -> float:
        """Time of one mixed engine step (chunked prefill plus the running decode batch).

        `prefill_chunks` holds (new tokens, tokens already computed) per prefilling request.
        A chunk of l new tokens after p cached ones costs c*l*(2p + l) of attention, so
        chunks of one prompt add up to exactly the single-pass c*n^2. Decode tokens ride in
        the same forward pass: the weights are read once, so the decode intercept d0 only
        sets a floor, and each decode sequence adds its d1 + d2*ctx share.
        """
        new = sum(max(0, n) for n, _ in prefill_chunks)
        if decode_batch <= 0:
            if new == 0:
                return 0.0
            attention = sum(max(0, n) * (2 * max(0, p) + max(0, n)) for n, p in prefill_chunks)
            ms = self.prefill_a_ms + self.prefill_b_ms * new + self.prefill_c_ms * attention
            return max(ms, _MIN_PREFILL_MS) * _MS
        decode_share = self.decode_step_seconds(decode_batch, decode_mean_context) - (
            self.decode_d0_ms * _MS
        )
        if new == 0:
            return self.decode_d0_ms * _MS + decode_share
        prefill = self.step_seconds(prefill_chunks, 0, 0.0)
        return max(prefill, self.decode_d0_ms * _MS) + decode_share

    def kv_transfer_seconds(
        self, tokens: int, bandwidth_bytes_per_s: float, latency_s: float = 1e-5
    ) -> float:
        """Time to move the KV cache of `tokens` prompt tokens over a link of that bandwidth."""
        if bandwidth_bytes_per_s <= 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
        return latency_s + max(0, tokens) * self.kv_bytes_per_token / bandwidth_bytes_per_s

    def blocks_for(self, tokens: int) -> int:
        """KV blocks needed to hold `tokens` tokens (vLLM allocates whole blocks)."""
        return -(-max(0, tokens) // self.block_size)

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size


def kv_capacity_tokens(
    gpu: str, gpus: int, params: float, kv_bytes_per_token: int, block_size: int = 16
) -> int:
    """Tokens of KV cache one instance holds: 90 % of HBM minus BF16 weights and a reserve."""
    free = (
        gpus * (_GPU_MEMORY_BYTES[gpu] * _GPU_MEMORY_UTILIZATION - _ACTIVATION_RESERVE_BYTES)
        - 2 * params
    )
    tokens = int(free // kv_bytes_per_token)
    return tokens - tokens % block_size


def _llama(
    name: str,
    gpu: str,
    tp: int,
    prefill: tuple[float, float, float],
    decode: tuple[float, float, float],
) -> PerfModel:
    big = name.startswith("llama-3.1-70b")
    params = _LLAMA_70B_PARAMS if big else _LLAMA_8B_PARAMS
    kv_bytes = _LLAMA_70B_KV_BYTES if big else _LLAMA_8B_KV_BYTES
    return PerfModel(
        name=name,
        prefill_a_ms=prefill[0],
        prefill_b_ms=prefill[1],
        prefill_c_ms=prefill[2],
        decode_d0_ms=decode[0],
        decode_d1_ms=decode[1],
        decode_d2_ms=decode[2],
        kv_bytes_per_token=kv_bytes,
        kv_capacity_tokens=kv_capacity_tokens(gpu, tp, params, kv_bytes),
    )


PRESETS: dict[str, PerfModel] = {
    m.name: m
    for m in (
        _llama("llama-3.1-8b-h200", "h200", 1, (1.48, 2.028e-2, 4.13e-7), (5.02, 0.0113, 2.90e-5)),
        _llama("llama-3.1-8b-h100", "h100", 1, (1.17, 2.075e-2, 3.73e-7), (6.57, 0.0093, 4.12e-5)),
        _llama(
            "llama-3.1-70b-h200-tp4",
            "h200",
            4,
            (-3.31, 6.534e-2, 4.57e-7),
            (12.00, 0.0353, 1.87e-5),
        ),
        _llama(
            "llama-3.1-70b-h200-tp8", "h200", 8, (1.98, 3.978e-2, 1.69e-7), (8.22, 0.0258, 9.44e-6)
        ),
        _llama(
            "llama-3.1-70b-h100-tp4", "h100", 4, (6.24, 6.251e-2, 4.42e-7), (15.21, 0.0326, 2.63e-5)
        ),
        _llama(
            "llama-3.1-70b-h100-tp8", "h100", 8, (8.91, 3.753e-2, 2.76e-7), (10.09, 0.0240, 1.32e-5)
        ),
    )
}


def preset(name: str) -> PerfModel:
    """The named preset; KeyError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise KeyError(f"unknown perf model preset {name!r}; known: {known}") from None
