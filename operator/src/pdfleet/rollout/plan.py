"""The paired rollout of one service: pure, one call per reconcile pass.

Where it fits: the controller calls `plan_rollout()` with the spec's KV revision
(rollout/revision.py), what each pool's StatefulSet and the router show, and the sizes the
autoscaler (or the spec) wants. The layouts it returns are what the drain (drain/plan.py,
which also retires the old revision's pods) and render (the StatefulSets' replicas,
`ordinals.start` and `partition`, the router's revision) work from. Nothing here does I/O.

One StatefulSet per role holds both revisions (docs/design/paired-rollouts.md): pods below
the partition keep the revision they run, pods above it are the new one, and raising
`ordinals.start` past the old pods removes exactly those. The router's pods select workers of
one revision, so every request pairs a prefill and a decode of the same revision:

    Stable --KV revision changes--> Surging --new pools Ready, preflight passed--> MovingTraffic
       ^      ^                       |                                               |
       |      +--spec reverted: Reverting (the new pods go)           router rolled: Retiring
       +---------------------------- old pods drained, ordinals.start raised <--------+

Every state is read back from the objects (the StatefulSets' template label and partition,
the router's template label), never from memory, so a restarted operator carries on.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pdfleet import labels

ROUTER_ROLLING = "the router to run the new revision on every replica"
#: The router revision that selects workers by role alone (pods made before revisions).
UNPINNED = ""


class Phase(StrEnum):
    STABLE = "Stable"
    SURGING = "Surging"
    """The new revision's pools start beside the old, which serves."""
    MOVING_TRAFFIC = "MovingTraffic"
    """The router rolls to the new revision (each router pod pairs within one revision)."""
    RETIRING = "Retiring"
    """No router lists the old revision any more: its pods drain, then go."""
    REVERTING = "Reverting"
    """The spec went back to the serving revision before traffic moved: the new pods go."""


@dataclass(frozen=True)
class PoolState:
    """What one pool's StatefulSet shows."""

    replicas: int
    start: int = 0
    partition: int = 0
    revision: str | None = None
    """The KV revision of its pod template; None before revisions were labelled."""


@dataclass(frozen=True)
class PoolLayout:
    """What one pool's StatefulSet is applied with this pass."""

    replicas: int
    start: int = 0
    partition: int = 0
    retire: int = 0
    """Drain the pods at positions [0, retire) now: the old revision, which no router lists."""
    hold: bool = False
    """Leave the StatefulSet as it is: a newer revision waits until the old one has gone."""
    then: PoolLayout | None = None
    """What the pool becomes once its retiring pods have drained (`after_retire`)."""


@dataclass(frozen=True)
class RolloutPlan:
    phase: Phase
    target: str
    """The spec's KV revision."""
    router: str
    """The revision the router pairs after this pass (UNPINNED: any)."""
    pools: dict[str, PoolLayout] = field(default_factory=dict)
    old: dict[str, int] = field(default_factory=dict)
    """Pods of the revision being replaced, by role (none when stable)."""
    waiting: str = ""
    """What the rollout waits for (empty when stable)."""

    @property
    def rolling(self) -> bool:
        return self.phase is not Phase.STABLE

    def retired(self, roles: Set[str]) -> RolloutPlan:
        """This plan with the pools in `roles`, whose retiring pods the drain reports gone,
        moved on to what they become (`PoolLayout.then`), in the same pass."""
        pools = {
            role: layout.then if role in roles and layout.then is not None else layout
            for role, layout in self.pools.items()
        }
        return replace(self, pools=pools)


