"""The SLO-driven autoscaling policy: a pure function from observations to replica counts.

Where it fits: the operator's autoscale timer (and the fleet simulator behind
`pdfleet_lab.bench`, and any other simulator) calls `decide()` once per interval with
plain frozen data and gets plain frozen data back. No I/O, no clock, no globals: the caller
supplies `now_s`, the metrics window, the replica counts and the recent decisions, and keeps
the returned `Decision` for the next call. `PolicyConfig` is the policy's own configuration;
an adapter maps the InferenceService spec into it.

The algorithm, per role (prefill is judged on TTFT, decode on ITL); docs/autoscaling.md
has the details and the reasons:
1. Hold everything when metrics are missing, stale or NaN (`MetricsAvailable=False`).
2. Sizing load: prefill the short-interval peak prompt rate (bursts set TTFT), decode the
   generated-token rate.
3. Learn the load one *ready* replica sustains (`capacity.py`): prefill a saturation bracket
   with an AIMD estimate (a batching engine is flat, then explodes), decode a queue fit.
4. Recommend ceil(forecast / (capacity x target utilization)); the forecast adds a capped
   trend over the start-up delay and, for prefill, the backlog to work off.
5. Scale down only on evidence: decode where the fitted ITL of the smaller pool stays well
   under target, prefill not below what the busiest recent burst needs (a decayed maximum,
   applied after stabilization so that it decays with its own half-life, which doubles
   each time a burst that the memory let go of comes back and breaks the target), decode
   not below what the last burst that broke ITL needs, held whole (a decode pool collapses
   rather than bends) for a hold that grows the same way.
6. Feedback: a violating role never shrinks and gets at least one more replica than it has
   ready (replicas still starting count as that one), unless its queue is shrinking (a
   backlog being worked off). Without a capacity estimate, a queue growing so that a prompt
   arriving a start-up from now would wait past the target is feedback as well. Pending
   pods are never capacity.
7. Stabilize like the HPA, and never reverse a role's direction inside the scale-down
   stabilization window (a role that grew does not shrink; one that shrank grows back only
   on a violated target); bound each step. A role does not shrink while its demand is
   still rising (the last window's mean above the one before), unless (decode only) the
   smaller pool carries the rise at its pace for one start-up and interval.
8. Clamp to min/max, then fit the GPU budget, giving GPUs to the most loaded role and moving
   GPUs from a role with slack to one that violates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Literal

from pdfleet.autoscale import capacity as cap
from pdfleet.autoscale.attainment import Buckets

Role = Literal["prefill", "decode"]
_MAX_TREND = 0.25
# A load under this share of the burst memory is a lull between bursts; the memory's
# half-life grows at most to this multiple of the configured one.
_LULL = 0.5
_BURST_MEMORY_REACH = 4.0
ROLES: tuple[Role, Role] = ("prefill", "decode")
# The smallest target, divisor time or utilization a config holds (1 ms: admission's smallest
# latency target), and a replica count past any pool's bounds for a load that overflows.
MIN_POSITIVE = 1e-3
MAX_REPLICAS = 1_000_000
# Fields the policy divides by, or that must be above zero to ever be met.
_POSITIVE_FIELDS = (
    "ttft_target_s",
    "itl_target_s",
    "capacity_half_life_s",
    "burst_memory_half_life_s",
    "backlog_drain_s",
    "prefill_target_utilization",
    "decode_target_utilization",
)


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the policy needs to know about the service; times in seconds."""

    ttft_target_s: float
    itl_target_s: float
    percentile: float = 95.0  # which quantile the metrics source reports
    prefill_min: int = 1
    prefill_max: int = 8
    decode_min: int = 1
    decode_max: int = 8
    prefill_gpus_per_replica: int = 1
    decode_gpus_per_replica: int = 1
    gpu_budget: int | None = None  # prefill + decode GPUs never exceed this
    interval_s: float = 30.0
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    max_scale_up_step: int = 4
    max_scale_down_step: int = 1
    scale_down_period_s: float = 60.0  # at most one scale-down step per role per period
    metrics_max_age_s: float = 120.0  # older windows count as stale
    startup_s: float = 120.0  # expected time from scale-up to a ready replica
    # Share of the learned capacity to plan for. Prefill needs room for bursts (they queue);
    # decode latency follows its batch smoothly, so it can run closer to its limit.
    prefill_target_utilization: float = 0.9
    decode_target_utilization: float = 0.95
    scale_down_margin: float = 0.85  # a smaller pool must stay below margin x target
    # Decode may shrink when the fitted ITL of the smaller pool stays below this share of
    # the target (its latency curve is smooth, so the fit predicts it well).
    scale_down_latency_fraction: float = 0.8
    capacity_half_life_s: float = 900.0
    trend_window_s: float = 300.0
    backlog_drain_s: float = 120.0  # queued prompts should be worked off within this
    # Bursts shorter than a start-up recur: prefill does not shrink below what the busiest
    # recent burst (promql.PEAK_RATE_S peak rate) needs, remembered with this half-life.
    burst_memory_half_life_s: float = 600.0
    # Optional priors (load per replica at the target): prompt tokens/s for prefill,
    # generated tokens/s for decode. Without them the policy starts in feedback-only mode.
    prefill_capacity_prior: float | None = None
    decode_capacity_prior: float | None = None
    # The measured KV transfer time of a typical prompt (the KV transport preflight): the
    # decode side's TTFT share until the decode pods report a TTFT of their own.
    kv_transfer_s: float = 0.0

    def __post_init__(self) -> None:
        """Admission keeps these above zero; one that slipped past it (a spec stored before
        its rule, a hand-made config) is read as the smallest usable value, so no decision
        divides by zero."""
        for name in _POSITIVE_FIELDS:
            if not getattr(self, name) >= MIN_POSITIVE:  # zero, negative or NaN
                object.__setattr__(self, name, MIN_POSITIVE)

    def bounds(self, role: Role) -> tuple[int, int]:
        if role == "prefill":
            return self.prefill_min, self.prefill_max
        return self.decode_min, self.decode_max

    def gpus(self, role: Role) -> int:
        return self.prefill_gpus_per_replica if role == "prefill" else self.decode_gpus_per_replica

    def target(self, role: Role) -> float:
        return self.ttft_target_s if role == "prefill" else self.itl_target_s

    def utilization(self, role: Role) -> float:
        if role == "prefill":
            return self.prefill_target_utilization
        return self.decode_target_utilization

    def prior(self, role: Role) -> float | None:
        return self.prefill_capacity_prior if role == "prefill" else self.decode_capacity_prior

    @property
    def lookahead_s(self) -> float:
        """How far ahead a decision plans: a replica asked for now serves from one start-up
        on, and the next decision comes one interval later."""
        return self.startup_s + self.interval_s


