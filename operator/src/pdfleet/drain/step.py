"""One pass's drain: read the loads, plan each shrinking pool, carry the plan out.

Where it fits: the controller calls `step()` in every pass with the service's memory
(reconcile/memory.py), before it plans the children: the replica counts it returns are what
the StatefulSets are applied with. The reading is drain/io.py, the decisions drain/plan.py,
the writes drain/executor.py; this module only sequences them and remembers what the
watch indexes show late (the marks it wrote, the drains it reported).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pdfleet import httpclient, labels
from pdfleet.api.types import parse_duration
from pdfleet.drain.executor import execute
from pdfleet.drain.io import RouterFleet, read_loads, router_replicas
from pdfleet.drain.plan import Stage, marks_written, needs_io, plan_drain, worker_url
from pdfleet.kube.writer import Writer
from pdfleet.reconcile.memory import Pass
from pdfleet.reconcile.observed import with_marks
from pdfleet.render.common import child_name
from pdfleet.rollout.plan import PoolLayout

log = logging.getLogger(__name__)

# How long a reported drain is remembered (its Event and metric are recorded once).
REPORTED_KEEP_S = 3600.0

# While a pool drains, the next pass comes this soon: in-flight gauges change no Kubernetes
# object, so no watch event would wake the controller when a worker goes idle.
DRAIN_POLL_S = 0.5


@dataclass(frozen=True)
class DrainOutcome:
    replicas: dict[str, int]
    """The replica count to apply to each pool."""
    retired: frozenset[str] = frozenset()
    """Pools whose retiring pods (a paired rollout's old revision) have all drained."""
    requeue_after_s: float | None = None


def step(this: Pass, layouts: Mapping[str, PoolLayout], writer: Writer) -> DrainOutcome:
    """Replica counts to apply while pools drain, the pools whose old revision has drained,
    and when to come back. `layouts` says what each pool should hold (pdfleet.rollout.plan).

    Router and worker HTTP happen only while a pool is shrinking, retiring pods or has marked
    pods: an idle service costs no I/O and no API write here."""
    body, isvc, now, memory = this.body, this.isvc, this.now, this.memory
    namespace = str(body["metadata"]["namespace"])
    observed = with_marks(this.observed, memory.recent_marks())
    desired = {role: layout.replicas for role, layout in layouts.items()}
    applied = dict(desired)
    retired: set[str] = set()
    active = {}
    for role in labels.WORKER_ROLES:
        ref = observed.child("StatefulSet", child_name(isvc, role))
        current = ref.replicas if ref is not None else None
        if needs_io(desired[role], current, observed.pods_of(role), layouts[role].retire):
            active[role] = current
    if not active:
        return DrainOutcome(applied)
    router = isvc.spec.router
    ips = [
        p.pod_ip
        for p in observed.pods_of(labels.ROLE_ROUTER)
        if p.pod_ip and p.phase == "Running" and not p.terminating
    ]
    if router.type != "vllm-router":
        ips = []  # an external gateway: only the workers' own gauges can be read
    fleet = RouterFleet(
        router_replicas(ips, router.port, router.metrics_port), client=httpclient.shared()
    )
    port = isvc.spec.engine.port
    timeout_s = parse_duration(isvc.spec.drain.timeout)
    requeue: float | None = None
    # Keyed by (pod, drain start), which never repeats; kept for a while rather than
    # pruned to the pods seen this pass, so an index that briefly misses a pod cannot
    # make its drain be reported twice.
    reported = {
        k: at for k, at in memory.reported.items() if time.monotonic() - at < REPORTED_KEEP_S
    }
    try:
        # One reading for both pools: the routers are asked once per pass, and the
        # workers all at once (drain/io.read_loads), so a pass stays short under load.
        marked = {
            p.name: (url, role)
            for role in active
            for p in observed.pods_of(role)
            if p.draining_since and not p.terminating and (url := worker_url(p, port))
        }
        loads = read_loads(fleet, marked)
        for role, current in active.items():
            pods = observed.pods_of(role)
            layout = layouts[role]
            drain = plan_drain(
                role, desired[role], current, pods, loads, now, timeout_s, port,
                finished=reported.keys(), start=layout.start, retire=layout.retire,
            )  # fmt: skip
            outcome = execute(drain, role, namespace, body, writer, fleet)
            memory.remember_marks(marks_written(drain.actions))
            reported.update(((a.pod, a.since or ""), time.monotonic()) for a in outcome.finished)
            applied[role] = drain.replicas
            if drain.retired:
                retired.add(role)
            if drain.actions or drain.active:
                requeue = DRAIN_POLL_S
                waiting = {
                    pod: loads[pod].holding(role)
                    for pod, stage in drain.stages.items()
                    if stage is Stage.DEREGISTERED and pod in loads
                }
                log.info(
                    "%s/%s %s drain: replicas %s -> %s, stages %s, deregistered %s, "
                    "failed %s, waiting on %s",
                    isvc.metadata.namespace,
                    isvc.metadata.name,
                    role,
                    current,
                    drain.replicas,
                    {k: v.value for k, v in drain.stages.items()},
                    list(outcome.deregistered),
                    list(outcome.failed),
                    waiting,
                )
    finally:
        fleet.close()
        memory.reported = reported
    return DrainOutcome(applied, frozenset(retired), requeue)
