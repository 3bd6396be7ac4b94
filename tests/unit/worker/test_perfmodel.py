"""Unit tests for the engine latency model shared by the worker and fleet simulators."""

from __future__ import annotations

import dataclasses

import pytest

from pdfleet_worker.perfmodel import PRESETS, PerfModel, kv_capacity_tokens, preset

EXPECTED_PRESETS = {
    "llama-3.1-8b-h200",
    "llama-3.1-8b-h100",
    "llama-3.1-70b-h200-tp4",
    "llama-3.1-70b-h200-tp8",
    "llama-3.1-70b-h100-tp4",
    "llama-3.1-70b-h100-tp8",
}


def test_presets_are_the_documented_set() -> None:
    assert set(PRESETS) == EXPECTED_PRESETS
    assert all(name == m.name for name, m in PRESETS.items())


# Prefill, single request, against the aiconfigurator table the fits came from (autoscaling.md
# §5.2). The fit is a quadratic, so the tolerance is loose at the short end and tight above 2k.
@pytest.mark.parametrize(
    ("name", "tokens", "table_ms", "rel_tol"),
    [
        ("llama-3.1-8b-h200", 2048, 43.4, 0.05),
        ("llama-3.1-8b-h200", 8192, 198.9, 0.05),
        ("llama-3.1-8b-h100", 16384, 440.2, 0.05),
        ("llama-3.1-70b-h200-tp4", 4096, 266.6, 0.05),
        ("llama-3.1-70b-h200-tp8", 8192, 334.1, 0.05),
        ("llama-3.1-70b-h100-tp4", 32768, 2531.3, 0.05),
        ("llama-3.1-8b-h200", 512, 11.5, 0.15),
    ],
)
def test_prefill_tracks_measured_table(
    name: str, tokens: int, table_ms: float, rel_tol: float
) -> None:
    assert preset(name).prefill_seconds(tokens) == pytest.approx(table_ms / 1e3, rel=rel_tol)


@pytest.mark.parametrize(
    ("name", "batch", "table_ms"),
    [
        ("llama-3.1-8b-h200", 1, 4.91),
        ("llama-3.1-8b-h200", 128, 13.90),
        ("llama-3.1-8b-h100", 64, 12.56),
        ("llama-3.1-70b-h200-tp4", 256, 31.17),
        ("llama-3.1-70b-h200-tp8", 32, 9.43),
        ("llama-3.1-70b-h100-tp4", 8, 16.16),
    ],
)
def test_decode_step_tracks_measured_table(name: str, batch: int, table_ms: float) -> None:
    # The table is at context 2048 per request.
    got = preset(name).decode_step_seconds(batch, 2048)
    assert got == pytest.approx(table_ms / 1e3, rel=0.06)


def test_prefill_formula_exact() -> None:
    m = preset("llama-3.1-8b-h200")
    n = 1000
    assert m.prefill_seconds(n) == pytest.approx((1.48 + 2.028e-2 * n + 4.13e-7 * n * n) / 1e3)


@pytest.mark.parametrize("tokens", [-5, 0, 1, 10])
def test_prefill_clamped_to_positive_floor(tokens: int) -> None:
    # 70B H200 TP4 has a negative intercept; short batches must still take positive time.
    got = preset("llama-3.1-70b-h200-tp4").prefill_seconds(tokens)
    assert got >= 0.5e-3


def test_prefill_monotonic_above_floor() -> None:
    m = preset("llama-3.1-70b-h200-tp4")
    times = [m.prefill_seconds(n) for n in range(0, 40000, 500)]
    assert times == sorted(times)


def test_decode_step_formula_and_clamping() -> None:
    m = preset("llama-3.1-8b-h100")
    assert m.decode_step_seconds(4, 1000.0) == pytest.approx(
        (6.57 + 0.0093 * 4 + 4.12e-5 * 4 * 1000) / 1e3
    )
    assert m.decode_step_seconds(-1, -3.0) == pytest.approx(6.57e-3)


@pytest.mark.parametrize(
    ("name", "tokens", "bw", "expected_s"),
    [
        # autoscaling.md §5.3: 8B, 8k prompt = 1.07 GB, ~21 ms over one 50 GB/s NIC.
        ("llama-3.1-8b-h200", 8192, 50e9, 0.0215),
        # ~2.4 ms over NVLink (450 GB/s).
        ("llama-3.1-8b-h200", 8192, 450e9, 0.0024),
        # 70B 8k = 2.68 GB over 4 NICs (200 GB/s) ~13 ms.
        ("llama-3.1-70b-h200-tp4", 8192, 200e9, 0.0134),
    ],
)
def test_kv_transfer(name: str, tokens: int, bw: float, expected_s: float) -> None:
    assert preset(name).kv_transfer_seconds(tokens, bw) == pytest.approx(expected_s, rel=0.05)


