"""Discrete-event simulator of a P/D fleet, driven by an autoscaling controller.

Where it fits: `pdfleet_lab.bench` replays workloads through `simulate()` with the
policy (`pdfleet.autoscale.policy`) or a baseline as the controller. The controller sees what
the operator would see (replica counts and a Prometheus-like metrics window) and returns
desired replicas; the simulator plays the StatefulSets, the router and the workers.

Model (step level, not token level, so an hour of 180k requests replays in seconds):
- Prefill worker: FCFS queue, chunked prefill; each step takes up to `max_num_batched_tokens`
  prompt tokens from the head of the queue and lasts `perf.prefill_seconds(tokens)`.
- KV transfer: `perf.kv_transfer_seconds(prompt)` after the prefill step that finished it.
- Decode worker: continuous batching as a fluid of steps. Between membership changes the
  step time is constant at the batch size and the mean context at the midpoint to the next
  completion (exact for the linear step model), so events happen only when a request joins
  or leaves. A request needs `output` decode steps; the first yields its first token.
  Admission needs a free seat (`max_num_seqs`) and KV room for prompt + output.
- Router: the (prefill, decode) pair is chosen at arrival, least outstanding work first,
  among ready workers that are not draining.
- Signals: each serving worker keeps vLLM's metric families (`exporter.EngineFamilies`),
  scraped every `scrape_interval_s` into an in-memory Prometheus (`tsdb.SimPrometheus`); the
  controller's window is read from it by the operator's own `PrometheusSource`, with the
  operator's queries, so it sees served (not offered) load, the engines' own latencies and
  what the scrape interval hides. `signals="direct"` instead reads the simulator's exact
  window (offered load at the router, latency percentiles of every request), for comparing.
- Scaling: new workers are ready `startup_s` after they get GPUs; with the cluster full they
  stay Pending (not capacity). Removal takes Pending, then starting, then the newest ready
  workers, which drain: they take no new requests and leave when their in-flight work (for
  decode: every request already paired with them) is done. A scale-up reclaims draining
  workers first. GPU time counts starting, ready and draining workers.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pdfleet.autoscale.metrics import PrometheusSource
from pdfleet.autoscale.policy import MetricsWindow, RoleMetrics, RoleReplicas
from pdfleet.autoscale.promql import PEAK_RATE_S
from pdfleet_lab.exporter import NAMESPACE, SERVICE, EngineFamilies
from pdfleet_lab.traces import Workload
from pdfleet_lab.tsdb import SimPrometheus

if TYPE_CHECKING:
    from pdfleet_worker.perfmodel import PerfModel

# A controller: (now, prefill replicas, decode replicas, metrics) -> desired (prefill, decode).
Controller = Callable[[float, RoleReplicas, RoleReplicas, MetricsWindow], tuple[int, int]]

_ARRIVE, _PREFILL_DONE, _KV_DONE, _DECODE_DONE, _READY, _TICK, _SCRAPE = range(7)
PENDING, STARTING, READY, DRAINING, GONE = range(5)
_EPS = 1e-9


@dataclass(frozen=True)
class SimConfig:
    perf: PerfModel
    startup_s: float = 120.0
    kv_bandwidth_bytes_per_s: float = 50e9  # one IB NDR port per GPU
    interval_s: float = 15.0  # controller period
    metrics_window_s: float = 60.0  # like rate(...[1m]) in the PromQL
    peak_rate_s: float = PEAK_RATE_S  # sub-window of the peak prompt rate (PromQL subquery)
    peak_step_s: float = 5.0  # its evaluation step
    percentile: float = 95.0
    cluster_gpus: int = 12  # GPUs that exist; more workers stay Pending
    prefill_gpus: int = 1
    decode_gpus: int = 1
    # What the controller reads: the operator's queries over scraped series, or the
    # simulator's exact window.
    signals: Literal["prometheus", "direct"] = "prometheus"
    scrape_interval_s: float = 15.0  # the shipped scrape configurations' interval


@dataclass
class SimResult:
    """Per-request latencies (NaN = never served) and the fleet's history."""

    ttft_s: list[float]
    itl_s: list[float]
    gpu_seconds: float
    duration_s: float
    timeline: list[dict[str, float]] = field(default_factory=list)
    scale_events: list[tuple[float, str, int, int]] = field(default_factory=list)

    def attainment(self, ttft_slo: float, itl_slo: float) -> float:
        n = len(self.ttft_s)
        ok = sum(
            1
            for t, i in zip(self.ttft_s, self.itl_s, strict=True)
            if t <= ttft_slo and i <= itl_slo
        )
        return ok / n if n else 1.0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0