def surge_sizes(
    old: Mapping[str, int],
    desired: Mapping[str, int],
    gpus_per_replica: Mapping[str, int],
    budget: int | None,
) -> dict[str, int]:
    """The new revision's pools beside `old`: the desired sizes, or, where they do not fit the
    GPU budget beside the old revision, the largest sizes of the same prefill:decode ratio that
    do, but never less than one of each (a rollout needs one proven pair; the status says that
    it then runs over the budget). The new pools grow to the desired sizes once the old have
    gone."""
    wanted = {role: max(1, desired[role]) for role in labels.WORKER_ROLES}
    if budget is None:
        return wanted

    def cost(sizes: Mapping[str, int]) -> int:
        return sum((old[r] + sizes[r]) * gpus_per_replica[r] for r in labels.WORKER_ROLES)

    if cost(wanted) <= budget:
        return wanted
    best = dict.fromkeys(labels.WORKER_ROLES, 1)
    for scale in range(1, 1001):
        sizes = {r: max(1, wanted[r] * scale // 1000) for r in labels.WORKER_ROLES}
        if cost(sizes) <= budget:
            best = sizes
    return best


def _stable(state: PoolState | None, desired: int) -> PoolLayout:
    return PoolLayout(replicas=desired, start=state.start if state else 0)


def _surge(state: PoolState, old: int, new: int) -> PoolLayout:
    return PoolLayout(replicas=old + new, start=state.start, partition=old)


def after_retire(state: PoolState, target: str, new: int) -> PoolLayout:
    """The pool once its old pods (positions below the partition) have drained: the start
    moves past them; a newer revision that waited (`target` differs from the template's)
    surges beside what remains, in the same write."""
    start, remaining = state.start + state.partition, state.replicas - state.partition
    if state.revision == target:
        return PoolLayout(replicas=remaining, start=start)
    return PoolLayout(replicas=remaining + new, start=start, partition=remaining)


def plan_rollout(
    target: str,
    pools: Mapping[str, PoolState | None],
    router: str | None,
    router_rolled: bool,
    desired: Mapping[str, int],
    new_ready: Mapping[str, int],
    pair_proven: bool,
    gpus_per_replica: Mapping[str, int],
    budget: int | None = None,
    pinned: bool = True,
    unlabelled: int = 0,
) -> RolloutPlan:
    """The rollout's next step.

    `router` is the revision the router pairs now (its template label; None before it
    exists or before revisions were labelled), `router_rolled` whether every router pod runs
    its latest template, `new_ready` the Ready pods of the `target` revision per role,
    `pair_proven` whether the KV preflight passed between two of them (True when the
    preflight is off). `pinned` is False for an external router, which pdfleet cannot pin:
    such a service rolls in place. `unlabelled` counts the live worker pods made before
    revisions were labelled: while any is left the router selects by role alone (UNPINNED),
    or it would select none of them while they roll in place to gain the label."""
    states = {role: pools.get(role) for role in labels.WORKER_ROLES}
    revisions = {s.revision for s in states.values() if s is not None}
    if (
        not pinned
        or any(s is None or s.revision is None for s in states.values())
        or router is None
    ):
        # A new service, one made before revisions, or an external router: in place.
        layouts = {role: _stable(states[role], desired[role]) for role in states}
        return RolloutPlan(Phase.STABLE, target, UNPINNED if unlabelled else target, layouts)
    known = {role: s for role, s in states.items() if s is not None}
    template = next(iter(revisions)) if len(revisions) == 1 else None
    if not any(s.partition for s in known.values()):
        if template == router == target:
            layouts = {role: _stable(s, desired[role]) for role, s in known.items()}
            return RolloutPlan(Phase.STABLE, target, target, layouts)
        if template == target and router != target:
            # The router lags the pools (only another writer's edit does this): repoint it.
            layouts = {role: _stable(s, desired[role]) for role, s in known.items()}
            return RolloutPlan(
                Phase.MOVING_TRAFFIC, target, target, layouts, waiting=ROUTER_ROLLING
            )
        # A new revision: surge beside what the router pairs.
        current = {role: s.replicas for role, s in known.items()}
        new = surge_sizes(current, desired, gpus_per_replica, budget)
        layouts = {role: _surge(s, current[role], new[role]) for role, s in known.items()}
        return RolloutPlan(
            Phase.SURGING,
            target,
            router,
            layouts,
            current,
            waiting=_new_pools_message(target, new, {}),
        )
    old = {role: _old(s, target) for role, s in known.items()}
    if template is not None and template == router:
        # The router has moved to what the templates run: retire the pods below the partition
        # once no router pod pairs them any more. A newer revision waits (the StatefulSets
        # are held) and surges when the old pods have gone (after_retire).
        hold = template != target
        if not router_rolled:
            layouts = {
                role: PoolLayout(s.replicas, s.start, s.partition, hold=hold)
                for role, s in known.items()
            }
            return RolloutPlan(
                Phase.MOVING_TRAFFIC, target, router, layouts, old, waiting=ROUTER_ROLLING
            )
        remaining = {role: s.replicas - s.partition for role, s in known.items()}
        new = surge_sizes(remaining, desired, gpus_per_replica, budget)
        layouts = {
            role: PoolLayout(
                s.replicas,
                s.start,
                s.partition,
                retire=s.partition,
                hold=hold,
                then=after_retire(s, target, new[role]),
            )
            for role, s in known.items()
        }
        return RolloutPlan(
            Phase.RETIRING,
            target,
            router,
            layouts,
            old,
            waiting="the previous revision's pods to drain",
        )
    if target == router:
        # Reverted before traffic moved. The template goes back to the serving revision with no
        # partition, which the pods below it run already: the new pods, above it, are removed
        # by the drain as a scale-down (no router lists them). Written with the partition
        # kept, the next pass could not tell these pools from a retiring rollout's.
        layouts = {role: _stable(s, desired[role]) for role, s in known.items()}
        return RolloutPlan(
            Phase.REVERTING, target, router, layouts, old, waiting="the new revision's pods to go"
        )
    # Surging (the templates already run `target`, or a newer revision replaces a surge that
    # never served: its pods roll in place, as no router lists them).
    new = surge_sizes(old, desired, gpus_per_replica, budget)
    layouts = {role: _surge(s, old[role], new[role]) for role, s in known.items()}
    ready_all = template == target and all(new_ready.get(role, 0) >= new[role] for role in known)
    if ready_all and pair_proven:
        return RolloutPlan(
            Phase.MOVING_TRAFFIC, target, target, layouts, old, waiting=ROUTER_ROLLING
        )
    waiting = _new_pools_message(target, new, new_ready)
    if ready_all:
        waiting = f"the KV transport preflight between two pods of revision {target}"
    return RolloutPlan(Phase.SURGING, target, router, layouts, old, waiting=waiting)


def _old(state: PoolState, target: str) -> int:
    """The pods of the previous revision in a pool during a surge: those below the partition;
    all of them in a pool whose surge has not been written yet (its partition still 0)."""
    if state.partition:
        return state.partition
    return state.replicas if state.revision != target else 0


def _new_pools_message(target: str, new: Mapping[str, int], ready: Mapping[str, int]) -> str:
    pools = ", ".join(f"{role} {ready.get(role, 0)}/{n} ready" for role, n in new.items())
    return f"revision {target}: {pools}"
