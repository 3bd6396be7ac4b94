"""DynoSim's timing table: where it is sampled, how it is read, what it implies for capacity.

Where it fits: `runtime.build_table` samples aiconfigurator-core at the points chosen here and
saves them as DynoSim's NPZ (`planner_profile_data`: `prefill_isl`, `prefill_ttft_ms`,
`decode_active_kv_tokens`, `decode_context_length`, `decode_itl`). The harness reads the same
table back (as plain lists) for the policy's capacity priors and the calibration against
`pdfleet_worker.perfmodel`. The grid follows reference/autoscaling.md §1.7: prefill at 32 ISL
points linear in 16-1024 plus 64 linear in 1024-32768; decode on a 60x60 grid of active KV
tokens (0-800,000) x context length (1-32,768), batch = clamp(round(kv / ctx), 1, 1024).

Reading: prefill is linear interpolation in ISL; decode finds the grid cell of (active KV
tokens, context) and interpolates bilinearly (DynoSim itself looks the cell up; the two agree
on the grid points). Pure: no I/O, no numpy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

PREFILL_SHORT = (16, 1024, 32)
PREFILL_LONG = (1024, 32768, 64)
DECODE_KV = (0.0, 800_000.0, 60)
DECODE_CTX = (1.0, 32_768.0, 60)
MAX_DECODE_BATCH = 1024


def linspace(lo: float, hi: float, n: int) -> list[float]:
    if n == 1:
        return [lo]
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def prefill_points() -> list[int]:
    """ISL sample points, ascending and distinct."""
    pts = {int(x) for x in linspace(*PREFILL_SHORT)} | {int(x) for x in linspace(*PREFILL_LONG)}
    return sorted(pts)


def decode_batch(active_kv_tokens: float, context: float) -> int:
    """The batch a grid cell stands for: as many sequences of `context` as fill the KV."""
    return max(1, min(MAX_DECODE_BATCH, round(active_kv_tokens / max(context, 1.0))))


@dataclass(frozen=True)
class TimingTable:
    """The NPZ's arrays as lists (ms)."""

    prefill_isl: tuple[float, ...]
    prefill_ttft_ms: tuple[float, ...]
    decode_active_kv_tokens: tuple[float, ...]
    decode_context_length: tuple[float, ...]
    decode_itl: tuple[tuple[float, ...], ...]  # [kv index][context index]

    def arrays(self) -> dict[str, list[float] | list[list[float]]]:
        return {
            "prefill_isl": list(self.prefill_isl),
            "prefill_ttft_ms": list(self.prefill_ttft_ms),
            "decode_active_kv_tokens": list(self.decode_active_kv_tokens),
            "decode_context_length": list(self.decode_context_length),
            "decode_itl": [list(row) for row in self.decode_itl],
        }


def build(
    prefill_ms: Callable[[int], float], decode_ms: Callable[[int, int], float]
) -> TimingTable:
    """Sample `prefill_ms(isl)` (one request) and `decode_ms(batch, context)` on the grid."""
    isl = prefill_points()
    kv = linspace(*DECODE_KV)
    ctx = linspace(*DECODE_CTX)
    itl = tuple(tuple(decode_ms(decode_batch(k, c), round(c)) for c in ctx) for k in kv)
    return TimingTable(
        prefill_isl=tuple(float(n) for n in isl),
        prefill_ttft_ms=tuple(prefill_ms(n) for n in isl),
        decode_active_kv_tokens=tuple(kv),
        decode_context_length=tuple(ctx),
        decode_itl=itl,
    )


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x) - 1
    f = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ys[i] + f * (ys[i + 1] - ys[i])


def prefill_ms(t: TimingTable, tokens: float) -> float:
    return _interp(t.prefill_isl, t.prefill_ttft_ms, tokens)


def decode_ms(t: TimingTable, batch: int, context: float) -> float:
    """Step time of `batch` sequences of mean context `context` (bilinear in the grid)."""
    kv = batch * context
    column = [_interp(t.decode_context_length, row, context) for row in t.decode_itl]
    return _interp(t.decode_active_kv_tokens, column, kv)


def capacity_priors(
    t: TimingTable,
    ttft_s: float,
    itl_s: float,
    kv_tokens: int,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    isl: float = 2048.0,
    osl: float = 128.0,
) -> tuple[float, float]:
    """Prompt tokens/s of one prefill engine and generated tokens/s of one decode engine at
    the nominal request (2k prompt, 128 out), as `bench.capacity_priors` derives them from
    the perf model: prefill at the best batch meeting the TTFT SLO, times 0.8 for room to
    queue; decode at the best batch (Little's law) meeting the ITL SLO."""
    n = max(1, round(isl))
    best_p = best_p_any = 0.0
    for bs in range(1, max(1, min(max_num_seqs, max_num_batched_tokens // n)) + 1):
        ttft = prefill_ms(t, bs * n) / 1000.0
        rps = bs / ttft
        best_p_any = max(best_p_any, rps)
        if ttft <= ttft_s:
            best_p = max(best_p, rps)
    ctx = isl + osl / 2
    best_d = best_d_any = 0.0
    for bs in range(1, max(1, min(max_num_seqs, int(kv_tokens // ctx))) + 1):
        itl = decode_ms(t, bs, ctx) / 1000.0
        rps = bs / (osl * itl)
        best_d_any = max(best_d_any, rps)
        if itl <= itl_s:
            best_d = max(best_d, rps)
    return (best_p or best_p_any) * isl * 0.8, (best_d or best_d_any) * osl


def from_arrays(
    arrays: Mapping[str, Sequence[float] | Sequence[Sequence[float]]],
) -> TimingTable:
    """A table from the NPZ's arrays (lists or numpy arrays)."""

    def flat(key: str) -> tuple[float, ...]:
        return tuple(float(x) for x in arrays[key])  # type: ignore[arg-type]

    rows = arrays["decode_itl"]
    itl = tuple(tuple(float(x) for x in row) for row in rows)  # type: ignore[union-attr]
    out = TimingTable(
        flat("prefill_isl"),
        flat("prefill_ttft_ms"),
        flat("decode_active_kv_tokens"),
        flat("decode_context_length"),
        itl,
    )
    if any(not math.isfinite(v) or v <= 0 for v in out.prefill_ttft_ms):
        raise ValueError("prefill times must be positive")
    return out
