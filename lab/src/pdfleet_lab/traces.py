"""Request traces for the fleet simulator: Mooncake JSONL (plain or gzipped) and Azure CSV.

Where it fits: `pdfleet_lab.bench` loads a workload file with `load()` and hands the
`Workload` to `pdfleet_lab.sim`. Formats:
- Mooncake (FAST'25 release, and `../shared/traces/workloads/`): one JSON object a line with
  `timestamp` (ms since start), `input_length`, `output_length` (`hash_ids` is ignored: the
  simulator has no prefix cache).
- Azure LLM inference trace 2023: CSV `TIMESTAMP,ContextTokens,GeneratedTokens` with
  wall-clock timestamps; arrivals are taken relative to the first one, optionally time-compressed.
`step()` makes a synthetic load step from a trace's request sizes; `overlay()` and
`poisson()` build the held-out workloads (`heldout.py`) the way the shared ones were built.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival: seconds since start, prompt and output token counts."""

    name: str
    arrival_s: tuple[float, ...]
    input_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return self.arrival_s[-1] if self.arrival_s else 0.0

    def window(self, start_s: float, end_s: float) -> Workload:
        """The requests arriving in [start_s, end_s), re-based to start at 0."""
        rows = [(t - start_s, i, o) for t, i, o in self._rows() if start_s <= t < end_s]
        return _from_rows(f"{self.name}[{start_s:.0f},{end_s:.0f})", rows)

    def _rows(self) -> Iterator[tuple[float, int, int]]:
        return zip(self.arrival_s, self.input_tokens, self.output_tokens, strict=True)


def _from_rows(name: str, rows: Iterable[tuple[float, int, int]]) -> Workload:
    ordered = sorted(rows, key=lambda r: r[0])
    return Workload(
        name=name,
        arrival_s=tuple(r[0] for r in ordered),
        input_tokens=tuple(max(1, r[1]) for r in ordered),
        output_tokens=tuple(max(1, r[2]) for r in ordered),
    )


def parse_mooncake(lines: Iterable[str], name: str = "mooncake") -> Workload:
    """Mooncake JSONL lines -> Workload (blank lines skipped)."""
    rows = []
    for line in lines:
        if not line.strip():
            continue
        obj = json.loads(line)
        rows.append(
            (float(obj["timestamp"]) / 1000.0, int(obj["input_length"]), int(obj["output_length"]))
        )
    return _from_rows(name, rows)


def _parse_azure_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, more than fromisoformat takes
    head, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(head).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def parse_azure(lines: Iterable[str], name: str = "azure", speedup: float = 1.0) -> Workload:
    """Azure CSV lines (with header) -> Workload; `speedup` > 1 compresses time."""
    reader = csv.DictReader(lines)
    raw = [
        (_parse_azure_time(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for r in reader
    ]
    if not raw:
        return _from_rows(name, [])
    t0 = min(r[0] for r in raw)
    return _from_rows(name, [((t - t0) / speedup, i, o) for t, i, o in raw])


def step(
    sizes: Workload, rate_rps: float, factor: float, at_s: float, duration_s: float,
    name: str, seed: int = 5,
) -> Workload:  # fmt: skip
    """A load step: Poisson arrivals at `rate_rps` until `at_s`, `factor` times as many after,
    until `duration_s`; each request's prompt and output lengths drawn from `sizes`."""
    rng = random.Random(seed)
    rows: list[tuple[float, int, int]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_rps * (factor if t >= at_s else 1.0))
        if t >= duration_s:
            return _from_rows(name, rows)
        i = rng.randrange(len(sizes))
        rows.append((t, sizes.input_tokens[i], sizes.output_tokens[i]))


def overlay(
    source: Workload, copies: int, seed: int, name: str, max_offset_s: float = 60.0
) -> Workload:
    """`copies` copies of a trace laid over each other, each shifted by a uniform random
    offset of up to `max_offset_s`; requests shifted past the source's end are dropped (the
    recipe of ../shared/traces/workloads: the trace's own burst shape, `copies` times the load)."""
    rng = random.Random(seed)
    end = source.duration_s
    rows: list[tuple[float, int, int]] = []
    for _ in range(copies):
        offset = rng.uniform(0.0, max_offset_s)
        rows.extend((t + offset, i, o) for t, i, o in source._rows() if t + offset <= end)
    return _from_rows(name, rows)


def poisson(
    rate_at: Callable[[float], float],
    sizes_at: Callable[[float], Workload],
    duration_s: float,
    name: str,
    seed: int,
) -> Workload:
    """Poisson arrivals whose rate (requests/s) follows `rate_at(t)`, by thinning at the
    highest rate of a one-second grid; each request's prompt and output lengths drawn from
    the trace `sizes_at(t)` names for its arrival time."""
    rng = random.Random(seed)
    top = max(rate_at(float(s)) for s in range(int(duration_s) + 1))
    rows: list[tuple[float, int, int]] = []
    t = 0.0
    while top > 0:
        t += rng.expovariate(top)
        if t >= duration_s:
            break
        if rng.random() * top < rate_at(t):
            sizes = sizes_at(t)
            i = rng.randrange(len(sizes))
            rows.append((t, sizes.input_tokens[i], sizes.output_tokens[i]))
    return _from_rows(name, rows)


def to_mooncake(wl: Workload, block_tokens: int = 512) -> Iterator[dict[str, object]]:
    """Mooncake records of a workload, hash ids unique per request and per `block_tokens`
    block (no prefix shared, as in ../shared/traces/workloads)."""
    next_id = 0
    for t, i, o in wl._rows():
        blocks = -(-i // block_tokens)
        ids = list(range(next_id, next_id + blocks))
        next_id += blocks
        yield {"timestamp": t * 1000.0, "input_length": i, "output_length": o, "hash_ids": ids}


def load(path: str | Path, speedup: float = 1.0) -> Workload:
    """Load a trace file, choosing the format from its name (.csv, .jsonl, .jsonl.gz)."""
    p = Path(path)
    name = p.name.removesuffix(".gz").removesuffix(".jsonl").removesuffix(".csv")
    raw = p.read_bytes()
    if p.suffix == ".gz":
        raw = gzip.decompress(raw)
    text = io.StringIO(raw.decode("utf-8"))
    if p.name.removesuffix(".gz").endswith(".csv"):
        return parse_azure(text, name=name, speedup=speedup)
    wl = parse_mooncake(text, name=name)
    if speedup != 1.0:
        wl = _from_rows(name, [(t / speedup, i, o) for t, i, o in wl._rows()])
    return wl
