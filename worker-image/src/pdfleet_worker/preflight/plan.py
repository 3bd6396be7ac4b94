"""The preflight's pure part: KV payload from model geometry, the transport UCX chose, results.

Where it fits: `transfer` (NIXL I/O) lays its buffers out with `layout()`, the decode-side
run reads the transport out of UCX's protocol report with `transport_from_ucx()`, and the
operator (pdfleet.preflight) uses `KVCacheShape` to turn the measured bandwidth into the time a
typical prompt's KV cache takes. No I/O here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdfleet_wire.preflight import KVCacheShape, TransportKind

# UCX transport names (the part before "/" in "rc_mlx5/mlx5_0:1") by the path they take.
_RDMA_PREFIXES = ("rc", "dc", "ud", "srd", "gga")
_SHM = frozenset({"sysv", "posix", "cma", "knem", "xpmem"})
# Faster first: a table whose lanes mix kinds is as good as its best lane.
_KIND_ORDER: tuple[TransportKind, ...] = (
    "rdma", "cuda_ipc", "shm", "cuda_copy", "self", "tcp", "unknown",
)  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """The descriptors one transfer reads: like vLLM, one per (K or V, layer, block)."""

    descriptors: int
    descriptor_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.descriptors * self.descriptor_bytes


def layout(geometry: KVCacheShape, tokens: int, block_size: int, tp: int = 1) -> Layout:
    """The KV cache of a `tokens`-long prompt as vLLM's NixlConnector reads it: whole blocks,
    K and V of each layer in separate regions, so 2 x layers x blocks descriptors."""
    if tokens < 1 or block_size < 1:
        raise ValueError(f"tokens ({tokens}) and block size ({block_size}) must be positive")
    blocks = math.ceil(tokens / block_size)
    per_block = block_size * geometry.heads_per_rank(tp) * geometry.head_dim
    return Layout(2 * geometry.layers * blocks, per_block * geometry.dtype_bytes)


def transfer_seconds(total_bytes: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """Time to move `total_bytes` over a link measured at that bandwidth and latency."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
    return latency_s + total_bytes / bandwidth_bytes_per_s


# --------------------------------------------------------------------------------------------
# What UCX chose: its protocol report (UCX_PROTO_INFO=y), one table per operation, e.g.
#   | initiator intra-node cfg#1                                       |
#   | remote memory read by ucp_get*(multi) into host memory from host |
#   | 0..inf | software emulation | tcp/lo                             |
# NIXL's READ is ucp_get, so the "remote memory read" tables name the transport of the data.

_READ_TITLE = "remote memory read by ucp_get"
_RANGE = re.compile(r"^(\d+(?:\.\d+)?[KMGT]?)(?:\.\.(\d+(?:\.\d+)?[KMGT]?|inf))?$")
_LANE = re.compile(r"([a-z][a-z0-9_]*)/([A-Za-z0-9_.:-]+)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> float:
    if text == "inf":
        return math.inf
    unit = text[-1] if text[-1] in _UNITS else ""
    return float(text[: len(text) - len(unit)]) * _UNITS[unit]


def _cells(line: str) -> list[str] | None:
    """The cells of one table row, without UCX's log prefix; None for other lines."""
    start = line.find("|")
    if start < 0 or not line.rstrip().endswith("|"):
        return None
    return [c.strip() for c in line[start:].strip().strip("|").split("|")]


def read_lanes(report: str, size: int) -> list[str]:
    """The transports ("tcp/lo", "rc_mlx5/mlx5_0:1") of every remote-read table row whose
    message-size range holds `size`, in report order, without repeats."""
    lanes: list[str] = []
    in_read = False
    for line in report.splitlines():
        cells = _cells(line)
        if cells is None:
            continue
        if len(cells) == 1:
            in_read = cells[0].startswith(_READ_TITLE) or (in_read and "cfg#" not in cells[0])
            continue
        match = _RANGE.match(cells[0]) if in_read and len(cells) >= 3 else None
        if match is None:
            continue
        low = _size(match.group(1))
        high = _size(match.group(2)) if match.group(2) else low
        if low <= size <= high:
            for tl, dev in _LANE.findall(cells[-1]):
                lane = f"{tl}/{dev}"
                if lane not in lanes:
                    lanes.append(lane)
    return lanes


def transport_kind(lane: str) -> TransportKind:
    """rdma, cuda_ipc, cuda_copy, shm, tcp, self or unknown for a UCX lane name."""
    tl = lane.split("/", 1)[0]
    if tl.startswith(_RDMA_PREFIXES):
        return "rdma"
    if tl in ("cuda_ipc", "cuda_copy", "tcp", "self"):
        return tl  # type: ignore[return-value]
    if tl in _SHM:
        return "shm"
    return "unknown"


def best_kind(lanes: Iterable[str]) -> TransportKind:
    kinds = {transport_kind(lane) for lane in lanes}
    return next((k for k in _KIND_ORDER if k in kinds), "unknown")


def describe(lanes: Sequence[str]) -> str:
    """ "tcp/lo" or "rc_mlx5/mlx5_0:1+rc_mlx5/mlx5_1:1"; "unknown" without a report."""
    return "+".join(lanes) if lanes else "unknown"