class _Worker:
    __slots__ = (
        "assigned",
        "batch",
        "busy",
        "ctx",
        "heap",
        "idx",
        "queue",
        "queued_tokens",
        "reserved",
        "role",
        "state",
        "step",
        "t_sync",
        "tau",
        "version",
    )

    def __init__(self, idx: int, role: str, state: int) -> None:
        self.idx = idx
        self.role = role
        self.state = state
        self.queue: deque[list[int]] = deque()  # prefill: [rid, remaining]; decode: [rid]
        self.queued_tokens = 0
        self.busy = False
        self.assigned = 0  # decode: requests paired with this worker, not yet finished
        self.heap: list[tuple[float, int]] = []  # decode: (finish step, rid)
        self.batch = 0
        self.ctx = 0.0  # sum of contexts of running sequences at step `step`
        self.reserved = 0
        self.step = 0.0
        self.t_sync = 0.0
        self.tau = 0.0
        self.version = 0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _weighted_quantile(samples: list[tuple[float, float]], q: float) -> float:
    total = sum(w for _, w in samples)
    if total <= 0:
        return math.nan
    acc = 0.0
    for v, w in sorted(samples):
        acc += w
        if acc >= q * total:
            return v
    return sorted(samples)[-1][0]


class _Window:
    """Time-stamped samples kept for the last `span` seconds (a Prometheus range vector)."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.items: deque[tuple[float, float, float]] = deque()

    def add(self, t: float, value: float, weight: float = 1.0) -> None:
        self.items.append((t, value, weight))

    def trim(self, now: float) -> None:
        while self.items and self.items[0][0] < now - self.span:
            self.items.popleft()

    def values(self) -> list[float]:
        return [v for _, v, _ in self.items]

    def weighted(self) -> list[tuple[float, float]]:
        return [(v, w) for _, v, w in self.items]

    def total(self) -> float:
        return sum(v for _, v, _ in self.items)

    def peak_rate(self, now: float, span: float, sub_s: float, step_s: float) -> float:
        """Highest `sum(rate(x[sub_s]))` over [now - span, now] evaluated every `step_s`,
        like `max_over_time(sum(rate(x[15s]))[1m:5s])`; the window mean if it is shorter."""
        if span <= sub_s:
            return self.total() / max(span, _EPS)
        times = [t for t, _, _ in self.items]
        acc = [0.0]
        for _, v, _ in self.items:
            acc.append(acc[-1] + v)
        best = 0.0
        end = now
        while end - sub_s >= now - span - _EPS:
            lo = bisect.bisect_left(times, end - sub_s)
            hi = bisect.bisect_right(times, end)
            best = max(best, (acc[hi] - acc[lo]) / sub_s)
            end -= step_s
        return best


class FleetSim:
    """One replay; use `simulate()`."""

    def __init__(
        self, wl: Workload, cfg: SimConfig, controller: Controller, initial: tuple[int, int]
    ) -> None:
        self.wl = wl
        self.cfg = cfg
        self.perf = cfg.perf
        self.controller = controller
        n = len(wl)
        self.arrival = wl.arrival_s
        self.isl = wl.input_tokens
        self.osl = wl.output_tokens
        self.first_token = [math.nan] * n
        self.finish = [math.nan] * n
        self.dec_of = [-1] * n
        self.kv_time = [0.0] * n
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.workers: list[_Worker] = []
        self.live: list[_Worker] = []  # not GONE
        self.ready: dict[str, list[_Worker]] = {"prefill": [], "decode": []}
        self.now = 0.0
        self.gpu_seconds = 0.0
        self.t_gpu = 0.0
        self.end = wl.duration_s
        self.router_wait: dict[str, deque[int]] = {"prefill": deque(), "decode": deque()}
        w = cfg.metrics_window_s
        self.m_ttft_p, self.m_ttft_d, self.m_itl = _Window(w), _Window(w), _Window(w)
        self.m_req, self.m_prompt, self.m_gen = _Window(w), _Window(w), _Window(w)
        self.timeline: list[dict[str, float]] = []
        self.scale_events: list[tuple[float, str, int, int]] = []
        self.prometheus = SimPrometheus()
        self.engines: dict[int, EngineFamilies] = {}
        self.source = PrometheusSource("simulated", client=self.prometheus)
        for _ in range(initial[0]):
            self._serving(self._new_worker("prefill", READY))
        for _ in range(initial[1]):
            self._serving(self._new_worker("decode", READY))
        self._refresh()

    # --- event plumbing -------------------------------------------------------------------

    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def _gpus(self, w: _Worker) -> int:
        return self.cfg.prefill_gpus if w.role == "prefill" else self.cfg.decode_gpus

    def _held(self) -> int:
        return sum(self._gpus(w) for w in self.live if w.state != PENDING)

    def _refresh(self) -> None:
        """Rebuild the live and ready lists after a state change (rare, unlike routing)."""
        self.live = [w for w in self.live if w.state != GONE]
        for role in ("prefill", "decode"):
            self.ready[role] = [w for w in self.live if w.role == role and w.state == READY]

    def _account(self) -> None:
        t = min(self.now, self.end)
        if t > self.t_gpu:
            self.gpu_seconds += self._held() * (t - self.t_gpu)
            self.t_gpu = t

    # --- lifecycle ------------------------------------------------------------------------

    def _new_worker(self, role: str, state: int) -> _Worker:
        w = _Worker(len(self.workers), role, state)
        self.workers.append(w)
        self.live.append(w)
        return w

    def _serving(self, w: _Worker) -> None:
        """A worker's engine is up: its metrics exist, and Prometheus scrapes it from now on
        at a phase of its own (as targets are spread over the interval)."""
        self.engines[w.idx] = EngineFamilies(w.role, f"{w.role}-{w.idx}")
        if self.cfg.signals != "prometheus":
            return  # nothing reads the series
        interval = self.cfg.scrape_interval_s
        self._push(self.now + (w.idx * 7.3) % interval, _SCRAPE, w.idx)

    def _on_scrape(self, w: _Worker) -> None:
        if w.state not in (READY, DRAINING):
            return  # gone: its series end, as a stopped pod's do
        if w.role == "decode":
            self._sync(w)  # its counters up to now
        waiting, kv_tokens = self._engine_load(w)
        usage = min(kv_tokens / self.perf.kv_capacity_tokens, 1.0)
        self.engines[w.idx].scrape(self.prometheus, self.now, float(waiting), usage)
        if self.now + self.cfg.scrape_interval_s <= self.end:
            self._push(self.now + self.cfg.scrape_interval_s, _SCRAPE, w.idx)

    @staticmethod
    def _engine_load(w: _Worker) -> tuple[int, int]:
        """(requests waiting, KV tokens in use) as the worker's engine reports them."""
        if w.role == "prefill":
            return max(0, len(w.queue) - (1 if w.busy else 0)), w.queued_tokens
        return len(w.queue), w.reserved

    def _admit_pending(self) -> None:
        """Pending workers get GPUs in creation order as the cluster frees them."""
        for w in self.live:
            if w.state == PENDING and self._held() + self._gpus(w) <= self.cfg.cluster_gpus:
                self._account()
                w.state = STARTING
                self._push(self.now + self.cfg.startup_s, _READY, w.idx)

    def _members(self, role: str, *states: int) -> list[_Worker]:
        return [w for w in self.live if w.role == role and w.state in states]

    def _scale(self, role: str, desired: int) -> None:
        active = self._members(role, PENDING, STARTING, READY)
        if desired > len(active):
            self.scale_events.append((self.now, role, len(active), desired))
            grow = desired - len(active)
            for w in reversed(self._members(role, DRAINING)):
                if grow == 0:
                    break
                w.state = READY
                grow -= 1
            for _ in range(grow):
                self._new_worker(role, PENDING)
            self._admit_pending()
            self._refresh()
            self._flush_router()
        elif desired < len(active):
            self.scale_events.append((self.now, role, len(active), desired))
            shrink = len(active) - desired
            order = (
                [w for w in active if w.state == PENDING][::-1]
                + [w for w in active if w.state == STARTING][::-1]
                + [w for w in active if w.state == READY][::-1]
            )
            self._account()
            for w in order[:shrink]:
                if w.state in (PENDING, STARTING):
                    w.state = GONE
                else:
                    w.state = DRAINING
                    self._maybe_gone(w)
            self._admit_pending()
            self._refresh()

    def _maybe_gone(self, w: _Worker) -> None:
        if w.state != DRAINING:
            return
        idle = (not w.busy and not w.queue) if w.role == "prefill" else w.assigned == 0
        if idle:
            self._account()
            w.state = GONE
            self._admit_pending()
            self._refresh()

    # --- routing --------------------------------------------------------------------------

    def _pick(self, role: str) -> _Worker | None:
        best: _Worker | None = None
        for w in self.ready[role]:
            if best is None or (
                w.queued_tokens < best.queued_tokens
                if role == "prefill"
                else w.assigned < best.assigned
            ):
                best = w
        return best

    def _route(self, rid: int) -> None:
        self.m_req.add(self.now, 1.0)
        self.m_prompt.add(self.now, self.isl[rid])
        self._dispatch(rid)

    def _dispatch(self, rid: int) -> None:
        p = self._pick("prefill")
        d = self._pick("decode")
        if p is None or d is None:
            self.router_wait["prefill"].append(rid)
            return
        d.assigned += 1
        self.dec_of[rid] = d.idx
        p.queue.append([rid, self.isl[rid]])
        p.queued_tokens += self.isl[rid]
        if not p.busy:
            self._prefill_step(p)

    def _flush_router(self) -> None:
        waiting = self.router_wait["prefill"]
        while waiting and self._pick("prefill") and self._pick("decode"):
            self._dispatch(waiting.popleft())

    # --- prefill --------------------------------------------------------------------------

    def _prefill_step(self, w: _Worker) -> None:
        budget = self.perf.max_num_batched_tokens
        tokens = 0
        for item in w.queue:
            take = min(item[1], budget - tokens)
            if take > 0 and item[1] == self.isl[item[0]]:  # its first step
                self.engines[w.idx].scheduled(self.now - self.arrival[item[0]])
            tokens += take
            if tokens >= budget:
                break
        if tokens == 0:
            w.busy = False
            return
        w.busy = True
        self._push(self.now + self.perf.prefill_seconds(tokens), _PREFILL_DONE, w.idx, tokens)

    def _on_prefill_done(self, w: _Worker, tokens: int) -> None:
        left = tokens
        while left > 0 and w.queue:
            item = w.queue[0]
            take = min(item[1], left)
            item[1] -= take
            left -= take
            w.queued_tokens -= take
            if item[1] == 0:
                w.queue.popleft()
                rid = item[0]
                self.m_ttft_p.add(self.now, self.now - self.arrival[rid])
                engine = self.engines[w.idx]
                engine.first_token(self.now - self.arrival[rid], self.isl[rid])
                engine.decoded(1.0, 0.0)
                engine.finished(None)
                kv = self.perf.kv_transfer_seconds(self.isl[rid], self.cfg.kv_bandwidth_bytes_per_s)
                self.kv_time[rid] = self.now + kv
                self._push(self.now + kv, _KV_DONE, rid)
        self._prefill_step(w)
        self._maybe_gone(w)

    # --- decode ---------------------------------------------------------------------------

    def _sync(self, w: _Worker) -> None:
        if w.batch > 0 and w.tau > 0:
            ds = (self.now - w.t_sync) / w.tau
            if ds > 0:
                w.step += ds
                w.ctx += w.batch * ds
                self.m_gen.add(self.now, w.batch * ds)
                self.m_itl.add(self.now, w.tau, w.batch * ds)
                self.engines[w.idx].decoded(w.batch * ds, w.tau)
        w.t_sync = self.now

    def _fits(self, w: _Worker, rid: int) -> bool:
        return (
            w.batch < self.perf.max_num_seqs
            and w.reserved + self.isl[rid] + self.osl[rid] <= self.perf.kv_capacity_tokens
        )

    def _join(self, w: _Worker, rid: int) -> None:
        w.batch += 1
        w.ctx += self.isl[rid]
        w.reserved += self.isl[rid] + self.osl[rid]
        heapq.heappush(w.heap, (w.step + self.osl[rid], rid))
        first = self.now + self.perf.decode_step_seconds(w.batch, w.ctx / w.batch)
        self.first_token[rid] = first
        self.m_ttft_d.add(self.now, first - self.kv_time[rid])
        self.engines[w.idx].first_token(first - self.kv_time[rid], self.isl[rid])

    def _reschedule(self, w: _Worker) -> None:
        w.version += 1
        if w.batch == 0:
            w.tau = 0.0
            return
        steps = max(w.heap[0][0] - w.step, 0.0)
        mid_ctx = (w.ctx + w.batch * steps / 2) / w.batch
        w.tau = self.perf.decode_step_seconds(w.batch, mid_ctx)
        self._push(self.now + steps * w.tau, _DECODE_DONE, w.idx, w.version)

    def _on_kv_done(self, rid: int) -> None:
        w = self.workers[self.dec_of[rid]]
        self._sync(w)
        if not w.queue and self._fits(w, rid):
            self._join(w, rid)
            self._reschedule(w)
        else:
            w.queue.append([rid])

    def _on_decode_done(self, w: _Worker, version: int) -> None:
        if version != w.version:
            return
        self._sync(w)
        while w.heap and w.heap[0][0] <= w.step + 1e-6:
            _, rid = heapq.heappop(w.heap)
            w.batch -= 1
            w.ctx -= self.isl[rid] + self.osl[rid]
            w.reserved -= self.isl[rid] + self.osl[rid]
            w.assigned -= 1
            self.finish[rid] = self.now
            out = self.osl[rid]
            tpot = (self.now - self.first_token[rid]) / (out - 1) if out > 1 else None
            self.engines[w.idx].finished(tpot)
        if w.batch == 0:
            w.ctx = 0.0
        while w.queue and self._fits(w, w.queue[0][0]):
            self._join(w, w.queue.popleft()[0])
        self._reschedule(w)
        self._maybe_gone(w)

    # --- control --------------------------------------------------------------------------

    def _replicas(self, role: str) -> RoleReplicas:
        active = self._members(role, PENDING, STARTING, READY)
        return RoleReplicas(
            current=len(active),
            ready=sum(1 for w in active if w.state == READY),
            pending=sum(1 for w in active if w.state == PENDING),
        )

    def metrics(self) -> MetricsWindow:
        now, q, span = self.now, self.cfg.percentile / 100.0, self.cfg.metrics_window_s
        for m in (self.m_ttft_p, self.m_ttft_d, self.m_itl, self.m_req, self.m_prompt, self.m_gen):
            m.trim(now)
        span = min(span, max(now, 1.0))
        req, prompt = self.m_req.total() / span, self.m_prompt.total() / span
        gen = self.m_gen.total() / span
        pre = [w for w in self.live if w.role == "prefill" and w.state in (READY, DRAINING)]
        dec = [w for w in self.live if w.role == "decode" and w.state in (READY, DRAINING)]
        p_load = [self._engine_load(w) for w in pre]
        d_load = [self._engine_load(w) for w in dec]
        p_wait = sum(waiting for waiting, _ in p_load) + len(self.router_wait["prefill"])
        d_wait = sum(waiting for waiting, _ in d_load)
        kv = self.perf.kv_capacity_tokens
        d_kv = sum(tokens for _, tokens in d_load) / (kv * len(dec)) if dec else 0.0
        p_kv = sum(tokens for _, tokens in p_load) / (kv * len(pre)) if pre else 0.0
        return MetricsWindow(
            at_s=now,
            window_s=self.cfg.metrics_window_s,
            prefill=RoleMetrics(
                ttft_s=_quantile(self.m_ttft_p.values(), q),
                itl_s=math.nan,
                request_rate=req,
                prompt_tokens_rate=prompt,
                generation_tokens_rate=0.0,
                num_requests_waiting=float(p_wait),
                kv_cache_usage=p_kv,
                prompt_tokens_rate_peak=self.m_prompt.peak_rate(
                    now, span, self.cfg.peak_rate_s, self.cfg.peak_step_s
                ),
            ),
            decode=RoleMetrics(
                ttft_s=_quantile(self.m_ttft_d.values(), q),
                itl_s=_weighted_quantile(self.m_itl.weighted(), q),
                request_rate=req,
                prompt_tokens_rate=0.0,
                generation_tokens_rate=gen,
                num_requests_waiting=float(d_wait),
                kv_cache_usage=d_kv,
            ),
        )

    def window(self) -> MetricsWindow:
        """What the controller reads (SimConfig.signals)."""
        if self.cfg.signals == "direct":
            return self.metrics()
        self.prometheus.now = self.now
        self.prometheus.forget_before(self.now)
        return self.source.window(
            NAMESPACE, SERVICE, self.now, self.cfg.percentile, self.cfg.metrics_window_s
        )

    def _on_tick(self) -> None:
        m = self.window()
        p, d = self._replicas("prefill"), self._replicas("decode")
        want_p, want_d = self.controller(self.now, p, d, m)
        self._record(m, p, d)
        self._scale("prefill", want_p)
        self._scale("decode", want_d)
        nxt = self.now + self.cfg.interval_s
        if nxt <= self.end:
            self._push(nxt, _TICK, 0)

    def _record(self, m: MetricsWindow, p: RoleReplicas, d: RoleReplicas) -> None:
        missing = RoleMetrics(*(math.nan,) * 7)  # a role without series: nothing to chart
        prefill, decode = m.prefill or missing, m.decode or missing
        self.timeline.append(
            {
                "t": self.now,
                "prefill": p.current,
                "decode": d.current,
                "prefill_ready": p.ready,
                "decode_ready": d.ready,
                "gpus": self._held(),
                "req_rate": prefill.request_rate,
                "prompt_tps": prefill.prompt_tokens_rate,
                "prompt_tps_peak": prefill.prompt_tokens_rate_peak,
                "gen_tps": decode.generation_tokens_rate,
                "ttft_prefill": prefill.ttft_s,
                "ttft_decode": decode.ttft_s,
                "itl": decode.itl_s,
            }
        )

    # --- main loop ------------------------------------------------------------------------

    def run(self) -> SimResult:
        arrival, n = self.arrival, len(self.arrival)
        self._push(self.cfg.interval_s, _TICK, 0)
        events, workers, i = self.events, self.workers, 0
        while i < n or events:
            if i < n and (not events or arrival[i] <= events[0][0]):
                self.now = arrival[i]
                self._route(i)
                i += 1
                continue
            t, _, kind, a, b = heapq.heappop(events)
            self.now = t
            if kind == _DECODE_DONE:
                self._on_decode_done(workers[a], b)
            elif kind == _KV_DONE:
                self._on_kv_done(a)
            elif kind == _PREFILL_DONE:
                self._on_prefill_done(workers[a], b)
            elif kind == _TICK:
                self._on_tick()
            elif kind == _SCRAPE:
                self._on_scrape(workers[a])
            elif kind == _READY and workers[a].state == STARTING:
                workers[a].state = READY
                self._serving(workers[a])
                self._refresh()
                self._flush_router()
        self.now = self.end
        self._account()
        itl = [
            (f - ft) / (o - 1) if o > 1 else 0.0
            for f, ft, o in zip(self.finish, self.first_token, self.osl, strict=True)
        ]
        ttft = [ft - a for ft, a in zip(self.first_token, self.arrival, strict=True)]
        return SimResult(
            ttft_s=ttft,
            itl_s=itl,
            gpu_seconds=self.gpu_seconds,
            duration_s=self.end,
            timeline=self.timeline,
            scale_events=self.scale_events,
        )


def simulate(
    wl: Workload, cfg: SimConfig, controller: Controller, initial: tuple[int, int]
) -> SimResult:
    """Replay `wl` on a fleet that starts with `initial` (prefill, decode) ready workers."""
    return FleetSim(wl, cfg, controller, initial).run()


def fixed(prefill: int, decode: int) -> Controller:
    """A controller that never changes the split (static baseline)."""

    def control(now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow) -> tuple[int, int]:
        return prefill, decode

    return control
