"""Online capacity model: how much load one replica of a role sustains at its latency target.

Where it fits: `pdfleet.autoscale.policy.decide` calls `observe` once per role and decision
tick and sizes each pool with `capacity`. The state is a frozen value carried inside the
previous `Decision`, so the policy stays a pure function and the operator can persist it in
status like any other field.

The model. For a pool of identical servers the latency quantile `y` grows with the load per
replica `x` roughly like a single queue, y = s / (1 - x/mu) (exact for an M/M/1 sojourn time,
and exact for a decode engine whose step time is linear in the batch: ITL = d0 + k*B with
B = x*ITL gives ITL = d0 / (1 - k*x)). Inverse latency z = 1/y is therefore linear in x, and
the capacity at a target T is where the fitted line crosses 1/T. The fit uses exponentially
weighted moments so a changing request mix (longer prompts, shorter answers) is followed.

Feedback on violations: a window whose latency exceeded the target at load x caps the
capacity at x*T/y. The cap relaxes with the same half-life, so one burst does not pin a pool
forever, but a workload whose bursts break the target keeps learning a lower, safer number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Below this relative spread of the observed loads the slope is noise, not signal.
_MIN_RELATIVE_SPREAD = 0.05
# A fit may move the capacity at most this factor away from the largest load seen meeting the
# target (or the prior, when larger); extrapolating a line further than that is guessing.
_MAX_EXTRAPOLATION = 3.0
# A violation can cut the estimate at most this much: a burst that broke the target at a
# small average load says more about the burst than about the replica.
_MAX_FEEDBACK_CUT = 0.9
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
    updated_at_s: float | None = None


def _decay(state: RoleCapacity, at_s: float, half_life_s: float) -> RoleCapacity:
    if state.updated_at_s is None or at_s <= state.updated_at_s:
        return state
    f = 0.5 ** ((at_s - state.updated_at_s) / half_life_s)
    return RoleCapacity(
        weight=state.weight * f,
        sum_x=state.sum_x * f,
        sum_z=state.sum_z * f,
        sum_xx=state.sum_xx * f,
        sum_xz=state.sum_xz * f,
        # the cap drifts up towards "unknown" and the record down towards zero
        ceiling=state.ceiling / f,
        best_ok=state.best_ok * f,
        updated_at_s=at_s,
    )


def observe(
    state: RoleCapacity, at_s: float, x: float, y: float, target: float, half_life_s: float,
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
        ceiling = min(ceiling, x * target / y)
    best_ok = max(state.best_ok, x) if y <= target else state.best_ok
    return RoleCapacity(
        weight=state.weight + 1.0,
        sum_x=state.sum_x + x,
        sum_z=state.sum_z + z,
        sum_xx=state.sum_xx + x * x,
        sum_xz=state.sum_xz + x * z,
        ceiling=ceiling,
        best_ok=best_ok,
        updated_at_s=at_s,
    )


def fitted(state: RoleCapacity, target: float) -> float | None:
    """Load per replica where the fitted 1/latency line reaches 1/target; None if unknown."""
    if state.weight < 3.0:
        return None
    mx = state.sum_x / state.weight
    mz = state.sum_z / state.weight
    var_x = state.sum_xx / state.weight - mx * mx
    if mx <= 0 or var_x <= (_MIN_RELATIVE_SPREAD * mx) ** 2:
        return None
    slope = (state.sum_xz / state.weight - mx * mz) / var_x
    if slope >= 0:  # latency not rising with load: no evidence of a limit yet
        return None
    intercept = mz - slope * mx
    if intercept <= 1.0 / target:  # even an idle replica would miss the target
        return 0.0
    return (1.0 / target - intercept) / slope


def capacity(state: RoleCapacity, target: float, prior: float | None) -> float | None:
    """Best estimate of the load one replica sustains at `target`, or None if unknown.

    The fit (else the prior) bounded by the evidence: never below the largest load seen
    meeting the target unless a violation says so, under the violation cap (which cuts at most
    by half), and never extrapolated more than a few times past the loads actually seen.
    """
    est = fitted(state, target)
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
