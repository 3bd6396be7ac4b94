"""The SLO-driven autoscaling policy: a pure function from observations to replica counts.

Where it fits: the operator's autoscale timer (and the fleet simulator behind
`pdfleet.autoscale.bench`, and any other simulator) calls `decide()` once per interval with
plain frozen data and gets plain frozen data back. No I/O, no clock, no globals: the caller
supplies `now_s`, the metrics window, the replica counts and the recent decisions, and keeps
the returned `Decision` for the next call. `PolicyConfig` is the policy's own configuration;
an adapter maps the InferenceService spec into it.

The algorithm, per role (prefill is judged on TTFT, decode on ITL):
1. Hold everything when metrics are missing, stale or NaN (`MetricsAvailable=False`).
2. Learn the capacity of one replica at its latency target from (load per *ready* replica,
   latency quantile) pairs (`capacity.py`), capped by violations.
3. Recommend ceil(forecast demand / (capacity x target utilization)), where the forecast adds
   the recent upward trend over the start-up delay; hysteresis: a lower count must also hold
   at the (lower) scale-down utilization.
4. Feedback: while a role violates its target it never shrinks and gets at least one more
   replica than it has ready (replicas still starting already count as that extra one).
5. Stabilize like the HPA: scale up to the lowest recommendation of the short up-window,
   down to the highest of the long down-window; bound each step.
6. Clamp to min/max, then fit the GPU budget, giving GPUs to the most loaded role and moving
   GPUs from a role with slack to one that violates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdfleet.autoscale import capacity as cap

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


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
    capacity_half_life_s: float = 900.0
    trend_window_s: float = 300.0
    # Optional priors (load per replica at the target): prompt tokens/s for prefill,
    # generated tokens/s for decode. Without them the policy starts in feedback-only mode.
    prefill_capacity_prior: float | None = None
    decode_capacity_prior: float | None = None

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


@dataclass(frozen=True)
class RoleReplicas:
    """Replica counts of one role: desired in the StatefulSet, ready, and unschedulable."""

    current: int
    ready: int
    pending: int = 0  # Pending pods: never counted as capacity


@dataclass(frozen=True)
class RoleMetrics:
    """One window of a role's signals, summed (rates, queue) or averaged (KV) over its pods.

    Latencies are the configured percentile; NaN where the histogram had no samples.
    """

    ttft_s: float
    itl_s: float
    request_rate: float
    prompt_tokens_rate: float
    generation_tokens_rate: float
    num_requests_waiting: float
    kv_cache_usage: float


@dataclass(frozen=True)
class MetricsWindow:
    """Signals of both roles over [at_s - window_s, at_s]; None for a role means missing."""

    at_s: float
    window_s: float
    prefill: RoleMetrics | None
    decode: RoleMetrics | None


@dataclass(frozen=True)
class Condition:
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Observed:
    """What a decision saw, kept for trends and for telling stable windows from transitions."""

    prefill_demand: float  # prompt tokens/s
    decode_demand: float  # generated tokens/s
    prefill_ready: int
    decode_ready: int


@dataclass(frozen=True)
class Capacity:
    prefill: cap.RoleCapacity = field(default_factory=cap.RoleCapacity)
    decode: cap.RoleCapacity = field(default_factory=cap.RoleCapacity)

    def get(self, role: Role) -> cap.RoleCapacity:
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class Decision:
    """Desired replicas per role plus why; feed it back as history on the next call."""

    at_s: float
    prefill: int
    decode: int
    recommended_prefill: int  # before stabilization, step limits and budget
    recommended_decode: int
    reasons: tuple[str, ...]
    conditions: tuple[Condition, ...]
    capacity: Capacity
    observed: Observed | None

    def desired(self, role: Role) -> int:
        return self.prefill if role == "prefill" else self.decode

    def recommended(self, role: Role) -> int:
        return self.recommended_prefill if role == "prefill" else self.recommended_decode


@dataclass(frozen=True)
class _RoleView:
    """Per-role inputs after validation: demand, load per ready replica, latency vs target."""

    demand: float
    latency: float
    target: float
    x: float  # demand per ready replica
    waiting: float
    mean_prompt: float


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


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


def _views(
    config: PolicyConfig, m: MetricsWindow, fleet: dict[Role, RoleReplicas]
) -> dict[Role, _RoleView]:
    assert m.prefill is not None and m.decode is not None
    p, d = m.prefill, m.decode
    # The end-to-end TTFT is prefill-side plus decode-side (KV pull, admission, first step);
    # prefill gets what the decode side leaves of the target, but at least half of it.
    decode_ttft = d.ttft_s if _finite(d.ttft_s) else 0.0
    ttft_budget = max(config.ttft_target_s - decode_ttft, 0.5 * config.ttft_target_s)
    mean_prompt = p.prompt_tokens_rate / p.request_rate if p.request_rate > 0 else 0.0
    return {
        "prefill": _RoleView(
            demand=p.prompt_tokens_rate,
            latency=p.ttft_s if _finite(p.ttft_s) else 0.0,
            target=ttft_budget,
            x=p.prompt_tokens_rate / max(fleet["prefill"].ready, 1),
            waiting=p.num_requests_waiting,
            mean_prompt=mean_prompt,
        ),
        "decode": _RoleView(
            demand=d.generation_tokens_rate,
            latency=d.itl_s if _finite(d.itl_s) else 0.0,
            target=config.itl_target_s,
            x=d.generation_tokens_rate / max(fleet["decode"].ready, 1),
            waiting=d.num_requests_waiting,
            mean_prompt=mean_prompt,
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


def _trend(
    role: Role, demand: float, now_s: float, config: PolicyConfig, history: Sequence[Decision]
) -> float:
    """Upward demand slope per second over the trend window (0 when flat or falling)."""
    oldest: Decision | None = None
    for h in history:
        age = now_s - h.at_s
        if h.observed is None or age > config.trend_window_s or age < config.interval_s:
            continue
        if oldest is None or h.at_s < oldest.at_s:
            oldest = h
    if oldest is None or oldest.observed is None:
        return 0.0
    past = oldest.observed.prefill_demand if role == "prefill" else oldest.observed.decode_demand
    return max(0.0, (demand - past) / (now_s - oldest.at_s))


def recommend(
    role: Role,
    view: _RoleView,
    capacity: float | None,
    current: int,
    ready: int,
    slope: float,
    config: PolicyConfig,
) -> tuple[int, str]:
    """Raw replica recommendation for one role, before stabilization, and why."""
    violating = view.latency > view.target
    if capacity is None:
        # Feedback-only until the capacity is known: +1 on violation, -1 when far below.
        if violating:
            return max(current, ready + 1), f"{role}: over target, capacity unknown"
        if view.latency < 0.5 * view.target and view.waiting == 0:
            return current - 1, f"{role}: well under target, capacity unknown"
        return current, f"{role}: capacity unknown, holding"
    lookahead = config.startup_s + config.interval_s
    forecast = view.demand + slope * lookahead
    if role == "prefill" and view.mean_prompt > 0:
        # queued prompts must be worked off within a start-up delay on top of new arrivals
        forecast += view.waiting * view.mean_prompt / lookahead
    util = config.utilization(role)
    n = math.ceil(forecast / (capacity * util) - 1e-9)
    if n < current:
        down_util = util * config.scale_down_margin
        n = max(n, math.ceil(view.demand / (capacity * down_util) - 1e-9))
    why = (
        f"{role}: demand {view.demand:.0f}/s (forecast {forecast:.0f}), "
        f"capacity {capacity:.0f}/s per replica -> {n}"
    )
    if violating:
        n = max(n, current, ready + 1)
        why += f"; latency {view.latency:.3f}s over target {view.target:.3f}s"
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
    recently_changed = any(
        h.desired(role) != current
        for h in history
        if now_s - h.at_s < config.scale_down_period_s
    )
    if down < current and not recently_changed:
        return max(down, current - config.max_scale_down_step)
    return current


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
    role still wants more and the budget is spent, a role whose own need is below its count
    gives GPUs up (a move between pools), within its scale-down step.
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
        conditions=(Condition("MetricsAvailable", "False", reason), *_pending(fleet)),
        capacity=last.capacity if last else Capacity(),
        observed=None,
    )


def _pending(fleet: dict[Role, RoleReplicas]) -> tuple[Condition, ...]:
    stuck = [f"{r}={fleet[r].pending}" for r in ROLES if fleet[r].pending > 0]
    if stuck:
        return (
            Condition(
                "InsufficientCapacity",
                "True",
                "PodsPending",
                "pending replicas: " + ", ".join(stuck),
            ),
        )
    return (Condition("InsufficientCapacity", "False", "AllScheduled"),)


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
    learned: dict[Role, cap.RoleCapacity] = {}
    caps: dict[Role, float | None] = {}
    for r in ROLES:
        state = last_cap.get(r)
        v = views[r]
        if fleet[r].ready > 0 and _stable_ready(
            r, fleet[r].ready, now_s, metrics.window_s, history
        ):
            # "loaded" is judged against the larger of belief and prior, so that an early
            # low estimate cannot make every burst look like a capacity limit
            before = max(cap.capacity(state, v.target, config.prior(r)) or 0.0,
                         config.prior(r) or 0.0) or None
            state = cap.observe(
                state, metrics.at_s, v.x, v.latency, v.target, config.capacity_half_life_s,
                before,
            )
        learned[r] = state
        caps[r] = cap.capacity(state, v.target, config.prior(r))
    recs: dict[Role, int] = {}
    reasons: list[str] = []
    for r in ROLES:
        slope = _trend(r, views[r].demand, now_s, config, history)
        n, why = recommend(r, views[r], caps[r], fleet[r].current, fleet[r].ready, slope, config)
        recs[r] = clamp(r, n, config)
        reasons.append(why)
    current = {r: fleet[r].current for r in ROLES}
    stable = {
        r: clamp(r, stabilize(r, recs[r], current[r], now_s, config, history), config)
        for r in ROLES
    }
    violating = {r: views[r].latency > views[r].target for r in ROLES}
    pressure = {r: views[r].demand / (caps[r] or math.inf) / max(current[r], 1) for r in ROLES}
    final, budget_reasons = fit_budget(stable, current, recs, pressure, violating, config)
    reasons.extend(budget_reasons)
    for r in ROLES:
        if final[r] != current[r]:
            reasons.append(f"{r}: {current[r]} -> {final[r]}")
    conditions = [Condition("MetricsAvailable", "True", "MetricsFresh"), *_pending(fleet)]
    if budget_reasons:
        conditions.append(Condition("BudgetLimited", "True", "GPUBudget", budget_reasons[-1]))
    return Decision(
        at_s=now_s,
        prefill=final["prefill"],
        decode=final["decode"],
        recommended_prefill=recs["prefill"],
        recommended_decode=recs["decode"],
        reasons=tuple(reasons),
        conditions=tuple(conditions),
        capacity=Capacity(prefill=learned["prefill"], decode=learned["decode"]),
        observed=Observed(
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
    "Condition",
    "Decision",
    "MetricsWindow",
    "Observed",
    "PolicyConfig",
    "RoleMetrics",
    "RoleReplicas",
    "decide",
    "trim_history",
]
