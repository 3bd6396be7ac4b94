"""Hindsight baselines: every fixed P:D split, and the clairvoyant per-window bound.

Where it fits: `pdfleet_lab.bench` calls `fixed_splits` and `clairvoyant` next to the
online controllers of `baselines.py`; all use `pdfleet_lab.sim`.

Attainment is (close to) monotone in both pool sizes, so instead of simulating all splits of
the budget we walk, for each prefill count, the decode counts upwards until attainment stops
improving, and stop adding prefill once a split is (nearly) perfect. Splits not simulated are
dominated by one that was: fewer GPUs in both pools can only do worse.

Clairvoyant bound: cut the trace into windows (5 min), simulate each window alone on each
candidate split with zero start-up delay, then choose one split per window so that the whole
trace reaches the attainment target at the least GPU time (a multiple-choice knapsack, solved
exactly by dynamic programming over the total cost). No online policy that changes the split
at most once per window can do better; one that changes it more often could, in principle,
beat it inside a window (the bound is for 5-minute granularity).

The same plan with start-up paid: knowing the load in advance, a replica is started one
start-up before its window, so every GPU a window adds over the one before is held that much
longer (the windows are simulated as before: the replicas are ready when their window
starts; the overlap is not checked against the GPU budget, which keeps it optimistic). Its
distance from the bound is what the start-up delay costs even with perfect knowledge; the
rest of an online policy's distance is headroom and reaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise

from pdfleet_lab.sim import SimConfig, fixed, simulate
from pdfleet_lab.traces import Workload


@dataclass(frozen=True)
class SplitResult:
    prefill: int
    decode: int
    attainment: float
    gpu_hours: float
    requests: int


Runner = Callable[[Workload, int, int], SplitResult]


def runner(cfg: SimConfig, ttft_slo: float, itl_slo: float) -> Runner:
    # A fixed split reads no window: nothing needs scraping.
    unscraped = replace(cfg, signals="direct")

    def run(wl: Workload, p: int, d: int) -> SplitResult:
        res = simulate(wl, unscraped, fixed(p, d), (p, d))
        return SplitResult(p, d, res.attainment(ttft_slo, itl_slo), res.gpu_hours, len(wl))

    return run


def staircase(
    wl: Workload, run: Runner, budget: int, perfect: float = 0.999, flat: float = 0.002
) -> list[SplitResult]:
    """Simulate the splits that can matter (see the module docstring), cheapest first."""
    out: list[SplitResult] = []
    for p in range(1, budget):
        best = None
        for d in range(1, budget - p + 1):
            r = run(wl, p, d)
            out.append(r)
            if best is not None and r.attainment <= best.attainment + flat:
                break
            best = r if best is None or r.attainment > best.attainment else best
            if r.attainment >= perfect:
                break
        if best is not None and best.attainment >= perfect:
            break
    return sorted(out, key=lambda r: (r.prefill + r.decode, -r.attainment))


def fixed_splits(wl: Workload, run: Runner, budget: int) -> list[SplitResult]:
    return staircase(wl, run, budget)


def cheapest_reaching(results: list[SplitResult], target: float) -> SplitResult | None:
    ok = [r for r in results if r.attainment >= target]
    return min(ok, key=lambda r: (r.gpu_hours, -r.attainment)) if ok else None


@dataclass(frozen=True)
class Clairvoyant:
    gpu_hours: float
    attainment: float
    plan: tuple[tuple[float, int, int, float], ...]  # (window start, P, D, window attainment)


def hull(options: list[SplitResult]) -> list[SplitResult]:
    """Options by cost where each step up buys attainment (lower-left Pareto front)."""
    front: list[SplitResult] = []
    for r in sorted(options, key=lambda r: (r.prefill + r.decode, -r.attainment)):
        if not front or r.attainment > front[-1].attainment:
            front.append(r)
    return front


def _gpus(r: SplitResult, cfg: SimConfig) -> int:
    return r.prefill * cfg.prefill_gpus + r.decode * cfg.decode_gpus


def _good(r: SplitResult) -> float:
    return r.attainment * r.requests


def cheapest_plan(
    options: list[list[tuple[float, float]]],
    need: float,
    gpus: list[list[int]] | None = None,
    startup_s: float = 0.0,
) -> list[int]:
    """One option per window, (cost, good requests) each, with total good >= `need` at the
    least total cost: an exact dynamic program over the reachable total costs (a handful of
    GPU counts per window, so few distinct sums). Where no plan reaches `need`, the plan
    with the most good requests. A greedy walk along each window's front can overshoot the
    target, and then the bound would not be a lower bound.

    With `gpus` (per option) and `startup_s`, every GPU an option adds over the previous
    window's choice costs `startup_s` more (started that much earlier); the first window
    starts from its own choice (the bound stays optimistic).
    """
    paid = gpus is not None and startup_s > 0

    def switch(w: int, last: int, j: int) -> float:
        if not paid or last < 0:
            return 0.0
        assert gpus is not None
        return startup_s * max(0, gpus[w][j] - gpus[w - 1][last])

    # state: (total cost, last choice where it matters) -> (most good requests, choices)
    states: dict[tuple[float, int], tuple[float, tuple[int, ...]]] = {(0.0, -1): (0.0, ())}
    for w, opts in enumerate(options):
        nxt: dict[tuple[float, int], tuple[float, tuple[int, ...]]] = {}
        for (cost, last), (good, picks) in states.items():
            for j, (c, g) in enumerate(opts):
                key = (round(cost + c + switch(w, last, j), 6), j if paid else -1)
                cand = (good + g, (*picks, j))
                if key not in nxt or cand[0] > nxt[key][0]:
                    nxt[key] = cand
        # drop states dominated by a cheaper one (ending in the same choice, where that
        # matters) with at least as many good requests
        states = {}
        best: dict[int, float] = {}
        for key in sorted(nxt):
            if nxt[key][0] > best.get(key[1], -1.0):
                states[key] = nxt[key]
                best[key[1]] = nxt[key][0]
    feasible = [k for k, (g, _) in states.items() if g >= need - 1e-9]
    if feasible:
        return list(states[min(feasible)][1])
    return list(max(states.values())[1])


Fronts = list[tuple[float, Workload, list[SplitResult]]]


def window_fronts(
    wl: Workload,
    cfg: SimConfig,
    ttft_slo: float,
    itl_slo: float,
    budget: int,
    window_s: float = 300.0,
) -> Fronts:
    """(start, requests, cost/attainment front) of each non-empty window, simulated alone
    with zero start-up: the expensive part of the bound, shared by its variants."""
    run = runner(replace(cfg, startup_s=0.0), ttft_slo, itl_slo)
    fronts: Fronts = []
    t = 0.0
    while t <= wl.duration_s:
        part = wl.window(t, t + window_s)
        if len(part):
            fronts.append((t, part, hull(staircase(part, run, budget))))
        t += window_s
    return fronts


def _cheapest_reaching(front: list[SplitResult], target: float) -> int:
    """Index of the cheapest option of a front (ordered by cost, rising attainment) that
    reaches `target`; its last, the best, where none does."""
    return next((i for i, r in enumerate(front) if r.attainment >= target), len(front) - 1)


def first_window_at(fronts: Fronts, initial: SplitResult) -> Fronts:
    """`fronts` with the first window's options cut to the initial split, `initial` being
    that window replayed on it.

    The plan over these is the bound for a fleet that starts where the policy starts: a
    replica asked for in the first window is ready a start-up later, and a policy learns of
    the load only from a window of metrics, so most of the first window runs on the initial
    split whatever it decides. Its distance from the bound is what no policy starting there
    can win back; that what is left of a workload's misses is reachable from the initial
    split at all is what it shows."""
    (start, part, _), *rest = fronts
    return [(start, part, [initial]), *rest]


def clairvoyant(
    wl: Workload,
    cfg: SimConfig,
    ttft_slo: float,
    itl_slo: float,
    budget: int,
    target: float,
    window_s: float = 300.0,
    startup_s: float = 0.0,
    fronts: Fronts | None = None,
    every_window: bool = False,
) -> Clairvoyant:
    """The bound (`startup_s` 0) or the same plan with start-up paid (module docstring).

    With `every_window`, each window must reach `target` itself (the cheapest split that
    does, or its best where none does): the bound for a policy that holds its SLO in every
    window, as an operator's autoscaler does. The plain bound may trade one window's misses
    for another's, e.g. run a split that misses a tenth of its requests for half an hour and
    make up for it later, which no policy that follows its latency target would choose."""
    if fronts is None:
        fronts = window_fronts(wl, cfg, ttft_slo, itl_slo, budget, window_s)
    total = sum(len(part) for _, part, _ in fronts)
    span = [min(window_s, max(wl.duration_s - start, 0.0)) for start, _, _ in fronts]
    gpus = [[_gpus(r, cfg) for r in front] for _, _, front in fronts]
    if every_window:
        choice = [_cheapest_reaching(front, target) for _, _, front in fronts]
    else:
        choice = cheapest_plan(
            [
                [(s * g, _good(r)) for g, r in zip(gs, front, strict=True)]
                for s, gs, (_, _, front) in zip(span, gpus, fronts, strict=True)
            ],
            target * total,
            gpus,
            startup_s,
        )
    picked = [gs[c] for gs, c in zip(gpus, choice, strict=True)]
    gpu_s = sum(s * g for s, g in zip(span, picked, strict=True))
    gpu_s += startup_s * sum(max(0, b - a) for a, b in pairwise(picked))
    good = sum(_good(front[c]) for (_, _, front), c in zip(fronts, choice, strict=True))
    plan = tuple(
        (start, front[c].prefill, front[c].decode, front[c].attainment)
        for (start, _, front), c in zip(fronts, choice, strict=True)
    )
    return Clairvoyant(gpu_hours=gpu_s / 3600.0, attainment=good / total, plan=plan)