def following_scale_down_window(config: PolicyConfig, window_s: float) -> PolicyConfig:
    """The config with its memory following a scale-down stabilization window (the spec's
    `scaleDownStabilization`; the defaults are those of 300 s): trends over one window, the
    burst memory and the capacity estimates fading over two and three, at most one
    scale-down step per fifth of it."""
    return replace(
        config,
        scale_down_stabilization_s=window_s,
        trend_window_s=window_s,
        burst_memory_half_life_s=2 * window_s,
        capacity_half_life_s=3 * window_s,
        scale_down_period_s=max(config.interval_s, window_s / 5),
    )


@dataclass(frozen=True)
class RoleReplicas:
    """Replica counts of one role: desired in the StatefulSet, ready, and unschedulable."""

    current: int
    ready: int
    pending: int = 0  # Pending pods: never counted as capacity


@dataclass(frozen=True)
class RoleMetrics:
    """One window of a role's signals, summed (rates, queue) or averaged (KV) over its pods.

    TTFT and time per output token are the configured percentile, ITL the window's mean;
    NaN where the histogram had no samples.
    """

    ttft_s: float
    itl_s: float
    request_rate: float
    prompt_tokens_rate: float
    generation_tokens_rate: float
    num_requests_waiting: float
    kv_cache_usage: float
    # Highest short-interval (promql.PEAK_RATE_S) prompt-token rate in the window, from a PromQL
    # subquery (docs/autoscaling.md); NaN when the source does not provide it, and the
    # policy then sizes prefill on the window mean.
    prompt_tokens_rate_peak: float = math.nan
    # How fast the role's queue of waiting requests grew over the window (requests/s, negative
    # while it shrinks), from a PromQL `deriv`; NaN when unknown. Served rates stop at what
    # the ready replicas process, so arrivals are what is served plus what queued up.
    waiting_growth: float = math.nan
    # The highest short-interval rate of prompt tokens arriving (served + queue growth over
    # the same interval, `promql.peak_arrivals`); NaN when unknown.
    prompt_arrivals_peak: float = math.nan
    # The percentile of per-request time per output token (decode): what an ITL objective
    # counts. NaN when no request finished in the window; the mean ITL then stands in.
    tpot_s: float = math.nan
    # Prefill: the percentile of the time requests waited in the engine's queue before their
    # first step (`vllm:request_queue_time_seconds`), the part of TTFT more replicas remove;
    # NaN when unknown. Counted per request, so a queue that forms and drains between two
    # scrapes shows here where the waiting gauge misses it.
    queue_time_s: float = math.nan


@dataclass(frozen=True)
class MetricsWindow:
    """Signals of both roles over [at_s - window_s, at_s]; None for a role means missing."""

    at_s: float
    window_s: float
    prefill: RoleMetrics | None
    decode: RoleMetrics | None
    # Bucket rates of the prefill pods' TTFT and of the decode pods' per-request time per
    # output token: what SLO attainment is estimated from (`attainment.py`), not read by the
    # policy. Empty when unknown.
    ttft_buckets: Buckets = ()
    tpot_buckets: Buckets = ()
    # What went wrong reading the window ("" when nothing did): the condition's message.
    problem: str = ""


@dataclass(frozen=True)
class PolicyCondition:
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


@dataclass(frozen=True)
class DemandSample:
    """What a decision saw, kept for trends and for telling stable windows from transitions."""

    prefill_demand: float  # prompt tokens/s
    decode_demand: float  # generated tokens/s
    prefill_ready: int
    decode_ready: int

    def demand(self, role: Role) -> float:
        return self.prefill_demand if role == "prefill" else self.decode_demand


@dataclass(frozen=True)
class Capacity:
    """Learned per-replica capacity: the queue fit per role (decode sizes on it) and the
    saturation bracket of the batching prefill engine (prefill sizes on it)."""

    prefill: cap.RoleCapacity = field(default_factory=cap.RoleCapacity)
    decode: cap.RoleCapacity = field(default_factory=cap.RoleCapacity)
    prefill_bracket: cap.Bracket = field(default_factory=cap.Bracket)
    prefill_busiest: float = 0.0  # decayed maximum of the peak prompt rate
    busiest_at_s: float | None = None
    # The burst memory's half-life as bursts taught it (None: the configured one), whether
    # the load fell to a lull since the memory last rose, and the most prefill replicas
    # ready since the TTFT target last broke.
    burst_half_life_s: float | None = None
    lull: bool = False
    held_by: int = 0
    # Decode's burst memory: the arriving generated tokens/s of the last burst that broke the
    # ITL target, kept whole until `decode_burst_until_s`, for a hold bursts taught it.
    decode_burst: float = 0.0
    decode_burst_until_s: float | None = None
    decode_burst_hold_s: float | None = None
    # Per role, the last pool size that broke its target soon after the role shrank to it.
    prefill_undone: UndoneShrink | None = None
    decode_undone: UndoneShrink | None = None

    def get(self, role: Role) -> cap.RoleCapacity:
        return self.prefill if role == "prefill" else self.decode

    def undone(self, role: Role) -> UndoneShrink | None:
        return self.prefill_undone if role == "prefill" else self.decode_undone


@dataclass(frozen=True)
class UndoneShrink:
    """A pool size that broke its target within the scale-down stabilization window after
    the role shrank to it, and the lowest sizing load it broke at. The load per replica a
    capacity model reads does not always say what a pool of that size holds (prompts queued
    behind long ones wait longer on fewer replicas at the same load per replica); the shrink
    that was undone says it directly."""

    size: int
    load: float
    at_s: float

    def load_at(self, at_s: float, half_life_s: float) -> float:
        """The load it broke at, relaxed upwards as the evidence ages, as slowly as a
        bracket's `held` decays (it doubles in four half-lives): a record that does not
        fade would keep the pool one replica larger at any load near it for good."""
        f = cap.fade(max(0.0, at_s - self.at_s), half_life_s) ** 0.25
        return self.load / f if f > 0 else math.inf


@dataclass(frozen=True)
class Decision:
    """Desired replicas per role plus why; feed it back as history on the next call."""

    at_s: float
    prefill: int
    decode: int
    recommended_prefill: int  # before stabilization, burst floor, step limits and budget
    recommended_decode: int
    reasons: tuple[str, ...]
    conditions: tuple[PolicyCondition, ...]
    capacity: Capacity
    observed: DemandSample | None

    def desired(self, role: Role) -> int:
        return self.prefill if role == "prefill" else self.decode

    def recommended(self, role: Role) -> int:
        return self.recommended_prefill if role == "prefill" else self.recommended_decode


