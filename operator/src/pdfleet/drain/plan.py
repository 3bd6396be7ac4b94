"""The scale-down state machine of one pool: pure, one call per reconcile pass and role.

Where it fits: the controller (pdfleet.controller) calls `plan_drain()` for prefill and for
decode with the pool's desired and current replica counts, its pods (reconcile/observed.py),
the in-flight readings the drain I/O took (drain/io.py) and the time; the executor
(drain/executor.py) carries out the actions it returns. Nothing here does I/O, so every rule is
a table test (tests/unit/drain/test_plan.py).

The states of a pod whose ordinal is being removed (StatefulSets remove the highest ordinals):

    serving --mark--> MARKED --deregister+confirm--> DEREGISTERED --idle--> DONE
                        |                                |   \\--timeout--> DONE (forced)
                        | scale-up: unmark (free)        | scale-up: recreate the pod
                        v                                v
                     serving                   serving again once recreated and Ready

MARKED is the pod annotation `pdfleet.dev/draining` (its value is the start time, so the
timeout survives an operator restart); DEREGISTERED is observed, not stored: no router replica
lists the worker any more. A pool's StatefulSet is lowered only past pods that are DONE, so a
pod leaves only when it holds no request; and a marked pod is deregistered only while every
pod that stays is Ready, so the pool never serves with less than it is scaled down to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from pdfleet import labels
from pdfleet.reconcile.observed import PodInfo


@dataclass(frozen=True)
class WorkerLoad:
    """What the drain I/O read about one worker; None is "could not be read"."""

    registered: bool | None
    """Listed by at least one router replica (None: some replica did not answer)."""
    router_in_flight: float | None
    """The routers' own gauges, summed over every replica: pending + active decode for a
    decode worker (covers requests still in prefill whose decode stage will come here),
    prefill occupancy for a prefill worker."""
    engine_in_flight: float | None
    """The engine's vllm:num_requests_running + vllm:num_requests_waiting."""
    kv_pending: float | None = 0.0
    """Prefill only: finished prefills whose KV blocks a decode has not pulled yet."""

    def _signals(self, role: str) -> dict[str, float | None]:
        signals = {
            "router in-flight": self.router_in_flight,
            "engine in-flight": self.engine_in_flight,
        }
        if role == labels.ROLE_PREFILL:
            signals["KV awaiting a pull"] = self.kv_pending
        return signals

    def idle(self, role: str) -> bool:
        return all(value is not None and value <= 0 for value in self._signals(role).values())

    def holding(self, role: str) -> str:
        """What keeps the worker from idle, e.g. "router in-flight 1, engine in-flight
        unknown" (empty when idle): the forced-drain Event and the drain log say it."""
        return ", ".join(
            f"{name} {'unknown' if value is None else f'{value:g}'}"
            for name, value in self._signals(role).items()
            if value is None or value > 0
        )


class Stage(StrEnum):
    SERVING = "Serving"
    MARKED = "Marked"
    DEREGISTERED = "Deregistered"
    DONE = "Done"


class ActionKind(StrEnum):
    MARK = "Mark"
    """Annotate the pod draining (value: `since`)."""
    UNMARK = "Unmark"
    """Remove the annotation: the pod was never deregistered, it serves on."""
    DEREGISTER = "Deregister"
    """DELETE the worker URL on every router replica, then confirm with GET /workers."""
    RECREATE = "Recreate"
    """Delete the pod so its StatefulSet recreates it and router discovery adds it again
    (vllm-router has no runtime add over HTTP in static P/D mode; docs/drain.md)."""
    FINISHED = "Finished"
    """The pod drained (or was forced): record the duration; the replica count now passes it."""


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    pod: str
    url: str | None = None
    since: str | None = None
    duration_s: float = 0.0
    forced: bool = False
    reason: str = ""


@dataclass(frozen=True)
class DrainPlan:
    """What one pass does for one pool."""

    replicas: int
    """The StatefulSet replica count to apply now."""
    actions: list[Action] = field(default_factory=list)
    stages: dict[str, Stage] = field(default_factory=dict)
    """Stage of every pod the drain is about (for logs and tests)."""
    retired: bool = False
    """Every pod retiring (`plan_drain`'s `retire`) is DONE: the StatefulSet's start may
    move past them."""

    @property
    def active(self) -> bool:
        return any(stage is not Stage.DONE for stage in self.stages.values())


