"""DynoSim's per-tick data as the vLLM metric families the operator's queries read.

Where it fits: `ticker.Ticker` hands each tick's data from DynoSim here; `FleetSignals` keeps
one `pdfleet_lab.exporter.EngineFamilies` per worker, updates it from the tick, scrapes every
engine into a `pdfleet_lab.tsdb.SimPrometheus` at the tick (every 15 s) and reads the window
back through the operator's `PrometheusSource`, as `pdfleet_lab.sim.FleetSim` does.

What DynoSim 1.3.1 gives a planner per tick (`PlannerReplayBridge.run` -> `on_tick(metrics)`):
one snapshot per engine forward pass (`*_fpm_snapshots`: worker id, pass wall time, requests
and tokens scheduled, requests and tokens queued), the worker counts (`active_*` = ready,
`total_*` = desired), and the tick's traffic window (`traffic`: request count, mean ISL, OSL,
TTFT, ITL). It gives no per-request events. The families follow:

- exact from the passes: prompt tokens of a prefill engine (tokens computed), generated tokens
  of a decode engine (one per running sequence per pass), every inter-token latency (a pass
  of B sequences is B observations of its wall time), the waiting gauge (the queue in the
  worker's last pass of the tick), KV usage (scheduled KV tokens of that pass over capacity);
- estimated (no per-request times): finished requests per engine (its tokens over the tick's
  mean ISL or OSL); prefill TTFT, from each pass's queue: a request arriving during a pass
  waits for the queued tokens at the pass's rate, then its own prefill (PASTA: each pass is
  weighted by its duration, idle time by itself at the mean prompt's prefill time), scaled to
  the worker's estimated request count; prefill queue time as those waits alone (none while
  idle); decode TTFT as the KV transfer of the mean prompt
  plus the worker's mean step; per-request time per output token from the worker's passes:
  a request decodes one token per pass of its worker, so one of the mean output length
  that finishes at a pass had the mean time of the passes before it, back one output
  (`request_tpot_samples`; the passes of earlier ticks carry over). Requests shorter or
  longer than the mean would spread it further.
Pure: no dynamo import.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.autoscale.metrics import PrometheusSource
from pdfleet.autoscale.policy import MetricsWindow
from pdfleet_lab.exporter import NAMESPACE, SERVICE, EngineFamilies
from pdfleet_lab.tsdb import SimPrometheus

Snapshot = Mapping[str, Any]

# Decode passes remembered per worker: a request of the mean output length lived through
# that many (the workloads' outputs are a few hundred tokens).
STEPS_KEPT = 8192


def by_worker(snaps: Sequence[Snapshot]) -> dict[int, list[Snapshot]]:
    """Snapshots grouped by worker id, in pass order."""
    out: dict[int, list[Snapshot]] = {}
    for s in snaps:
        out.setdefault(int(s["worker_id"]), []).append(s)
    return out


def prefill_pass_waits(passes: Sequence[Snapshot]) -> list[tuple[float, float]]:
    """(queue wait, wall time) of each pass of one prefill worker that computed tokens: a
    pass of wall time w computing n tokens with q tokens queued behind it has an arrival
    wait q * w / n before its first step."""
    out: list[tuple[float, float]] = []
    for s in passes:
        wall = float(s["wall_time"])
        tokens = float(s["sum_prefill_tokens"])
        if wall > 0 and tokens > 0:
            out.append((float(s["sum_queued_prefill_tokens"]) * wall / tokens, wall))
    return out


def prefill_ttft_samples(
    passes: Sequence[Snapshot], tick_s: float, idle_ttft_s: float
) -> list[tuple[float, float]]:
    """(TTFT, weight) of requests arriving at one prefill worker during a tick: its wait,
    then about one pass. The weight is the time the state held (arrivals are spread over
    time), the idle rest of the tick at `idle_ttft_s`."""
    return _with_idle([(wait + wall, wall) for wait, wall in prefill_pass_waits(passes)],
                      tick_s, idle_ttft_s)  # fmt: skip


def prefill_queue_samples(passes: Sequence[Snapshot], tick_s: float) -> list[tuple[float, float]]:
    """(queue wait, weight) of the same arrivals: none while the worker idles."""
    return _with_idle([(wait, wall) for wait, wall in prefill_pass_waits(passes)], tick_s, 0.0)


def _with_idle(
    busy: list[tuple[float, float]], tick_s: float, idle_value: float
) -> list[tuple[float, float]]:
    idle = tick_s - sum(w for _, w in busy)
    return [*busy, (idle_value, idle)] if idle > 0 else busy


def scaled(samples: Sequence[tuple[float, float]], count: float) -> list[tuple[float, float]]:
    """The samples re-weighted to add up to `count` observations."""
    total = sum(w for _, w in samples)
    if total <= 0 or count <= 0:
        return []
    return [(v, w * count / total) for v, w in samples]


def mean_step(passes: Sequence[Snapshot]) -> float:
    """Token-weighted mean decode step time of a worker's passes (NaN when it decoded
    nothing)."""
    tokens = sum(float(s["num_decode_requests"]) for s in passes)
    if tokens <= 0:
        return math.nan
    return sum(float(s["num_decode_requests"]) * float(s["wall_time"]) for s in passes) / tokens


def request_tpot_samples(
    steps: Sequence[float], batches: Sequence[float], osl: float
) -> list[tuple[float, float]]:
    """(time per output token, weight) of the requests finishing at each of a worker's last
    `len(batches)` passes, whose wall times end `steps` (earlier passes before them).

    A request of `osl` tokens gets its first from prefill and one per decode pass after, so
    its time per output token is the mean of the `osl - 1` passes it finished with (fewer at
    the start of the run). Of a pass's `batch` sequences, about `batch / osl` finish there:
    the weight."""
    span = max(1, round(osl) - 1)
    first = len(steps) - len(batches)
    sums = [0.0]
    for wall in steps:
        sums.append(sums[-1] + wall)
    out: list[tuple[float, float]] = []
    for i, batch in enumerate(batches):
        end = first + i + 1
        start = max(0, end - span)
        if batch > 0:
            out.append(((sums[end] - sums[start]) / (end - start), batch))
    return out


def apply_prefill(
    engine: EngineFamilies,
    passes: Sequence[Snapshot],
    tick_s: float,
    mean_isl: float,
    idle_ttft_s: float,
) -> float:
    """A prefill worker's tick into its families; returns the requests it is credited with."""
    tokens = sum(float(s["sum_prefill_tokens"]) for s in passes)
    requests = tokens / mean_isl if mean_isl > 0 else 0.0
    engine.prompt_tokens += tokens
    for value, weight in scaled(prefill_ttft_samples(passes, tick_s, idle_ttft_s), requests):
        engine.ttft.observe(value, weight)
    for value, weight in scaled(prefill_queue_samples(passes, tick_s), requests):
        engine.queue_time.observe(value, weight)
    # P/D: the prefill engine emits each request's first token and finishes it there.
    if requests > 0:
        engine.generation_tokens += requests
        engine.itl.observe(0.0, requests)
        engine.requests += requests
    return requests