@dataclass(frozen=True)
class _RoleView:
    """Per-role inputs after validation: demand, load per ready replica, latency vs target."""

    demand: float  # window mean
    latency: float
    target: float
    x: float  # sizing load per ready replica
    waiting: float
    mean_prompt: float
    peak: float  # sizing load: the short-interval peak for prefill, else the mean
    mean_output: float = 0.0  # generated tokens per finished request (decode)
    # How fast the queue grew over the window, in tokens/s (prefill; 0 where unknown).
    # Negative: a backlog is being worked off, and a latency over target is that backlog's
    # (the window's quantile lags it), not the load's now.
    queued: float = 0.0
    # The latency the capacity model learns from, where it is not `latency`: decode's mean
    # ITL. The percentile is read from buckets, and its steps inside one bucket would read
    # as a slope; the mean is exact, and it moves with the load as the percentile does.
    learned_latency: float | None = None
    # Prefill: the percentile of the time requests waited in the queue (None: unknown), and
    # whether the queue gauge stayed empty (under one waiting on average).
    # More replicas shorten the waits and nothing else: with the queue empty and a TTFT over
    # target by more than the waits, the excess is the prompts' own prefill time (long
    # prompts), which no pool size meets. Either signal alone misleads: the gauge, sampled
    # at scrapes, misses a burst's queue that forms and drains between two; the two
    # quantiles come from different buckets, and in a long backlog TTFT's minus the wait's
    # exceeds the target by the buckets' width alone.
    queue_time: float | None = None
    queue_empty: bool = False

    @property
    def own_time_over_target(self) -> bool:
        """Over target by more than the queue wait, with nothing queued: the requests' own
        service time."""
        excess = self.latency - self.target
        waits = self.queue_time
        return excess > 0 and self.queue_empty and waits is not None and waits < excess

    @property
    def violating(self) -> bool:
        """Over target for a reason more replicas answer."""
        return self.latency > self.target and not self.own_time_over_target

    @property
    def catching_up(self) -> bool:
        return self.queued < 0

    @property
    def fit_latency(self) -> float:
        return self.latency if self.learned_latency is None else self.learned_latency

    def queue_wait_ahead(self, ahead_s: float) -> float:
        """How long a prompt arriving `ahead_s` from now would wait behind the queue, if the
        queue kept growing as in the window and the pool kept serving as now (0 when the
        queue is not growing or nothing is served)."""
        served = self.demand - self.queued
        if self.queued <= 0 or served <= 0:
            return 0.0
        return (self.waiting * self.mean_prompt + self.queued * ahead_s) / served

    def queue_breaks_target(self, ahead_s: float) -> bool:
        """Whether that wait on top of today's latency is past the target."""
        return self.latency + self.queue_wait_ahead(ahead_s) > self.target


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def replicas_for(load: float, per_replica: float) -> int:
    """Replicas that carry `load` at `per_replica` each, rounded up past float noise; more
    than any pool holds (the bounds clamp it) where the quotient overflows."""
    n = load / per_replica - 1e-9 if per_replica > 0 else math.inf
    return min(math.ceil(n), MAX_REPLICAS) if math.isfinite(n) else MAX_REPLICAS


def metrics_problem(now_s: float, config: PolicyConfig, m: MetricsWindow | None) -> str | None:
    """Why the window cannot be trusted (a condition reason), or None when it can."""
    if m is None or m.prefill is None or m.decode is None:
        return "MetricsMissing"
    if now_s - m.at_s > config.metrics_max_age_s:
        return "MetricsStale"
    for rm in (m.prefill, m.decode):
        if not _finite(
            rm.request_rate,
            rm.prompt_tokens_rate,
            rm.generation_tokens_rate,
            rm.num_requests_waiting,
        ):
            return "MetricsNaN"
    # A NaN quantile with zero traffic is "no samples", not a broken scrape.
    if m.prefill.request_rate > 0 and not _finite(m.prefill.ttft_s):
        return "MetricsNaN"
    if m.decode.generation_tokens_rate > 0 and not _finite(m.decode.itl_s):
        return "MetricsNaN"
    return None


def decode_latency(d: RoleMetrics) -> float:
    """What decode is judged on: the percentile of per-request time per output token, else
    (no request finished in the window) the mean ITL; 0 when neither is known.

    Every token of a step shares its time, so a request's ITL is the mean step of the
    batches it lived through: with the window's mean under the target, the requests that
    decoded through its busiest stretches can still miss it (one decode on a 15 ms target
    ran at a 12-15 ms mean while a tenth of its requests missed)."""
    for value in (d.tpot_s, d.itl_s):
        if _finite(value):
            return value
    return 0.0


def _views(
    config: PolicyConfig, m: MetricsWindow, fleet: dict[Role, RoleReplicas]
) -> dict[Role, _RoleView]:
    assert m.prefill is not None and m.decode is not None
    p, d = m.prefill, m.decode
    # The end-to-end TTFT is prefill-side plus decode-side (KV pull, admission, first step);
    # prefill gets what the decode side leaves of the target, but at least half of it. The
    # decode pods' own TTFT includes the KV pull of the real prompts; until they report one,
    # the preflight's measured transfer of a typical prompt stands in for it.
    decode_ttft = d.ttft_s if _finite(d.ttft_s) and d.request_rate > 0 else config.kv_transfer_s
    ttft_budget = max(config.ttft_target_s - decode_ttft, 0.5 * config.ttft_target_s)
    mean_prompt = p.prompt_tokens_rate / p.request_rate if p.request_rate > 0 else 0.0
    # Prefill TTFT is set by the bursts a batching engine has to absorb, which a window mean
    # hides; the peak short-interval rate is what the pool must carry.
    served_peak = p.prompt_tokens_rate_peak
    if _finite(served_peak):
        served_peak = max(served_peak, p.prompt_tokens_rate)
    else:
        served_peak = p.prompt_tokens_rate
    # What arrives, not what is served: a saturated pool serves its capacity while the queue
    # grows by the rest, and a pool working off a backlog serves more than arrives. The
    # capacity models learn from what was served (`x`), the sizing uses what arrives.
    queued = p.waiting_growth * mean_prompt if _finite(p.waiting_growth) else 0.0
    arriving = max(0.0, p.prompt_tokens_rate + queued)
    if _finite(p.prompt_arrivals_peak):
        peak = p.prompt_arrivals_peak
    else:
        # a source without the aligned peak: the window's queue growth corrects the served
        # peak, and while a backlog is worked off the served peak is the pool's speed
        peak = arriving if queued < 0 else served_peak + queued
    # Decode's arrivals are the requests prefill hands over, each to generate the mean output
    # of the requests decode finished: a saturated decode pool generates less than that
    # (its batch steps slow down), which the tokens it serves cannot show.
    mean_output = d.generation_tokens_rate / d.request_rate if d.request_rate > 0 else 0.0
    decode_arriving = max(d.generation_tokens_rate, p.request_rate * mean_output)
    return {
        "prefill": _RoleView(
            demand=arriving,
            latency=p.ttft_s if _finite(p.ttft_s) else 0.0,
            target=ttft_budget,
            x=served_peak / max(fleet["prefill"].ready, 1),
            waiting=p.num_requests_waiting,
            mean_prompt=mean_prompt,
            peak=max(peak, arriving),
            queued=queued,
            queue_time=p.queue_time_s if _finite(p.queue_time_s) else None,
            queue_empty=p.num_requests_waiting < 1,
        ),
        "decode": _RoleView(
            demand=decode_arriving,
            latency=decode_latency(d),
            learned_latency=d.itl_s if _finite(d.itl_s) else None,
            target=config.itl_target_s,
            x=d.generation_tokens_rate / max(fleet["decode"].ready, 1),
            waiting=d.num_requests_waiting,
            mean_prompt=mean_prompt,
            peak=decode_arriving,
            mean_output=mean_output,
        ),
    }