def rfc3339(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def worker_url(pod: PodInfo, port: int) -> str | None:
    """The URL as the router's discovery registers it: http://<podIP>:<engine port>."""
    return f"http://{pod.pod_ip}:{port}" if pod.pod_ip else None


def needs_io(desired: int, current: int | None, pods: Sequence[PodInfo], retire: int = 0) -> bool:
    """Whether this pool needs router/worker readings this pass. An idle pool needs none."""
    if current is None:
        return False
    marked = any(p.draining_since and not p.terminating for p in pods)
    return desired < current or retire > 0 or marked


def _elapsed_s(pod: PodInfo, now: datetime) -> float:
    started = parse_time(pod.draining_since or "")
    return 0.0 if started is None else max(0.0, (now - started).total_seconds())


def _victim(
    pod: PodInfo,
    load: WorkerLoad | None,
    url: str | None,
    now: datetime,
    timeout_s: float,
    stayers_serving: bool = True,
) -> tuple[Stage, list[Action]]:
    """One pod being removed: the next step of mark -> deregister -> wait -> done. A marked
    pod is deregistered only once every pod that stays serves (`stayers_serving`): until then
    it keeps serving, or the pool would have less than what it is scaled down to (a pod that
    stays may be NotReady for a while, and router discovery drops NotReady pods)."""
    if pod.terminating or pod.pod_ip is None:
        # Already leaving through its preStop, or never got an address: nothing to drain.
        return Stage.DONE, []
    if not pod.draining_since:
        return Stage.MARKED, [Action(ActionKind.MARK, pod.name, url, since=rfc3339(now))]
    elapsed = _elapsed_s(pod, now)
    registered = load.registered if load is not None else None
    # Unknown counts as registered: a DELETE of an absent URL is harmless, a skipped one is not.
    deregister = [Action(ActionKind.DEREGISTER, pod.name, url)] if registered is not False else []
    if registered is False and load is not None and load.idle(pod.role):
        # Checked before the timeout: a worker that went idle by then drained, not forced.
        return Stage.DONE, [Action(ActionKind.FINISHED, pod.name, url, pod.draining_since, elapsed)]
    if elapsed >= timeout_s:
        if load is None:
            why = "timeout (no reading)"
        elif registered is not False:
            why = "timeout (still registered)"
        else:
            why = f"timeout ({load.holding(pod.role)})"
        done = Action(ActionKind.FINISHED, pod.name, url, pod.draining_since, elapsed, True, why)
        return Stage.DONE, [*deregister, done]
    if registered is not False:
        return Stage.MARKED, deregister if stayers_serving else []
    return Stage.DEREGISTERED, []


def serves(pod: PodInfo) -> bool:
    """Ready, and neither leaving nor draining: router discovery lists it."""
    return pod.ready and not pod.terminating and not pod.draining_since


def _returning(
    pod: PodInfo, load: WorkerLoad | None, url: str | None
) -> tuple[Stage, list[Action]]:
    """A draining pod that is needed again (scale-up during the drain)."""
    if pod.terminating:
        return Stage.DEREGISTERED, []  # being recreated; it comes back without the mark
    registered = load.registered if load is not None else None
    if registered is True:
        return Stage.SERVING, [Action(ActionKind.UNMARK, pod.name, url, reason="still registered")]
    # Deregistered, or unknown: only a fresh pod is added back by the router's discovery.
    return Stage.DEREGISTERED, [Action(ActionKind.RECREATE, pod.name, url, reason="deregistered")]


def plan_drain(
    role: str,
    desired: int,
    current: int | None,
    pods: Sequence[PodInfo],
    loads: Mapping[str, WorkerLoad],
    now: datetime,
    timeout_s: float,
    port: int,
    url_of: Callable[[PodInfo], str | None] | None = None,
    finished: Set[tuple[str, str]] = frozenset(),
    start: int = 0,
    retire: int = 0,
) -> DrainPlan:
    """The next step of draining pool `role` from `current` down to `desired` replicas.

    `current` is the StatefulSet's spec.replicas (None before it exists), `loads` the readings
    keyed by pod name (empty when no drain was active before this pass), `port` the engine port
    (`url_of` replaces the pod-IP URL where workers are not pods, as in the router tests).
    `finished` holds the drains already FINISHED, as (pod, drain start): such a pod stays DONE
    whatever a later reading says. A pod index that lags, or a router that fails one read (its
    worker counts as registered again), must never hold a drained pod, or the pool would grow
    back to it and drain it a second time.

    Positions count from the StatefulSet's first ordinal, `start`. `retire` drains the pods
    at the lowest `retire` positions as well: a paired rollout's old revision, which goes by
    raising the start once the plan says `retired` (pdfleet.rollout.plan).
    """
    url = url_of or (lambda p: worker_url(p, port))
    if current is None:
        return DrainPlan(replicas=desired)
    by_position = {p.ordinal - start: p for p in pods if p.role == role}
    actions: list[Action] = []
    stages: dict[str, Stage] = {}
    pending_top = -1  # highest position not yet DONE: the StatefulSet must keep it
    stayers = [by_position.get(position) for position in range(retire, min(desired, current))]
    serving = all(p is not None and serves(p) for p in stayers)
    retired = True
    for position in [*range(retire), *range(desired, current)]:
        pod = by_position.get(position)
        if pod is None:
            continue
        if (pod.name, pod.draining_since or "") in finished:
            stages[pod.name] = Stage.DONE
            continue
        stage, steps = _victim(pod, loads.get(pod.name), url(pod), now, timeout_s, serving)
        stages[pod.name] = stage
        actions += steps
        if stage is not Stage.DONE and position >= desired:
            pending_top = max(pending_top, position)
        retired = retired and (stage is Stage.DONE or position >= retire)
    returning = False
    for position in range(retire, min(desired, current)):
        pod = by_position.get(position)
        if pod is None or not pod.draining_since:
            continue
        stage, steps = _returning(pod, loads.get(pod.name), url(pod))
        stages[pod.name] = stage
        actions += steps
        returning = returning or stage is not Stage.SERVING
    replicas = max(desired, pending_top + 1)
    if returning and desired > current:
        # Reclaimed pods serve again before any new pod is added.
        replicas = current
    return DrainPlan(replicas, actions, stages, retired=retire > 0 and retired)


def marks_written(actions: Sequence[Action]) -> dict[str, str | None]:
    """The drain marks `actions` write: pod -> since, or None where a mark goes."""
    marks: dict[str, str | None] = {}
    for action in actions:
        if action.kind is ActionKind.MARK:
            marks[action.pod] = action.since
        elif action.kind in (ActionKind.UNMARK, ActionKind.RECREATE):
            marks[action.pod] = None
    return marks