def apply_decode(
    engine: EngineFamilies,
    passes: Sequence[Snapshot],
    mean_isl: float,
    mean_osl: float,
    kv_transfer_s: float,
    earlier: Sequence[float] = (),
) -> float:
    """A decode worker's tick into its families; returns the requests it is credited with.
    `earlier`: the wall times of the worker's decode passes before this tick, oldest first
    (the requests finishing now started in them)."""
    decoding = [s for s in passes if float(s["num_decode_requests"]) > 0]
    batches = [float(s["num_decode_requests"]) for s in decoding]
    walls = [float(s["wall_time"]) for s in decoding]
    for batch, wall in zip(batches, walls, strict=True):
        engine.decoded(batch, wall)
    requests = sum(batches) / mean_osl if mean_osl > 0 else 0.0
    step = mean_step(passes)
    if requests > 0 and not math.isnan(step):
        engine.prompt_tokens += requests * mean_isl  # the prompt again, as external KV
        engine.ttft.observe(kv_transfer_s + step, requests)
        samples = request_tpot_samples([*earlier, *walls], batches, mean_osl)
        for value, weight in scaled(samples, requests):
            engine.tpot.observe(value, weight)
        engine.requests += requests
    return requests


def last_load(
    passes: Sequence[Snapshot], role: str, kv_capacity_tokens: int
) -> tuple[float, float]:
    """(requests waiting, KV usage) as the worker's last pass of the tick leaves them."""
    if not passes:
        return 0.0, 0.0
    s = passes[-1]
    if role == "prefill":
        waiting = float(s["num_queued_prefill"])
        kv = float(s["sum_prefill_kv_tokens"]) + float(s["sum_prefill_tokens"])
    else:
        waiting = float(s["num_queued_decode"])
        kv = float(s["sum_decode_kv_tokens"])
    return waiting, min(kv / kv_capacity_tokens, 1.0) if kv_capacity_tokens > 0 else 0.0