def _stable_ready(
    role: Role, ready: int, now_s: float, window_s: float, history: Sequence[Decision]
) -> bool:
    """True when the role's ready count did not change during the metrics window."""
    for h in history:
        if h.observed is None or now_s - h.at_s > window_s:
            continue
        seen = h.observed.prefill_ready if role == "prefill" else h.observed.decode_ready
        if seen != ready:
            return False
    return True


def rising_past(
    role: Role,
    view: _RoleView,
    smaller: float | None,
    now_s: float,
    window_s: float,
    config: PolicyConfig,
    history: Sequence[Decision],
) -> bool:
    """True when the role's demand (window mean) is above that of the window before (the
    latest decision at least one window old) and, rising at that pace for one lookahead,
    would take its sizing load past `smaller`, what the smaller pool carries (None: past
    anything). A shrink the rise undoes before a replica could be back is not taken."""
    before = [h for h in history if h.observed is not None and now_s - h.at_s >= window_s]
    if not before:
        return False
    last = before[-1]
    assert last.observed is not None
    rise = view.demand - last.observed.demand(role)
    if not rise > 0:
        return False
    if smaller is None:
        return True
    pace = rise / max(now_s - last.at_s, window_s)
    return view.peak + pace * config.lookahead_s > smaller


def _trend(
    role: Role, demand: float, now_s: float, config: PolicyConfig, history: Sequence[Decision]
) -> float:
    """Upward demand slope per second over the trend window (0 when flat or falling).

    A least-squares slope through every window-mean demand in the trend window (the end
    points alone turn minute-to-minute noise into a trend), and no steeper than the slope
    through its recent half: a rise is extrapolated only as far as it is still going on. A
    ramp or step that has levelled off still tilts the whole window's line for a window
    after it (a fleet's first minutes, when decode fills, read as a 25 % rise).
    """
    pts = [(0.0, demand)]
    for h in history:
        age = now_s - h.at_s
        if h.observed is None or age > config.trend_window_s or age <= 0:
            continue
        pts.append((-age, h.observed.demand(role)))
    if len(pts) < 3 or -min(t for t, _ in pts) < config.trend_window_s - config.interval_s:
        return 0.0  # a shorter history cannot tell a trend from a cold start's ramp
    slope = least_squares_slope(pts)
    recent = [(t, y) for t, y in pts if t >= -0.5 * config.trend_window_s]
    if len(recent) >= 3:  # a window of a few intervals has no half to tell a rise from
        slope = min(slope, least_squares_slope(recent))
    return max(0.0, slope)


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """Slope of the least-squares line through (t, y) points; 0 with fewer than three or
    all at one time (two points are the end-point difference the fit is there to avoid)."""
    if len(points) < 3:
        return 0.0
    mt = sum(t for t, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    cov = sum((t - mt) * (y - my) for t, y in points)
    return cov / var if var > 0 else 0.0


@dataclass(frozen=True)
class Starting:
    """Replicas of a role that have GPUs but are not ready yet, and when they will be."""

    replicas: int = 0
    ready_in_s: float = 0.0  # until the last of them is ready


def starting(
    role: Role,
    replicas: RoleReplicas,
    now_s: float,
    config: PolicyConfig,
    history: Sequence[Decision],
) -> Starting:
    """The role's starting replicas (Pending pods are not starting), ready one start-up after
    the latest scale-up in the history; a whole start-up away when the history does not show
    one (the safe side: the backlog then accrues over the ready replicas only). Replicas later
    than expected are taken as due now."""
    n = max(0, replicas.current - replicas.ready - replicas.pending)
    if n == 0:
        return Starting()
    asked_at = None
    for before, h in pairwise(history):
        if h.desired(role) > before.desired(role):
            asked_at = h.at_s
    if asked_at is None:
        return Starting(n, config.startup_s)
    return Starting(n, max(0.0, config.startup_s - (now_s - asked_at)))


def forecast(
    role: Role,
    view: _RoleView,
    capacity: float,
    ready: int,
    slope: float,
    config: PolicyConfig,
    coming: Starting = Starting(),
) -> float:
    """Load the pool must carry once a replica started now is ready.

    The sizing load (prefill: the burst peak) plus the upward trend over start-up and one
    interval; for prefill also the backlog a replica started now would find when ready (the
    prompts queued now, plus what a sustained excess adds or spare capacity works off over
    the ready replicas until those already starting are ready, then over all of them),
    worked off within `backlog_drain_s`.
    """
    lookahead = config.lookahead_s
    # a trend is extrapolated, so it may add at most _MAX_TREND of the load (a cold start's
    # ramp would otherwise double the forecast)
    load = view.peak + min(slope * lookahead, _MAX_TREND * view.peak)
    if role == "prefill" and view.mean_prompt > 0:
        # while the target is broken the peak is taken as sustained (the mean lags a step by
        # a whole window)
        arriving = view.peak if view.violating else view.demand
        # the backlog a replica started now finds when it is ready: the prompts queued now,
        # plus the excess over the ready replicas until those already starting are ready,
        # then over all of them (negative: the backlog is being worked off)
        early = min(coming.ready_in_s, config.startup_s)
        backlog = view.waiting * view.mean_prompt
        backlog = max(0.0, backlog + (arriving - ready * capacity) * early)
        late = arriving - (ready + coming.replicas) * capacity
        backlog = max(0.0, backlog + late * (config.startup_s - early))
        load += backlog / config.backlog_drain_s
    elif role == "decode" and view.mean_output > 0:
        # requests decode has taken but not yet scheduled each have their output to generate
        load += view.waiting * view.mean_output / config.backlog_drain_s
    return load


def recommend(
    role: Role,
    view: _RoleView,
    capacity: float | None,
    current: int,
    ready: int,
    slope: float,
    config: PolicyConfig,
    down_limit: float | None = None,
    coming: Starting = Starting(),
    settled: bool = True,
) -> tuple[int, str]:
    """Raw replica recommendation for one role, before stabilization, and why.

    A smaller pool must stay under the scale-down margin of the planned load per replica,
    or under `down_limit`, a load per replica that evidence says holds the target. A
    violation asks for one more replica than are ready only when the ready count held
    through the window (`settled`) and the queue is not shrinking: else the latency is that
    of a pool that has changed since, or of a backlog already being worked off.
    """
    violating = view.violating
    if capacity is None:
        # Feedback-only until the capacity is known: +1 on violation; down to what a load per
        # replica seen holding the target (`down_limit`) says suffices, else -1 when far below.
        if violating:
            return max(current, ready + 1), f"{role}: over target, capacity unknown"
        if view.queue_breaks_target(config.lookahead_s):
            # a queue growing past what the pool serves breaks the target before a replica
            # asked for later could be ready (nothing else says so without a capacity)
            wait = view.queue_wait_ahead(config.lookahead_s)
            return max(current, ready + 1), (
                f"{role}: queue growing, {wait:.1f}s wait in a start-up, capacity unknown"
            )
        if down_limit is not None and view.waiting == 0:
            n = min(current, max(1, replicas_for(view.peak, down_limit)))
            return n, f"{role}: capacity unknown, {down_limit:.0f}/s per replica has held -> {n}"
        if view.latency < 0.5 * view.target and view.waiting == 0:
            return current - 1, f"{role}: well under target, capacity unknown"
        return current, f"{role}: capacity unknown, holding"
    load = forecast(role, view, capacity, ready, slope, config, coming)
    util = config.utilization(role)
    n = replicas_for(load, capacity * util)
    if n < current:
        limit = capacity * util * config.scale_down_margin
        if down_limit is not None:
            # prefill's is the evidence itself; decode's fit may allow more than the margin
            limit = down_limit if role == "prefill" else max(limit, down_limit)
        n = max(n, min(current, replicas_for(load, max(limit, 1e-9))))
    why = (
        f"{role}: load {view.peak:.0f}/s (mean {view.demand:.0f}, forecast {load:.0f}), "
        f"capacity {capacity:.0f}/s per replica -> {n}"
    )
    if violating and (view.catching_up or not settled):
        # the forecast sizes how fast the backlog goes: no shrinking, and no extra replica
        # for a latency that is already on its way down
        n = max(n, current)
        state = "its queue shrinking" if view.catching_up else "ready replicas just changed"
        why += f"; latency {view.latency:.3f}s over target, {state}"
    elif violating:
        n = max(n, current, ready + 1)
        why += f"; latency {view.latency:.3f}s over target {view.target:.3f}s"
    elif view.own_time_over_target:
        why += (
            f"; latency {view.latency:.3f}s over target {view.target:.3f}s by more than the"
            f" queue wait ({view.queue_time:.3f}s): the requests' own service time, which more"
            " replicas do not shorten"
        )
    return n, why


def stabilize(
    role: Role,
    rec: int,
    current: int,
    now_s: float,
    config: PolicyConfig,
    history: Sequence[Decision],
) -> int:
    """HPA-style: up to the lowest recommendation of the up-window, down to the highest of
    the down-window, each bounded by its step limit; one scale-down step per period."""
    up_recs = [rec] + [
        h.recommended(role) for h in history if now_s - h.at_s < config.scale_up_stabilization_s
    ]
    down_recs = [rec] + [
        h.recommended(role) for h in history if now_s - h.at_s < config.scale_down_stabilization_s
    ]
    up = min(up_recs)
    down = max(down_recs)
    if up > current:
        return min(up, current + config.max_scale_up_step)
    if down < current and _may_shrink(role, current, now_s, config, history):
        return max(down, current - config.max_scale_down_step)
    return current


def moved(
    role: Role, direction: int, now_s: float, window_s: float, history: Sequence[Decision]
) -> bool:
    """True when the role's desired count moved up (`direction` +1) or down (-1) within
    the last `window_s`."""
    return any(
        (h.desired(role) - before.desired(role)) * direction > 0
        for before, h in pairwise(history)
        if now_s - h.at_s < window_s
    )


def _may_shrink(
    role: Role, current: int, now_s: float, config: PolicyConfig, history: Sequence[Decision]
) -> bool:
    """No reversal inside the stabilization window: a role that grew within it does not
    shrink, nor does one whose history does not yet cover the window (just started, so
    nothing says the recommendation would hold), and at most one step per period."""
    window = config.scale_down_stabilization_s
    if not history or now_s - history[0].at_s < window:
        return False
    if moved(role, +1, now_s, window, history):
        return False
    return not any(
        h.desired(role) != current for h in history if now_s - h.at_s < config.scale_down_period_s
    )


def clamp(role: Role, n: int, config: PolicyConfig) -> int:
    lo, hi = config.bounds(role)
    return max(lo, min(hi, n))


def fit_budget(
    desired: dict[Role, int],
    current: dict[Role, int],
    need: dict[Role, int],
    pressure: dict[Role, float],
    violating: dict[Role, bool],
    config: PolicyConfig,
) -> tuple[dict[Role, int], list[str]]:
    """Fit desired counts into the GPU budget.

    Growth is granted one replica at a time to the role under more pressure. When a violating
    role still wants more and the budget is spent, a role whose own need (what its load needs
    now: a latency violated now outranks insurance against a burst that may recur) is below
    its count gives GPUs up (a move between pools), within its scale-down step.
    """
    budget = config.gpu_budget
    if budget is None:
        return desired, []
    g = {r: config.gpus(r) for r in ROLES}

    def used(a: dict[Role, int]) -> int:
        return sum(a[r] * g[r] for r in ROLES)

    if used(desired) <= budget:
        return desired, []
    reasons: list[str] = []
    alloc = {r: min(desired[r], current[r]) for r in ROLES}
    while used(alloc) > budget:  # the budget shrank below the fleet: shrink the emptier role
        shrinkable = [r for r in ROLES if alloc[r] > config.bounds(r)[0]]
        if not shrinkable:
            break
        emptiest = min(shrinkable, key=lambda r: pressure[r])
        alloc[emptiest] -= 1
        reasons.append(f"budget: {emptiest} reduced to fit {budget} GPUs")
    moves: tuple[tuple[Role, Role], ...] = (("prefill", "decode"), ("decode", "prefill"))
    for donor, taker in moves:
        if not violating[taker] or desired[taker] <= alloc[taker] or violating[donor]:
            continue
        lo = max(need[donor], config.bounds(donor)[0], current[donor] - config.max_scale_down_step)
        while (
            alloc[donor] > lo and used(alloc) + g[taker] > budget and alloc[taker] < desired[taker]
        ):
            alloc[donor] -= 1
            reasons.append(f"budget: moving GPUs {donor} -> {taker}")
            if used(alloc) + g[taker] <= budget:
                alloc[taker] += 1
    while True:
        wants = [r for r in ROLES if alloc[r] < desired[r] and used(alloc) + g[r] <= budget]
        if not wants:
            break
        busiest = max(
            wants, key=lambda r: (violating[r], pressure[r] * current[r] / max(alloc[r], 1))
        )
        alloc[busiest] += 1
    if any(alloc[r] < desired[r] for r in ROLES):
        reasons.append(f"budget: {budget} GPUs limit growth")
    return alloc, reasons


def _hold(
    now_s: float,
    config: PolicyConfig,
    fleet: dict[Role, RoleReplicas],
    history: Sequence[Decision],
    reason: str,
) -> Decision:
    last = history[-1] if history else None
    desired = {r: clamp(r, fleet[r].current, config) for r in ROLES}
    return Decision(
        at_s=now_s,
        prefill=desired["prefill"],
        decode=desired["decode"],
        recommended_prefill=desired["prefill"],
        recommended_decode=desired["decode"],
        reasons=(f"holding: {reason}",),
        conditions=(PolicyCondition("MetricsAvailable", "False", reason), *_pending(fleet)),
        capacity=last.capacity if last else Capacity(),
        observed=None,
    )


def _pending(fleet: dict[Role, RoleReplicas]) -> tuple[PolicyCondition, ...]:
    stuck = [f"{r}={fleet[r].pending}" for r in ROLES if fleet[r].pending > 0]
    if stuck:
        return (
            PolicyCondition(
                "InsufficientCapacity",
                "True",
                "PodsPending",
                "pending replicas: " + ", ".join(stuck),
            ),
        )
    return (PolicyCondition("InsufficientCapacity", "False", "AllScheduled"),)


def _learn(
    config: PolicyConfig,
    metrics: MetricsWindow,
    fleet: dict[Role, RoleReplicas],
    views: dict[Role, _RoleView],
    last: Capacity,
    history: Sequence[Decision],
) -> Capacity:
    """Fold this window into the capacity models of the roles whose ready count held still
    through it (a window straddling a change mixes two pool sizes)."""
    stable = {
        r: fleet[r].ready > 0
        and _stable_ready(r, fleet[r].ready, metrics.at_s, metrics.window_s, history)
        for r in ROLES
    }
    out = last
    for r in ROLES:
        if not stable[r]:
            continue
        v = views[r]
        if v.own_time_over_target:
            # the prompts' own time, not a queue: nothing about how close the pool is to full
            # (counted as holding, it let a pool shrink onto a load it then queued at)
            continue
        state = last.get(r)
        # "loaded" is judged against the larger of belief and prior, so that an early
        # low estimate cannot make every burst look like a capacity limit
        before = max(cap.capacity(state, v.target, config.prior(r)) or 0.0, config.prior(r) or 0.0)
        state = cap.observe(
            state,
            metrics.at_s,
            v.x,
            v.fit_latency,
            v.target,
            config.capacity_half_life_s,
            before or None,
        )
        out = replace(out, prefill=state) if r == "prefill" else replace(out, decode=state)
    v = views["prefill"]
    out = remember_burst(out, metrics.at_s, v.peak, v.violating, fleet["prefill"].ready, config)
    if stable["prefill"] and not v.own_time_over_target:  # as for the queue fit above
        bracket = cap.observe_bracket(
            last.prefill_bracket,
            metrics.at_s,
            v.x,
            v.latency,
            v.target,
            config.capacity_half_life_s,
            config.prefill_capacity_prior,
            metrics.window_s,
            draining=v.catching_up,
        )
        out = replace(out, prefill_bracket=bracket)
    return out


def _lengthened(memory_s: float, config: PolicyConfig) -> float:
    """A burst memory that let go before its burst came back: twice as long, up to
    `_BURST_MEMORY_REACH` times the configured one."""
    return min(2 * memory_s, _BURST_MEMORY_REACH * config.burst_memory_half_life_s)


def remember_burst(
    learned: Capacity, at_s: float, peak: float, broke: bool, ready: int, config: PolicyConfig
) -> Capacity:
    """Fold a window's peak prompt rate into the burst memory (a decayed maximum).

    The memory's half-life starts at the configured one and doubles, up to
    `_BURST_MEMORY_REACH` times it, each time a burst comes back above what the memory had
    kept and breaks the target (`broke`) after the memory let go: the load fell to a lull
    (under half of what the memory kept), or the pool shrank below the most replicas
    that were `ready` since the target last broke. Bursts that come back and are held, or a
    load that rises while the pool serving it stands, leave it as it is.
    """
    half_life = learned.burst_half_life_s or config.burst_memory_half_life_s
    kept = learned.prefill_busiest
    if learned.busiest_at_s is not None:
        kept *= cap.fade(at_s - learned.busiest_at_s, half_life)
    lull = learned.lull or peak < _LULL * kept
    # a prompt mix that flips between heavy and light never falls to half, but a pool
    # shrunk below the one that held since the last break is the same letting go
    shrunk = ready < learned.held_by
    if peak > kept:
        if (lull or shrunk) and kept > 0 and broke:
            half_life = _lengthened(half_life, config)
        lull = False
    return replace(
        learned,
        prefill_busiest=max(kept, peak),
        busiest_at_s=at_s,
        burst_half_life_s=half_life,
        lull=lull,
        held_by=ready if broke else max(learned.held_by, ready),
    )


def _prefill_capacity(config: PolicyConfig, learned: Capacity, target: float) -> float | None:
    """The saturation bracket once something bounds it (a prior or a violation under load).

    Before that, the queue fit of TTFT against load, once it has a slope: a batching engine's
    TTFT rises a little before it explodes, so the fit lands under the real limit (safe), and
    it lets a pool without a prior grow ahead of its first violation. Else None: feedback.
    """
    bracket, prior = learned.prefill_bracket, config.prefill_capacity_prior
    if cap.bracket_bounded(bracket, prior):
        return cap.bracket_capacity(bracket, prior)
    if cap.fitted(learned.prefill, target) is None:
        return None
    return cap.capacity(learned.prefill, target, None)


def _down_limit(
    role: Role, learned: Capacity, capacity: float | None, target: float, config: PolicyConfig
) -> float | None:
    """Load per replica a smaller pool may carry, from evidence; None: use the margin.

    Prefill: what has been seen to hold the target (never extrapolated downwards into a
    burst the pool has not absorbed). Decode: where the fitted ITL curve reaches
    `scale_down_latency_fraction` of the target.
    """
    if role == "prefill":
        # A capacity, learned or hinted, says how far a pool may grow into a load, not that
        # a smaller pool holds one: shrinking takes a load per replica near what has been
        # seen holding the target (a pool shrunk on a hint alone met a tenfold step with one
        # saturated replica). Nothing has held yet: no evidence for a smaller pool.
        reach = cap.within_reach(learned.prefill_bracket)
        if capacity is None or not cap.bracket_bounded(
            learned.prefill_bracket, config.prefill_capacity_prior
        ):
            return reach or None
        return min(capacity * config.utilization(role), reach)
    if capacity is None:
        return None
    planned = capacity * config.utilization(role)
    at = cap.fitted(learned.decode, config.scale_down_latency_fraction * target)
    return min(planned, at) if at is not None and at > 0 else None


def remember_decode_burst(
    learned: Capacity,
    at_s: float,
    load: float,
    broke: bool,
    came_back: bool,
    per_replica: float | None,
    config: PolicyConfig,
) -> Capacity:
    """Fold a window's arriving decode load into decode's burst memory.

    A decode pool that breaks the ITL target collapses rather than bends (the batch grows
    with the latency, and the latency with the batch), so a burst it missed is remembered
    whole, not decayed, for a hold that starts at `burst_memory_half_life_s`. A load that
    needs the remembered floor (of more than one replica) again renews the hold, and so
    does a prompt burst that comes back after a lull and breaks TTFT (`came_back`): a
    prefill pool that throttles a burst hides it from decode. A burst that breaks either
    target after the hold let go doubles it, up to `_BURST_MEMORY_REACH` times the
    configured one.
    """
    hold = learned.decode_burst_hold_s or config.burst_memory_half_life_s
    until = learned.decode_burst_until_s
    active = until is not None and at_s <= until
    remembered = learned.decode_burst > 0
    if (broke or came_back) and remembered and not active:
        hold = _lengthened(hold, config)
    if broke:
        burst = max(load, learned.decode_burst) if active else load
        return replace(
            learned, decode_burst=burst, decode_burst_until_s=at_s + hold, decode_burst_hold_s=hold
        )
    # Only a floor above one replica is insurance a load can need again: one replica's
    # renewal on any load would keep a stale burst that a lower capacity estimate
    # later turns back into two.
    floor = decode_burst_floor(learned, at_s, per_replica)
    needed = per_replica is not None and floor > 1 and load > (floor - 1) * per_replica
    if remembered and (came_back or needed):
        return replace(learned, decode_burst_until_s=at_s + hold, decode_burst_hold_s=hold)
    return learned


def remember_undone_shrink(
    learned: Capacity,
    role: Role,
    view: _RoleView,
    fleet: RoleReplicas,
    shrank: bool,
    at_s: float,
    half_life_s: float,
) -> Capacity:
    """Record the size a role broke its target at when it `shrank` to it within the window
    (the ready count caught up with it), keeping the lowest load it broke at. A break later
    than that is the load's doing as much as the size's, which the burst memory answers."""
    size = fleet.ready
    if not (view.violating and shrank and 0 < size == fleet.current):
        return learned
    load = view.peak
    old = learned.undone(role)
    if old is not None and old.size == size:
        load = min(load, old.load_at(at_s, half_life_s))
    record = UndoneShrink(size=size, load=load, at_s=at_s)
    if role == "prefill":
        return replace(learned, prefill_undone=record)
    return replace(learned, decode_undone=record)


def undone_floor(
    role: Role, learned: Capacity, load: float, at_s: float, config: PolicyConfig
) -> int:
    """The smallest pool the last undone shrink allows at this sizing load: one more than
    the size that broke, while the load is within the scale-down margin of what it broke
    at; else 0."""
    record = learned.undone(role)
    if record is None:
        return 0
    if load < config.scale_down_margin * record.load_at(at_s, config.capacity_half_life_s):
        return 0
    return record.size + 1


def decode_burst_floor(learned: Capacity, at_s: float, per_replica: float | None) -> int:
    """Decode replicas the remembered burst needs while its hold lasts, else 0."""
    until = learned.decode_burst_until_s
    if not per_replica or until is None or at_s > until:
        return 0
    return replicas_for(learned.decode_burst, per_replica)


def burst_floor(
    config: PolicyConfig, learned: Capacity, capacity: float | None, limit: float | None
) -> int:
    """Prefill replicas the busiest recent burst needs (bursts shorter than a start-up
    recur, and only standing replicas absorb them); 0 while nothing says what one carries."""
    per_replica = capacity * config.prefill_target_utilization if capacity else limit
    if not per_replica:
        return 0
    return replicas_for(learned.prefill_busiest, per_replica)


def decide(
    config: PolicyConfig,
    now_s: float,
    prefill: RoleReplicas,
    decode: RoleReplicas,
    metrics: MetricsWindow | None,
    history: Sequence[Decision] = (),
) -> Decision:
    """One autoscaling decision.

    `history` holds earlier decisions, oldest first (the last one carries the learned
    capacity); only those within the stabilization and trend windows matter, so callers may
    keep just `trim_history(...)`.
    """
    fleet: dict[Role, RoleReplicas] = {"prefill": prefill, "decode": decode}
    problem = metrics_problem(now_s, config, metrics)
    if problem is not None:
        return _hold(now_s, config, fleet, history, problem)
    assert metrics is not None
    views = _views(config, metrics, fleet)
    last_cap = history[-1].capacity if history else Capacity()
    learned = _learn(config, metrics, fleet, views, last_cap, history)
    caps: dict[Role, float | None] = {
        "prefill": _prefill_capacity(config, learned, views["prefill"].target),
        "decode": cap.capacity(learned.decode, views["decode"].target, config.prior("decode")),
    }
    decode_per_replica = caps["decode"] and caps["decode"] * config.utilization("decode")
    dv = views["decode"]
    pv = views["prefill"]
    came_back = last_cap.lull and not learned.lull and pv.violating
    learned = remember_decode_burst(
        learned, now_s, dv.peak, dv.violating, came_back, decode_per_replica, config
    )
    for r in ROLES:
        shrank = moved(r, -1, now_s, config.scale_down_stabilization_s, history)
        learned = remember_undone_shrink(
            learned, r, views[r], fleet[r], shrank, now_s, config.capacity_half_life_s
        )
    # what the current load needs, without the burst insurance below (also how far a role
    # may give GPUs up to a role that violates its target now)
    recs: dict[Role, int] = {}
    limits: dict[Role, float | None] = {}
    reasons: list[str] = []
    for r in ROLES:
        slope = _trend(r, views[r].demand, now_s, config, history)
        limits[r] = limit = _down_limit(r, learned, caps[r], views[r].target, config)
        coming = starting(r, fleet[r], now_s, config, history)
        settled = _stable_ready(r, fleet[r].ready, now_s, metrics.window_s, history)
        n, why = recommend(
            r, views[r], caps[r], fleet[r].current, fleet[r].ready, slope, config, limit,
            coming, settled,
        )  # fmt: skip
        if (
            r == "decode"
            and n > fleet[r].current
            and views[r].latency <= views[r].target
            and cap.fitted(learned.decode, views[r].target) is None
        ):
            # ITL rises smoothly with the batch: under target with no fitted curve yet, the
            # observed latency outranks a prior (or the load just seen) that says it is full
            n = fleet[r].current
            why += "; ITL under target, no fit yet: holding"
        if (
            r == "prefill"
            and n > fleet[r].current
            and not cap.bracket_bounded(learned.prefill_bracket, config.prefill_capacity_prior)
            and views[r].latency < 0.5 * views[r].target
            and not views[r].queue_breaks_target(config.lookahead_s)
        ):
            # only the queue fit says it is full: a line through a few windows far under the
            # target is an extrapolation, and the queue does not break the target either
            n = fleet[r].current
            why += "; TTFT far under target, queue within it: holding"
        if fleet[r].pending > 0 and n > fleet[r].current:
            # the cluster cannot place the pods asked for already; more would wait too
            n = fleet[r].current
            why += f"; {fleet[r].pending} pending, not growing"
        recs[r] = clamp(r, n, config)
        reasons.append(why)
    current = {r: fleet[r].current for r in ROLES}
    stable = {
        r: clamp(r, stabilize(r, recs[r], current[r], now_s, config, history), config)
        for r in ROLES
    }
    # the burst floor applies after stabilization: it is a memory of its own (a decayed
    # maximum); inside the recommendations the window held each burst undecayed for the
    # whole stabilization window on top of its half-life
    floor = burst_floor(config, learned, caps["prefill"], limits["prefill"])
    if stable["prefill"] < min(current["prefill"], floor):
        stable["prefill"] = min(current["prefill"], floor)
        reasons.append(
            f"prefill: busiest recent burst {learned.prefill_busiest:.0f}/s needs {floor}"
        )
    floor = decode_burst_floor(learned, now_s, decode_per_replica)
    if stable["decode"] < floor:
        stable["decode"] = floor
        reasons.append(f"decode: burst {learned.decode_burst:.0f}/s that broke ITL needs {floor}")
    for r in ROLES:
        load = views[r].peak
        floor = undone_floor(r, learned, load, now_s, config)
        if stable[r] < min(current[r], floor):
            stable[r] = min(current[r], floor)
            undone = learned.undone(r)
            assert undone is not None
            reasons.append(
                f"{r}: {undone.size} broke the target at {undone.load:.0f}/s after a shrink"
                f" to it; load {load:.0f}/s keeps {stable[r]}"
            )
    for r in ROLES:
        # decode's load rises at a pace a smaller pool can be checked against; prefill's
        # comes in bursts, whose next peak no pace foretells
        limit = limits[r] if r == "decode" else None
        smaller = limit * stable[r] if limit else None
        if stable[r] < current[r] and rising_past(
            r, views[r], smaller, now_s, metrics.window_s, config, history
        ):
            # a scale-down in the middle of a rise would be taken back within the window
            stable[r] = current[r]
            reasons.append(f"{r}: demand rising, not shrinking")
    violating = {r: views[r].violating for r in ROLES}
    for r in ROLES:
        window = config.scale_down_stabilization_s
        if stable[r] > current[r] and not violating[r] and moved(r, -1, now_s, window, history):
            # no reversal the other way either: after a scale-down inside the window, only a
            # violated target grows a role back, not a forecast
            stable[r] = current[r]
            reasons.append(f"{r}: shrank within the window, grows back only on a violation")
    pressure = {r: views[r].demand / (caps[r] or math.inf) / max(current[r], 1) for r in ROLES}
    final, budget_reasons = fit_budget(stable, current, recs, pressure, violating, config)
    reasons.extend(budget_reasons)
    for r in ROLES:
        if final[r] != current[r]:
            reasons.append(f"{r}: {current[r]} -> {final[r]}")
    conditions = [PolicyCondition("MetricsAvailable", "True", "MetricsFresh"), *_pending(fleet)]
    if budget_reasons:
        conditions.append(PolicyCondition("BudgetLimited", "True", "GPUBudget", budget_reasons[-1]))
    return Decision(
        at_s=now_s,
        prefill=final["prefill"],
        decode=final["decode"],
        recommended_prefill=recs["prefill"],
        recommended_decode=recs["decode"],
        reasons=tuple(reasons),
        conditions=tuple(conditions),
        capacity=learned,
        observed=DemandSample(
            prefill_demand=views["prefill"].demand,
            decode_demand=views["decode"].demand,
            prefill_ready=prefill.ready,
            decode_ready=decode.ready,
        ),
    )


def trim_history(
    history: Sequence[Decision], now_s: float, config: PolicyConfig
) -> tuple[Decision, ...]:
    """The decisions a caller needs to keep: those inside the longest window."""
    keep = (
        max(
            config.scale_down_stabilization_s,
            config.scale_up_stabilization_s,
            config.trend_window_s,
        )
        + config.interval_s
    )
    return tuple(h for h in history if now_s - h.at_s <= keep)


__all__ = [
    "Capacity",
    "Decision",
    "DemandSample",
    "MetricsWindow",
    "PolicyCondition",
    "PolicyConfig",
    "RoleMetrics",
    "RoleReplicas",
    "decide",
    "decode_latency",
    "trim_history",
]
