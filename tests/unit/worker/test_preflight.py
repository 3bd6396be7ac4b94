"""The preflight's pure parts on the worker side: KV payload from model geometry, the
transport read from UCX's protocol report, the fill pattern, and the result record."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pdfleet_wire.preflight as wire
from pdfleet_worker.preflight import plan, transfer

LLAMA_8B = wire.KVCacheShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
LLAMA_70B = wire.KVCacheShape(layers=80, kv_heads=8, head_dim=128, dtype_bytes=2)
# Captured from a real two-process READ (nixl-cu12 1.5.1's bundled UCX, UCX_TLS=tcp,
# UCX_NET_DEVICES=lo, UCX_PROTO_INFO=y): the initiator's whole output.
TCP_REPORT = (Path(__file__).parents[2] / "cases" / "ucx_proto_info_tcp.txt").read_text()


@pytest.mark.parametrize(
    ("geometry", "tp", "per_token"),
    [
        (LLAMA_8B, 1, 131_072),  # 128 KiB, reference/autoscaling.md
        (LLAMA_70B, 1, 327_680),  # 320 KiB
        (LLAMA_70B, 4, 81_920),  # 2 of 8 KV heads per rank
        (LLAMA_8B, 16, 16_384),  # more ranks than KV heads: one (replicated) head each
        (wire.KVCacheShape(32, 8, 128, 1), 1, 65_536),  # fp8 KV halves it
    ],
)
def test_bytes_per_token(geometry: wire.KVCacheShape, tp: int, per_token: int) -> None:
    assert geometry.bytes_per_token(tp) == per_token


def test_layout_is_one_descriptor_per_k_or_v_layer_block() -> None:
    lay = plan.layout(LLAMA_8B, tokens=4096, block_size=16)
    assert (lay.descriptors, lay.descriptor_bytes) == (2 * 32 * 256, 16 * 8 * 128 * 2)
    assert lay.total_bytes == 4096 * LLAMA_8B.bytes_per_token() == 512 << 20
    # A partial last block still moves whole blocks, as vLLM allocates them.
    assert plan.layout(LLAMA_8B, tokens=17, block_size=16).descriptors == 2 * 32 * 2
    with pytest.raises(ValueError, match="positive"):
        plan.layout(LLAMA_8B, tokens=0, block_size=16)


def test_transfer_seconds() -> None:
    assert plan.transfer_seconds(512 << 20, 50e9, 1e-5) == pytest.approx(0.010747, rel=1e-3)
    with pytest.raises(ValueError, match="positive"):
        plan.transfer_seconds(1, 0.0, 0.0)


def test_read_lanes_from_a_real_tcp_report() -> None:
    assert plan.read_lanes(TCP_REPORT, 32_768) == ["tcp/lo"]
    assert plan.best_kind(plan.read_lanes(TCP_REPORT, 32_768)) == "tcp"
    # Only remote-read tables count: the report also has put and active-message tables.
    assert plan.read_lanes("no report at all", 32_768) == []


def _rdma_report(config: str, ranges: str = "0..inf") -> str:
    """The real report with the read table's row rewritten: the layout UCX prints for an
    RDMA read (not captured on a real HCA here; the row format is the same)."""
    return re.sub(
        r"\| 0\.\.inf \| software emulation \| tcp/lo\s+\|",
        f"| {ranges} | zero-copy | {config} |",
        TCP_REPORT,
    )


@pytest.mark.parametrize(
    ("config", "size", "lanes", "kind"),
    [
        ("rc_mlx5/mlx5_0:1", 32_768, ["rc_mlx5/mlx5_0:1"], "rdma"),
        ("50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_3:1", 32_768,
         ["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_3:1"], "rdma"),
        ("cuda_ipc/cuda", 32_768, ["cuda_ipc/cuda"], "cuda_ipc"),
        ("srd/rdmap16s27:1", 32_768, ["srd/rdmap16s27:1"], "rdma"),
        ("cma/memory", 32_768, ["cma/memory"], "shm"),
    ],
)  # fmt: skip
def test_read_lanes_kinds(config: str, size: int, lanes: list[str], kind: str) -> None:
    found = plan.read_lanes(_rdma_report(config), size)
    assert found == lanes and plan.best_kind(found) == kind


def test_read_lanes_picks_the_row_for_the_descriptor_size() -> None:
    report = _rdma_report("rc_mlx5/mlx5_0:1", ranges="0..8K") + "\n" + TCP_REPORT
    assert plan.read_lanes(report, 4096) == ["rc_mlx5/mlx5_0:1", "tcp/lo"]
    assert plan.read_lanes(report, 32_768) == ["tcp/lo"]


def test_best_kind_prefers_the_fast_lane() -> None:
    assert plan.best_kind(["tcp/eth0", "rc_mlx5/mlx5_0:1"]) == "rdma"
    assert plan.best_kind([]) == "unknown"
    assert plan.transport_kind("weird/x") == "unknown"


def test_fill_and_verify_catch_misplaced_bytes() -> None:
    buf = np.zeros(3 * (1 << 20) + 5, dtype=np.uint8)
    transfer.fill(buf, seed=7)
    assert transfer.verify(buf, seed=7) and not transfer.verify(buf, seed=8)
    moved = buf.copy()
    moved[: 1 << 20], moved[1 << 20 : 2 << 20] = buf[1 << 20 : 2 << 20], buf[: 1 << 20]
    assert not transfer.verify(moved, seed=7)  # right bytes, wrong place
    buf[-1] ^= 1
    assert not transfer.verify(buf, seed=7)


def test_descs_are_consecutive_blocks() -> None:
    rows = transfer.descs(4096, plan.Layout(3, 100), device=2)
    assert rows.tolist() == [[4096, 100, 2], [4196, 100, 2], [4296, 100, 2]]


@pytest.mark.parametrize(
    ("env", "memory"),
    [
        ({}, "VRAM"),
        ({"PDFLEET_KV_BUFFER_DEVICE": "cpu"}, "DRAM"),
        ({"PDFLEET_ENGINE": "sim", "PDFLEET_KV_BUFFER_DEVICE": "cuda"}, "DRAM"),
    ],
)
def test_default_memory_follows_the_kv_buffer(env: dict[str, str], memory: str) -> None:
    assert transfer.default_memory(env) == memory


def test_result_round_trip_and_bandwidth() -> None:
    result = wire.PreflightResult(
        ok=True, total_bytes=1000, seconds=(2.0, 1.0, 4.0), lanes=("tcp/lo",), latency_s=0.001
    )
    assert result.bandwidth_bytes_per_s == 500.0  # median time
    again = wire.PreflightResult.from_json(result.to_json())
    assert again == result
    assert wire.failed("x").bandwidth_bytes_per_s is None


def test_request_round_trip() -> None:
    request = wire.PreflightRequest("http://10.0.0.1:5590", 512, 16, LLAMA_8B, tp=2, iterations=3)
    assert wire.PreflightRequest.from_json(request.to_json()) == request