def live_ids(known: Sequence[int], seen: Sequence[int], active: int) -> list[int]:
    """Workers to scrape: those that ran a pass this tick (draining ones too) and the
    lowest-numbered known ones up to the ready count (DynoSim removes the highest ids
    first); idle ready workers never seen get fresh ids."""
    ids = set(seen) | set(sorted(known)[:active])
    nxt = max([*known, *seen], default=-1) + 1
    while len(ids) < active:
        ids.add(nxt)
        nxt += 1
    return sorted(ids)


@dataclass
class FleetSignals:
    """The engines' families, the in-memory Prometheus and the operator's source over it."""

    kv_capacity_tokens: int
    kv_transfer_s_per_token: float
    idle_prefill_ms: Any  # (tokens) -> ms: the timing table's prefill time
    percentile: float = 95.0
    window_s: float = 60.0
    engines: dict[tuple[str, int], EngineFamilies] = field(default_factory=dict)
    # each decode worker's latest pass times, as long as the longest output needs
    decode_steps: dict[int, deque[float]] = field(default_factory=dict)
    prometheus: SimPrometheus = field(default_factory=SimPrometheus)
    last_tick_s: float = 0.0
    source: PrometheusSource = field(init=False)

    def __post_init__(self) -> None:
        self.source = PrometheusSource("dynosim", client=self.prometheus)

    def _engine(self, role: str, idx: int) -> EngineFamilies:
        key = (role, idx)
        if key not in self.engines:
            self.engines[key] = EngineFamilies(role, f"{role}-{idx}")
        return self.engines[key]

    def observe(self, now_s: float, tick: Mapping[str, Any]) -> None:
        """One tick's data into the families, then every live engine scraped at `now_s`."""
        tick_s = max(now_s - self.last_tick_s, 1e-9)
        self.last_tick_s = now_s
        traffic = tick.get("traffic") or {}
        isl = float(traffic.get("avg_isl") or 0.0)
        osl = float(traffic.get("avg_osl") or 0.0)
        for role in ("prefill", "decode"):
            groups = by_worker(tick.get(f"{role}_fpm_snapshots") or [])
            known = sorted(i for r, i in self.engines if r == role)
            active = int(tick.get(f"active_{role}_count", 0))
            for idx in live_ids(known, list(groups), active):
                engine = self._engine(role, idx)
                passes = groups.get(idx, [])
                if role == "prefill":
                    idle = self.idle_prefill_ms(isl) / 1000.0 if isl > 0 else 0.0
                    apply_prefill(engine, passes, tick_s, isl, idle)
                else:
                    kv_s = isl * self.kv_transfer_s_per_token
                    steps = self.decode_steps.setdefault(idx, deque(maxlen=STEPS_KEPT))
                    apply_decode(engine, passes, isl, osl, kv_s, steps)
                    steps.extend(
                        float(s["wall_time"]) for s in passes if float(s["num_decode_requests"]) > 0
                    )
                waiting, usage = last_load(passes, role, self.kv_capacity_tokens)
                engine.scrape(self.prometheus, now_s, waiting, usage)

    def window(self, now_s: float) -> MetricsWindow:
        """What the operator reads at `now_s`: its PromQL over the scraped series."""
        self.prometheus.now = now_s
        self.prometheus.forget_before(now_s)
        return self.source.window(NAMESPACE, SERVICE, now_s, self.percentile, self.window_s)
