"""Controllers the benchmark compares: pdfleet's policy and the baselines it must beat.

Where it fits: each class here is a `pdfleet_lab.sim.Controller` (called once per
interval with replica counts and a metrics window); `pdfleet_lab.bench` runs them all
through the same simulator. The clairvoyant bound lives in `oracle.py`.

- `PolicyController`: `policy.decide` plus the history the operator would keep in status.
- `ThresholdController`: per-role target tracking on queue length and KV usage, the way
  AIBrix's APA or a KEDA ScaledObject on `vllm:num_requests_waiting` scales a role.
- `PlannerController`: the Dynamo planner's throughput loop (1.x `throughput_scaling.py`, see
  `reference/autoscaling.md` §1.5): replicas = ceil(demand rps / engine rps), engine rps from
  an SLA-constrained batch-size search over the perf model, constant load predictor, step
  cap, min endpoint and the proportional GPU-budget clamp (§1.4 step 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdfleet.autoscale.policy import (
    Decision,
    MetricsWindow,
    PolicyConfig,
    RoleReplicas,
    decide,
    trim_history,
)

if TYPE_CHECKING:
    from pdfleet_worker.perfmodel import PerfModel


@dataclass
class PolicyController:
    """Drives `policy.decide` and keeps its decisions (the operator keeps them in status)."""

    config: PolicyConfig
    history: tuple[Decision, ...] = ()
    decisions: list[Decision] = field(default_factory=list)

    def __call__(
        self, now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow
    ) -> tuple[int, int]:
        dec = decide(self.config, now, p, d, m, self.history)
        self.history = trim_history((*self.history, dec), now, self.config)
        self.decisions.append(dec)
        return dec.prefill, dec.decode


def _proportional_budget(p: int, d: int, budget: int, gp: int = 1, gd: int = 1) -> tuple[int, int]:
    """Dynamo's classic clamp: scale both down by budget/total, decode takes the rest."""
    total = p * gp + d * gd
    if total <= budget:
        return p, d
    scale = budget / total
    p2 = max(1, round(p * scale))
    d2 = max(1, round((budget - p2 * gp) / gd))
    return p2, d2


@dataclass
class ThresholdController:
    """Per-role thresholds: prefill on waiting requests per replica, decode on KV usage.

    Above target by more than the tolerance: ceil(n * ratio) (at most doubling); below: the
    highest recommendation of the cool-down window (at most halving). Defaults follow the
    llm-d WVA saturation thresholds (queue 5, KV 0.8) and AIBrix APA's 10 % tolerance and
    300 s scale-down cool-down.
    """

    budget: int
    min_replicas: int = 1
    max_replicas: int = 11
    queue_target: float = 5.0
    kv_target: float = 0.8
    tolerance: float = 0.1
    cooldown_s: float = 300.0
    recs: list[tuple[int, int]] = field(default_factory=list)
    rec_times: list[float] = field(default_factory=list)

    def _role(self, n: int, ratio: float) -> int:
        if ratio > 1 + self.tolerance:
            return min(2 * n, math.ceil(n * ratio))
        if ratio < 1 - self.tolerance:
            return max(math.ceil(n / 2), math.ceil(n * ratio))
        return n

    def __call__(
        self, now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow
    ) -> tuple[int, int]:
        if m.prefill is None or m.decode is None:
            return p.current, d.current
        p_ratio = max(
            m.prefill.num_requests_waiting / max(p.ready, 1) / self.queue_target,
            m.prefill.kv_cache_usage / self.kv_target,
        )
        d_ratio = max(
            m.decode.num_requests_waiting / max(d.ready, 1) / self.queue_target,
            m.decode.kv_cache_usage / self.kv_target,
        )
        rp, rd = self._role(max(p.current, 1), p_ratio), self._role(max(d.current, 1), d_ratio)
        keep = [i for i, t in enumerate(self.rec_times) if now - t < self.cooldown_s]
        self.recs = [self.recs[i] for i in keep] + [(rp, rd)]
        self.rec_times = [self.rec_times[i] for i in keep] + [now]
        out = []
        for cur, rec, idx in ((p.current, rp, 0), (d.current, rd, 1)):
            if rec < cur:  # scale down only to the highest recommendation of the cool-down
                rec = min(cur, max(r[idx] for r in self.recs))
            out.append(max(self.min_replicas, min(self.max_replicas, rec)))
        return _proportional_budget(out[0], out[1], self.budget)


def prefill_engine_rps(perf: PerfModel, isl: float, ttft_sla: float) -> float:
    """Best requests/s of one prefill engine over batch sizes whose TTFT meets the SLA."""
    isl_i = max(1, round(isl))
    best, best_any = 0.0, 0.0
    max_bs = max(1, min(perf.max_num_seqs, perf.max_num_batched_tokens // isl_i))
    for bs in range(1, max_bs + 1):
        tokens: int = bs * isl_i
        full, rest = divmod(tokens, perf.max_num_batched_tokens)
        ttft = full * perf.prefill_seconds(perf.max_num_batched_tokens)
        ttft += perf.prefill_seconds(int(rest)) if rest else 0.0
        rps = bs / ttft
        best_any = max(best_any, rps)
        if ttft <= ttft_sla:
            best = max(best, rps)
    return best or best_any  # like Dynamo: never refuse to scale, log "SLA not met"


def decode_engine_rps(perf: PerfModel, isl: float, osl: float, itl_sla: float) -> float:
    """Best requests/s of one decode engine (Little's law) over batches meeting the ITL SLA."""
    ctx = isl + osl / 2
    max_bs = max(1, min(perf.max_num_seqs, int(perf.kv_capacity_tokens // max(ctx, 1))))
    best, best_any = 0.0, 0.0
    for bs in range(1, max_bs + 1):
        itl = perf.decode_step_seconds(bs, ctx)
        rps = bs / (max(osl, 1.0) * itl)
        best_any = max(best_any, rps)
        if itl <= itl_sla:
            best = max(best, rps)
    return best or best_any


@dataclass
class PlannerController:
    """Dynamo planner, throughput mode, with a constant predictor (last interval's load).

    `headroom` multiplies the load it sizes for (1: the published formula); the benchmark
    raises it to compare attainment at equal cost.
    """

    perf: PerfModel
    ttft_sla: float
    itl_sla: float
    budget: int
    interval_s: float = 60.0
    max_step: int = 8
    headroom: float = 1.0
    last_at: float = -math.inf
    target: tuple[int, int] | None = None

    def __call__(
        self, now: float, p: RoleReplicas, d: RoleReplicas, m: MetricsWindow
    ) -> tuple[int, int]:
        if self.target is None:
            self.target = (p.current, d.current)
        if now - self.last_at < self.interval_s or m.prefill is None or m.decode is None:
            return self.target
        self.last_at = now
        rps = m.prefill.request_rate
        if not rps > 0:  # NaN or idle: the planner skips the adjustment
            return self.target
        isl = m.prefill.prompt_tokens_rate / rps
        osl = m.decode.generation_tokens_rate / rps
        load = rps * self.headroom
        want_p = max(1, math.ceil(load / prefill_engine_rps(self.perf, isl, self.ttft_sla)))
        want_d = max(1, math.ceil(load / decode_engine_rps(self.perf, isl, osl, self.itl_sla)))
        cur_p, cur_d = self.target
        want_p = max(cur_p - self.max_step, min(cur_p + self.max_step, want_p))
        want_d = max(cur_d - self.max_step, min(cur_d + self.max_step, want_d))
        self.target = _proportional_budget(want_p, want_d, self.budget)
        return self.target
