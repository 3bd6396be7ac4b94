"""Online capacity model: how much load one replica of a role sustains at its latency target.

Where it fits: `pdfleet.autoscale.policy.decide` calls `observe` once per role and decision
tick and sizes decode with `capacity`; prefill, a batching engine whose latency is flat until
it saturates, is sized with the bracket at the end of this module (`observe_bracket`,
`bracket_capacity`). The state is a frozen value carried inside the
previous `Decision`, so the policy stays a pure function and the operator can persist it in
status like any other field.

The queue model (decode). For a pool of identical servers the latency quantile `y` grows
with the load per replica `x` roughly like a single queue, y = s / (1 - x/mu) (exact for an
M/M/1 sojourn time, and exact for a decode engine whose step time is linear in the batch:
ITL = d0 + k*B with B = x*ITL gives ITL = d0 / (1 - k*x)). Inverse latency z = 1/y is
therefore linear in x, and the capacity at a target T is where the fitted line crosses 1/T.
The fit uses exponentially weighted moments so a changing request mix is followed.

Anchored at the idle latency. At light load the latency barely moves with the load, so the
free fit has no slope to read. The model still pins the line's intercept: 1/y at x = 0 is
the idle latency (one decode step with an empty batch), and the lowest latency seen is an
estimate of it from below, which only makes the anchored line steeper (safer). The line
through that intercept and the observations then says how far the target is, within the
same bound on extrapolation as the free fit.

Feedback on violations: a window whose latency y exceeded the target T at load x caps the
capacity where the queue model puts T, the line of 1/latency through the idle latency and
that window (x*T/y before an idle latency is known); the cap cuts the estimate at most by
half. It relaxes with the same half-life, so one burst does not pin a pool forever, but a
workload whose bursts break the target keeps learning a lower, safer number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Below this relative spread of the observed loads the slope is noise, not signal.
_MIN_RELATIVE_SPREAD = 0.05
# A fitted 1/latency that moves less than this share across the loads seen is flat.
_MIN_RELATIVE_RISE = 0.01
# A fit may move the capacity at most this factor away from the largest load seen meeting the
# target (or the prior, when larger); extrapolating a line further than that is guessing.
_MAX_EXTRAPOLATION = 3.0
# A violation can cut the estimate at most this much: a burst that broke the target at a
# small average load says more about the burst than about the replica.
_MAX_FEEDBACK_CUT = 0.5
_LOADED = 0.5  # share of the estimate above which a violation counts against capacity


@dataclass(frozen=True)
class RoleCapacity:
    """Exponentially weighted sufficient statistics of (x, 1/y) for one role."""

    weight: float = 0.0
    sum_x: float = 0.0
    sum_z: float = 0.0
    sum_xx: float = 0.0
    sum_xz: float = 0.0
    ceiling: float = math.inf  # load per replica that broke the target (feedback cap)
    best_ok: float = 0.0  # largest load per replica seen meeting the target (decays too)
    # lowest latency seen: the idle latency from below (kept, not decayed: a low value only
    # makes the anchored fit more cautious)
    floor: float = math.inf
    updated_at_s: float | None = None


def fade(elapsed_s: float, half_life_s: float) -> float:
    """The share of a memory left after `elapsed_s` with a half-life: 0 (all forgotten) where
    the half-life is not positive or the share underflows, never a division by zero."""
    if not elapsed_s > 0:
        return 1.0
    return 0.5 ** (elapsed_s / half_life_s) if half_life_s > 0 else 0.0


def _decay(state: RoleCapacity, at_s: float, half_life_s: float) -> RoleCapacity:
    if state.updated_at_s is None or at_s <= state.updated_at_s:
        return state
    f = fade(at_s - state.updated_at_s, half_life_s)
    if f == 0.0:  # everything faded: the idle-latency floor is kept, as ever
        return RoleCapacity(floor=state.floor, updated_at_s=at_s)
    return RoleCapacity(
        weight=state.weight * f,
        sum_x=state.sum_x * f,
        sum_z=state.sum_z * f,
        sum_xx=state.sum_xx * f,
        sum_xz=state.sum_xz * f,
        # the cap drifts up towards "unknown" and the record down towards zero
        ceiling=state.ceiling / f,
        best_ok=state.best_ok * f,
        floor=state.floor,
        updated_at_s=at_s,
    )


def observe(
    state: RoleCapacity,
    at_s: float,
    x: float,
    y: float,
    target: float,
    half_life_s: float,
    estimate: float | None = None,
) -> RoleCapacity:
    """Fold one window's (load per replica `x`, latency quantile `y`) into the model.

    `estimate` is the capacity believed so far: a violation at less than half of it is a
    burst inside the window, answered by the policy's feedback, not a lower capacity.
    """
    state = _decay(state, at_s, half_life_s)
    if not (x > 0 and math.isfinite(x) and y > 0 and math.isfinite(y) and target > 0):
        return replace(state, updated_at_s=at_s)
    z = 1.0 / y
    loaded = estimate is None or x >= _LOADED * estimate
    ceiling = state.ceiling
    if y > target and loaded:
        ceiling = min(ceiling, violation_cap(x, y, target, min(state.floor, y)))
    best_ok = max(state.best_ok, x) if y <= target else state.best_ok
    return RoleCapacity(
        weight=state.weight + 1.0,
        sum_x=state.sum_x + x,
        sum_z=state.sum_z + z,
        sum_xx=state.sum_xx + x * x,
        sum_xz=state.sum_xz + x * z,
        ceiling=ceiling,
        best_ok=best_ok,
        floor=min(state.floor, y),
        updated_at_s=at_s,
    )


def violation_cap(x: float, y: float, target: float, floor: float) -> float:
    """The load per replica at which the queue model puts `target`, from one window that
    broke it (latency `y` at load `x`) and the idle latency `floor`: the line of 1/latency
    through 1/floor at no load and 1/y at `x`. Without a floor under the target, x*target/y."""
    if not (floor < target < y):
        return x * target / y
    return x * (1.0 / floor - 1.0 / target) / (1.0 / floor - 1.0 / y)


def fitted(state: RoleCapacity, target: float) -> float | None:
    """Load per replica where the fitted 1/latency line reaches 1/target; None if unknown."""
    if state.weight < 3.0 or not target > 0:
        return None
    mx = state.sum_x / state.weight
    mz = state.sum_z / state.weight
    var_x = state.sum_xx / state.weight - mx * mx
    if mx <= 0 or var_x <= (_MIN_RELATIVE_SPREAD * mx) ** 2:
        return None
    slope = (state.sum_xz / state.weight - mx * mz) / var_x
    # latency not rising with load (by more than rounding over the loads seen): no limit yet
    if slope * math.sqrt(var_x) > -_MIN_RELATIVE_RISE * mz:
        return None
    intercept = mz - slope * mx
    if intercept <= 1.0 / target:  # even an idle replica would miss the target
        return 0.0
    return (1.0 / target - intercept) / slope


def anchored(state: RoleCapacity, target: float) -> float | None:
    """Where the line through the idle latency and the observations reaches 1/target.

    A least-squares slope with the intercept fixed at 1/floor; None with too little data or
    no latency rise above the floor (then nothing says where the limit is).
    """
    if state.weight < 3.0 or not math.isfinite(state.floor) or state.sum_xx <= 0:
        return None
    if not target > 0:
        return None
    z0 = 1.0 / state.floor
    slope = (state.sum_xz - z0 * state.sum_x) / state.sum_xx
    if slope >= 0:
        return None
    if z0 <= 1.0 / target:
        return 0.0
    return (1.0 / target - z0) / slope


def capacity(state: RoleCapacity, target: float, prior: float | None) -> float | None:
    """Best estimate of the load one replica sustains at `target`, or None if unknown.

    The fit (else the prior, else the anchored fit) bounded by the evidence: never below the
    largest load seen meeting the target unless a violation says so, under the violation cap
    (which cuts at most by half), and never extrapolated more than a few times past the loads
    actually seen.
    """
    est = fitted(state, target)
    if est is None and prior is None:
        est = anchored(state, target)
    if est is None:
        est = prior
    elif state.best_ok > 0:
        est = min(est, max(_MAX_EXTRAPOLATION * state.best_ok, prior or 0.0))
    if est is None:
        if state.best_ok <= 0:
            return None
        est = state.best_ok
    est = max(est, min(state.best_ok, state.ceiling))
    est = max(min(est, state.ceiling), _MAX_FEEDBACK_CUT * est)
    return est if est > 0 else None


# --- saturation capacity of a batching engine (prefill) ------------------------------------
#
# A batching prefill engine does not queue like a single server: its TTFT stays flat (own
# prompt time plus a short wait) until the offered load reaches the engine's token throughput,
# then the backlog grows without bound. The queue fit above reads the flat part as "far from
# capacity" and the explosion as noise, so it underestimates. Instead, bracket the capacity
# between the highest load per replica seen meeting the target (`held`) and the lowest seen
# breaking it while loaded (`broke`), and move a working estimate (`probe`) inside the bracket
# AIMD-style: up a little while the target holds under load, down by a factor on a violation.

_PROBE_UP = 0.02  # relative increase per window that holds the target under load
_PROBE_DOWN = 0.85  # factor on a violation under load
_PROBE_LOADED = 0.7  # a window says something about capacity above this share of the estimate
_PROBE_REACH = 1.25  # never plan for more than this factor above the load seen holding
_BROKE_MARGIN = 0.95  # stay this far below the lowest load seen breaking the target


@dataclass(frozen=True)
class Bracket:
    """What a replica of a batching engine sustains: evidence and the AIMD estimate."""

    held: float = 0.0  # highest load per replica seen meeting the target (decays slowly)
    broke: float = math.inf  # lowest load per replica seen breaking it (relaxes upwards)
    probe: float | None = None  # working estimate; None until the first loaded window
    updated_at_s: float | None = None
    cut_at_s: float | None = None  # last multiplicative decrease


def _relax(state: Bracket, at_s: float, half_life_s: float) -> Bracket:
    if state.updated_at_s is None or at_s <= state.updated_at_s:
        return state
    f = fade(at_s - state.updated_at_s, half_life_s)
    # "held" is solid evidence, kept four times longer than a violation is
    broke = state.broke / f if f > 0.0 else math.inf
    return replace(state, held=state.held * f**0.25, broke=broke, updated_at_s=at_s)


def observe_bracket(
    state: Bracket,
    at_s: float,
    x: float,
    y: float,
    target: float,
    half_life_s: float,
    prior: float | None,
    window_s: float = 60.0,
    draining: bool = False,
) -> Bracket:
    """Fold one window (peak load per replica `x`, latency quantile `y`) in.

    Overlapping windows repeat the same evidence, so the estimate is cut at most once per
    `window_s`. A violation below `_PROBE_LOADED` of the estimate, or at a load seen holding
    the target before, is a burst or a backlog still draining (the policy's feedback answers
    it), not a capacity limit. So is one while the queue shrinks (`draining`): the pool
    serves more than arrives, and the latency is the wait of prompts queued before.
    """
    state = _relax(state, at_s, half_life_s)
    if not (x > 0 and math.isfinite(x) and math.isfinite(y) and target > 0):
        return replace(state, updated_at_s=at_s)
    est = bracket_capacity(state, prior)
    loaded = est is None or x >= _PROBE_LOADED * est
    probe = state.probe if state.probe is not None else est
    held, broke, cut_at = state.held, state.broke, state.cut_at_s
    if y <= target:
        held = max(held, x)
        if loaded and probe is not None:
            probe = max(probe, held) * (1.0 + _PROBE_UP)  # what held is sustainable
    elif loaded and x > held and not draining:
        broke = min(broke, x)
        # above the estimate the violation confirms it; at or below it, it was too high
        if (est is None or x <= est) and (cut_at is None or at_s - cut_at >= window_s):
            probe = min(probe if probe is not None else x, x) * _PROBE_DOWN
            cut_at = at_s
    new = Bracket(held=held, broke=broke, probe=probe, updated_at_s=at_s, cut_at_s=cut_at)
    bound = bracket_capacity(new, prior)
    if probe is not None and bound is not None and probe > bound:  # no wind-up above the cap
        new = replace(new, probe=bound)
    return new


def within_reach(state: Bracket) -> float:
    """The most load per replica the evidence alone speaks for: a little above the highest
    seen holding the target (0.0 when nothing has held yet)."""
    return _PROBE_REACH * state.held


def bracket_bounded(state: Bracket, prior: float | None) -> bool:
    """True when something says where the engine saturates: a prior or a violation under load.

    Without either, `held` is only a lower bound (the pool met the target at that load), and
    planning for a share of it would call any pool full: the policy then stays on feedback.
    """
    return prior is not None or math.isfinite(state.broke)


def bracket_capacity(state: Bracket, prior: float | None) -> float | None:
    """Load per replica to plan for: the estimate (else the prior) kept inside the evidence."""
    est = state.probe if state.probe is not None else prior
    if est is None:
        return state.held or None
    hi = _BROKE_MARGIN * state.broke
    if state.held > 0:
        hi = min(hi, _PROBE_REACH * max(state.held, prior or 0.0))
    est = min(est, hi)
    est = max(est, min(state.held, hi))  # what held the target is sustainable
    return est if est > 0 else None