def test_kv_transfer_latency_and_bad_bandwidth() -> None:
    m = preset("llama-3.1-8b-h200")
    assert m.kv_transfer_seconds(0, 1e9, latency_s=0.002) == pytest.approx(0.002)
    with pytest.raises(ValueError, match="bandwidth"):
        m.kv_transfer_seconds(10, 0.0)


@pytest.mark.parametrize(
    ("name", "kv_bytes", "low", "high"),
    [
        # autoscaling.md §5.1: 128 KiB/token for 8B, 320 KiB for 70B; ~0.8 M tokens on an H200,
        # ~0.4 M on an H100 for 8B TP1.
        ("llama-3.1-8b-h200", 131072, 0.75e6, 0.85e6),
        ("llama-3.1-8b-h100", 131072, 0.35e6, 0.45e6),
        ("llama-3.1-70b-h200-tp4", 327680, 0.9e6, 1.2e6),
        ("llama-3.1-70b-h200-tp8", 327680, 2.3e6, 2.8e6),
        ("llama-3.1-70b-h100-tp4", 327680, 0.3e6, 0.5e6),
        ("llama-3.1-70b-h100-tp8", 327680, 1.0e6, 1.4e6),
    ],
)
def test_kv_sizes(name: str, kv_bytes: int, low: float, high: float) -> None:
    m = preset(name)
    assert m.kv_bytes_per_token == kv_bytes
    assert low <= m.kv_capacity_tokens <= high
    assert m.kv_capacity_tokens % m.block_size == 0


def test_blocks() -> None:
    m = preset("llama-3.1-8b-h200")
    assert [m.blocks_for(n) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
    assert m.kv_capacity_blocks * m.block_size == m.kv_capacity_tokens


def test_capacity_helper_never_negative_tokens_rounding() -> None:
    assert kv_capacity_tokens("h200", 1, 8.03e9, 131072, block_size=16) % 16 == 0


def test_unknown_preset_lists_known_names() -> None:
    with pytest.raises(KeyError) as err:
        preset("gpt-5")
    assert "llama-3.1-8b-h200" in str(err.value)


def test_frozen_and_vllm_defaults() -> None:
    m = preset("llama-3.1-8b-h200")
    assert (m.block_size, m.max_num_batched_tokens, m.max_num_seqs) == (16, 8192, 256)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "x"  # type: ignore[misc]
    custom = dataclasses.replace(m, name="tiny", kv_capacity_tokens=1024)
    assert isinstance(custom, PerfModel)
    assert custom.kv_capacity_blocks == 64


def test_step_pure_prefill_equals_single_pass() -> None:
    m = preset("llama-3.1-8b-h200")
    assert m.step_seconds([(3000, 0)], 0, 0.0) == pytest.approx(m.prefill_seconds(3000))
    assert m.step_seconds([], 0, 0.0) == 0.0


def test_step_chunked_attention_adds_up_to_single_pass() -> None:
    # Two chunks of 4096 of one 8192 prompt: the quadratic terms sum to c*8192^2.
    m = preset("llama-3.1-8b-h200")
    two = m.step_seconds([(4096, 0)], 0, 0.0) + m.step_seconds([(4096, 4096)], 0, 0.0)
    one = m.prefill_seconds(8192)
    assert two - one == pytest.approx(m.prefill_a_ms / 1e3)


def test_step_pure_decode_and_mixed() -> None:
    m = preset("llama-3.1-8b-h200")
    assert m.step_seconds([], 8, 1000.0) == pytest.approx(m.decode_step_seconds(8, 1000.0))
    share = m.decode_step_seconds(8, 1000.0) - m.decode_d0_ms / 1e3
    # A big chunk dominates the weight read; a tiny one does not.
    assert m.step_seconds([(4000, 0)], 8, 1000.0) == pytest.approx(m.prefill_seconds(4000) + share)
    assert m.step_seconds([(1, 0)], 8, 1000.0) == pytest.approx(m.decode_step_seconds(8, 1000.0))
