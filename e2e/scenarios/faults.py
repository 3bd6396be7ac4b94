"""The fault suite: each fault repeated against the real pieces, with the table it produces.

Where it fits: docs/reliability.md shows the table; tests/e2e/faults runs a short version of
each fault as pytest tests; this command runs the full repetitions (inside the private network
namespace) and writes the results::

    e2e/platform/netns.sh .venv/bin/python -m e2e.scenarios.faults --out docs/benchmarks/faults

Faults, on two local clusters (e2e/platform/cluster.py): control-plane faults on one where kwok runs
every pod (the operator alone matters there, and pods start at once); data-plane faults on one
where the process bridge runs the simulated workers and the real vllm-router.

* operator SIGKILL at random points while spec changes stream in, restarted each time;
* etcd and kube-apiserver SIGKILLed and started again, the operator left running;
* 409 Conflict and 429 Too Many Requests on a share of the operator's writes
  (e2e/platform/fault_proxy.py);
* the router process killed under streaming load; a decode worker killed mid-stream;
* under an enabled autoscaler, Prometheus stopped, then answering NaN series, then stale
  samples (e2e/platform/prometheus_proxy.py).

After every run the service must converge (e2e/platform/children.py: children equal the render of
the final spec, owned by it, no orphan or duplicate, observedGeneration current). "Lost" counts
client-visible failures: a request that got no complete response (HTTP error, broken or short
stream); the load generator retries nothing, so each one would have reached a user.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from e2e.platform.children import (
    convergence_problems,
    get_isvc,
    list_children,
    patch_isvc,
    pod_summary,
)
from e2e.platform.cluster import Cluster, wait_until
from e2e.platform.fault_proxy import FaultProxy, FaultRates, injected, proxied_kubeconfig, summary
from e2e.platform.loadgen import OK, LoadRun, Phase, Record
from e2e.platform.operator_process import OperatorProcess
from e2e.platform.prometheus import Prometheus, start_for_cluster
from e2e.platform.prometheus_proxy import PrometheusProxy
from e2e.platform.service import (
    Service,
    apply_crds,
    deployed_service,
    is_ready,
    local_cluster,
    pod_url,
    replicas_patch,
    router_workers,
)
from pdfleet import labels

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

Progress = Callable[[str], None]
#: 30 % of the operator's writes refused: half with 409, half with 429.
WRITE_FAULTS = FaultRates(conflict=0.15, throttle=0.15)


# ----- results and the table (pure) ------------------------------------------------------------


@dataclass
class Outcome:
    """One row of the table: a fault, how often it was injected, and what it cost."""

    fault: str
    runs: int = 0
    failures: int = 0
    requests: int | None = None
    """Client requests sent during the runs (None: no client traffic in this fault)."""
    lost: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """The first few reasons a run failed."""

    def fail(self, reason: str) -> None:
        self.failures += 1
        if len(self.problems) < 10:
            self.problems.append(reason)


def _cell(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def table(outcomes: Sequence[Outcome]) -> str:
    """The markdown table of docs/reliability.md."""
    lines = [
        "| fault | runs | failures | requests | requests lost |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {o.fault} | {o.runs} | {o.failures} | {_cell(o.requests)} | {_cell(o.lost)} |"
        for o in outcomes
    ]
    return "\n".join(lines)


def merged(old: Sequence[Outcome], new: Sequence[Outcome]) -> list[Outcome]:
    """Pure: `old` with each fault `new` ran replaced, new faults appended (a run of some
    faults with --only updates their rows and keeps the others)."""
    fresh = {o.fault: o for o in new}
    return [fresh.pop(o.fault, o) for o in old] + list(fresh.values())


def write_results(out: Path, outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Merge into `results.json` (every figure) and rewrite `table.md` in `out`; all rows."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    old = [Outcome(**row) for row in json.loads(path.read_text())] if path.exists() else []
    rows = merged(old, outcomes)
    path.write_text(json.dumps([asdict(o) for o in rows], indent=2) + "\n")
    (out / "table.md").write_text(table(rows) + "\n")
    return rows


# ----- spec changes (pure) ---------------------------------------------------------------------


def base_service(name: str, namespace: str) -> dict[str, Any]:
    """A minimal service whose forced drains end fast: the control-plane cluster's pods are
    run by kwok, so no router answers the drain's in-flight reads. No KV preflight either:
    nothing listens in kwok's pods, and a paired rollout (a change of engine args) would wait
    for a proof that never comes."""
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"image": "ghcr.io/pdfleet/worker:0.1.0-vllm0.33.0"},
            "prefill": {"replicas": {"min": 1, "max": 1}},
            "decode": {"replicas": {"min": 1, "max": 1}},
            "drain": {"timeout": "3s"},
            "kvTransfer": {"preflight": {"enabled": False}},
        },
    }


def random_change(rng: random.Random) -> dict[str, Any]:
    """A merge patch a user might make: engine args, a pool's size, the router's replicas
    (2+ routers add a PodDisruptionBudget, 1 removes it: children come and go)."""
    pick = rng.randrange(3)
    if pick == 0:
        return {"spec": {"engine": {"extraArgs": ["--max-num-seqs", str(rng.randint(8, 512))]}}}
    if pick == 1:
        n = rng.randint(1, 3)
        role = rng.choice(labels.WORKER_ROLES)
        return {"spec": {role: {"replicas": {"min": n, "max": n}}}}
    return {"spec": {"router": {"replicas": rng.randint(1, 2)}}}


# ----- the cluster side ------------------------------------------------------------------------


def problems_of(
    api: Any, namespace: str, names: Sequence[str], require_ready: bool = True
) -> list[str]:
    """Every service's convergence problems, prefixed with its name (empty: all converged)."""
    found = []
    for name in names:
        obj = get_isvc(api, namespace, name)
        children = list_children(api, namespace, name)
        problems = convergence_problems(obj, children, require_ready=require_ready)
        if problems:
            found += [f"{name}: {p}" for p in problems] + [
                f"{name} pods: {pod_summary(api, namespace, name)}"
            ]
    return found


def wait_converged(
    api: Any,
    namespace: str,
    names: Sequence[str],
    timeout_s: float,
    require_ready: bool = True,
    alive: Callable[[], bool] = lambda: True,
) -> list[str]:
    """Poll until every service converged; the problems left at the deadline (empty: ok).
    Gives up early once `alive()` is false (e.g. the operator exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = problems_of(api, namespace, names, require_ready)
        except (client.ApiException, OSError) as error:  # the API server may still be waking
            left = [f"read failed: {error}"]
        if not left or time.monotonic() > deadline or not alive():
            return left
        time.sleep(1.0)


def reconciles(operator: OperatorProcess) -> int:
    """Passes this operator process has run so far (0 when its metrics do not answer)."""
    return int(operator.metrics().get("pdfleet_reconcile_duration_seconds_count", 0))


@contextlib.contextmanager
def services(
    cluster: Cluster, api: Any, count: int, prefix: str = "faults"
) -> Iterator[tuple[str, list[str]]]:
    """A fresh namespace with `count` services; the namespace is deleted afterwards."""
    namespace = cluster.create_namespace(f"{prefix}-{os.urandom(4).hex()}")
    names = [f"svc-{i}" for i in range(count)]
    try:
        cluster.apply([base_service(name, namespace) for name in names])
        yield namespace, names
    finally:
        with contextlib.suppress(Exception):
            client.CoreV1Api(api).delete_namespace(namespace)


def operator_for(
    kubeconfig: Path, workdir: Path, namespace: str, leader_election: bool = True
) -> OperatorProcess:
    """An operator for one namespace (other tests' services on the cluster are not its
    business), logging to `workdir/operator.log` (appended across restarts)."""
    return OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=workdir / "operator.log",
        resync_seconds=2.0,
        leader_election=leader_election,
        extra_args=("--namespace", namespace),
    )


def start_converged(
    operator: OperatorProcess, api: Any, namespace: str, names: Sequence[str]
) -> int:
    """Start `operator`, wait until the services converged; its pid (the runs then check
    that the same process is still the one running)."""
    operator.start().wait_healthy(timeout=180)  # a Python start on a loaded machine
    problems = wait_converged(api, namespace, names, 180)
    if problems or operator.process is None:
        raise RuntimeError(f"the services never converged before the first fault: {problems}")
    return operator.process.pid


def same_process(operator: OperatorProcess, pid: int) -> bool:
    """The operator still runs as process `pid`: it neither exited nor was restarted."""
    return operator.running() and operator.process is not None and operator.process.pid == pid


# ----- control-plane faults --------------------------------------------------------------------


def operator_sigkill(
    cluster: Cluster,
    api: Any,
    workdir: Path,
    reconciles_target: int = 200,
    service_count: int = 3,
    seed: int = 1,
    progress: Progress = print,
) -> Outcome:
    """SIGKILL the operator at random points while spec changes arrive, until the killed
    processes have run `reconciles_target` passes between them; restart it each time; after
    every restart every service must converge with no orphan or duplicate.

    Leader election is off so that a restart takes over at once (the lease hand-over after a
    SIGKILL is tests/integration/cluster/test_operator_ha.py's subject)."""
    rng = random.Random(seed)
    outcome = Outcome("operator SIGKILL at random points")
    total = 0
    with services(cluster, api, service_count) as (namespace, names):
        operator = operator_for(
            cluster.kubeconfig, workdir, namespace, leader_election=False
        ).start()
        try:
            problems = wait_converged(api, namespace, names, 180)
            if problems:
                raise RuntimeError(f"the services never converged: {problems}")
            while total < reconciles_target:
                for name in rng.sample(names, rng.randint(1, len(names))):
                    patch_isvc(api, namespace, name, random_change(rng))
                # A random point: anywhere in the passes these changes start, or, now and
                # then, in the start-up listing (resume) of the process just restarted.
                deadline = time.monotonic() + rng.uniform(0.0, 2.5)
                seen = 0
                while time.monotonic() < deadline:
                    seen = max(seen, reconciles(operator))
                    time.sleep(0.1)
                operator.kill()
                total += seen
                outcome.runs += 1
                operator = operator_for(cluster.kubeconfig, workdir, namespace, False).start()
                if rng.random() < 0.25:
                    time.sleep(rng.uniform(1.0, 4.0))
                    operator.kill()
                    outcome.runs += 1
                    operator = operator_for(cluster.kubeconfig, workdir, namespace, False).start()
                problems = wait_converged(api, namespace, names, 120)
                total += reconciles(operator)
                if problems:
                    outcome.fail(f"kill {outcome.runs}: {problems[:5]}")
                progress(f"  SIGKILL {outcome.runs}: {total} reconciles so far, ok={not problems}")
            outcome.figures = {"reconciles": total, "services": service_count}
        finally:
            operator.stop()
    return outcome


def lease_renew_time(api: Any, name: str) -> float:
    """When the lease `name` (kube-system) was last renewed, in Unix seconds (0: never)."""
    coordination: Any = client.CoordinationV1Api(api)
    renewed = coordination.read_namespaced_lease(name, "kube-system").spec.renew_time
    return 0.0 if renewed is None else float(renewed.timestamp())


def lease_renewed_after(api: Any, name: str, moment: float) -> bool:
    return lease_renew_time(api, name) > moment


#: The operator's renew deadline (lease 15 s less one 5 s renew period, kube/lease.py): a
#: leader that renewed nothing for this long steps down (exits) by design.
RENEW_DEADLINE_S = 10.0
#: The harness sees the API server back up to ~1 s late (0.5 s polls of a kubectl call).
BACK_PRECISION_S = 1.0


def apiserver_restart(
    cluster: Cluster, api: Any, workdir: Path, runs: int = 5, seed: int = 2,
    progress: Progress = print,
) -> Outcome:  # fmt: skip
    """etcd and kube-apiserver SIGKILLed and started again (their data survives) while the
    operator (leader election on) runs. The cluster's supervisor starts again whatever else
    exits meanwhile (Cluster.crash_and_restart). The operator must re-establish its watches
    (a spec change made after the restart is reconciled, the service Ready again) and keep
    renewing its lease, without a restart of its own, unless the API server stayed away past
    the renew deadline counted from the lease's last renewal: then it steps down by design,
    is started again as a Deployment would, and the service must converge all the same."""
    rng = random.Random(seed)
    outcome = Outcome("etcd + kube-apiserver SIGKILLed and restarted")
    outages: list[float] = []
    step_downs = 0
    with services(cluster, api, 1, "apiserver") as (namespace, names):
        operator = operator_for(cluster.kubeconfig, workdir, namespace)
        try:
            pid = start_converged(operator, api, namespace, names)
            for run in range(runs):
                outcome.runs += 1
                down_s = rng.uniform(0.0, 6.0)
                renewed = lease_renew_time(api, operator.lease_name)
                cluster.crash_and_restart(("etcd", "kube-apiserver"), down_s)
                wait_until(cluster.is_running, 120, "the API server back", interval_s=0.5)
                back = time.time()
                outages.append(round(back - renewed, 1))
                patch_isvc(api, namespace, names[0], random_change(rng))
                problems = wait_converged(api, namespace, names, 120, alive=operator.running)
                if not same_process(operator, pid):
                    step_downs += 1
                    operator.stop()
                    operator.start().wait_healthy(timeout=180)
                    assert operator.process is not None
                    pid = operator.process.pid
                    problems = wait_converged(api, namespace, names, 120)
                    if back - renewed < RENEW_DEADLINE_S - BACK_PRECISION_S:
                        problems.append(
                            f"the operator exited though the API server was back "
                            f"{back - renewed:.1f}s after its last renewal"
                        )
                try:
                    wait_until(
                        partial(lease_renewed_after, api, operator.lease_name, back),
                        60, "the lease renewed after the restart",
                    )  # fmt: skip
                except TimeoutError as error:
                    problems.append(str(error))
                if problems:
                    outcome.fail(f"restart {run + 1} (down {down_s:.1f}s): {problems[:5]}")
                progress(
                    f"  restart {run + 1} (down {down_s:.1f}s, {back - renewed:.1f}s since the "
                    f"last renewal): ok={not problems}, step-downs {step_downs}, "
                    f"components started again {cluster.component_restarts()}"
                )
        finally:
            operator.stop()
    outcome.figures = {
        "since_renewal_when_back_s": outages,
        "operator_step_downs": step_downs,
        "components_started_again": cluster.component_restarts(),
    }
    return outcome


def conflicts_and_throttling(
    cluster: Cluster,
    api: Any,
    workdir: Path,
    runs: int = 10,
    rates: FaultRates = WRITE_FAULTS,
    seed: int = 3,
    service_count: int = 3,
    progress: Progress = print,
) -> Outcome:
    """The operator's API traffic goes through a proxy that refuses a share of its writes with
    409 or 429. Every round of spec changes must converge, the operator must not restart, and
    once converged it must make no write but its lease renewals (no hot loop)."""
    rng = random.Random(seed)
    outcome = Outcome("409 Conflict / 429 Too Many Requests on writes")
    proxy = FaultProxy(cluster.kubeconfig, rates, seed=seed)
    with services(cluster, api, service_count, "throttle") as (namespace, names):
        with proxy.running():
            kubeconfig = proxied_kubeconfig(proxy.url, workdir / "proxy.kubeconfig")
            operator = operator_for(kubeconfig, workdir, namespace)
            try:
                pid = start_converged(operator, api, namespace, names)
                for run in range(runs):
                    outcome.runs += 1
                    for name in names:
                        patch_isvc(api, namespace, name, random_change(rng))
                    problems = wait_converged(api, namespace, names, 120)
                    # Idle: only lease renewals (a PUT every 5 s) may write now.
                    before = proxy.snapshot()
                    time.sleep(6.0)
                    idle = proxy.snapshot() - before
                    extra = {k: n for k, n in idle.items() if k.split()[0] in ("POST", "PATCH")}
                    if extra:
                        problems.append(f"writes while idle: {extra}")
                    if not same_process(operator, pid):
                        problems.append("the operator exited")
                    if problems:
                        outcome.fail(f"round {run + 1}: {problems[:5]}")
                    progress(f"  round {run + 1}: ok={not problems} {summary(proxy.snapshot())}")
            finally:
                operator.stop()
        counts = proxy.snapshot()
    outcome.figures = {
        "injected": injected(counts),
        "writes": proxy.writes(),
        "requests": dict(sorted(counts.items())),
    }
    return outcome


# ----- data-plane faults ------------------------------------------------------------------------

#: Offered load while a data-plane fault happens: Poisson arrivals, each a streamed completion
#: of about two seconds on the simulator (real time), so several streams are always in flight.
LOAD = Phase("steady", duration_s=45.0, rate=4.0, prompt_tokens=256, output_tokens=256)
#: Long enough for fresh metrics and the three Prometheus faults with their recoveries; each
#: fault waits on its own marks.
OUTAGE_LOAD = Phase("steady", duration_s=200.0, rate=2.0, prompt_tokens=256, output_tokens=256)
#: A request that started this soon before the router noticed may already have been routed.
ROUTING_SLACK_S = 1.0

Marks = dict[str, float]
M = TypeVar("M")


def under_load(
    url: str, fault: Callable[[float], M], seed: int, load: Phase = LOAD
) -> tuple[list[Record], M]:
    """Replay `load` against a router while `fault(t0)` runs in this thread; the records and
    the fault's marks, both in seconds since t0 (the load's start)."""
    run = LoadRun(url=url, model=MODEL, phases=[load], seed=seed)
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(asyncio.run, run.run())
        try:
            marks = fault(t0)
        finally:
            records = future.result(timeout=load.duration_s + 330)
    return records, marks


def split_failures(records: Sequence[Record], kill_s: float, settled_s: float) -> dict[str, int]:
    """Pure: failed requests by when they started: before the kill (in flight on what was
    killed), between the kill and `settled_s`, and after it."""
    failed = [r for r in records if r.outcome != OK]
    return {
        "requests": len(records),
        "in_flight_broken": sum(1 for r in failed if r.start_s < kill_s),
        "failed_before_settled": sum(1 for r in failed if kill_s <= r.start_s < settled_s),
        "failed_after_settled": sum(1 for r in failed if r.start_s >= settled_s),
    }


def restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    return sum(int(c.get("restartCount", 0)) for c in statuses)


def kill_pod_process(service: Service, pod: Mapping[str, Any]) -> None:
    """SIGKILL the process the bridge runs for `pod`'s container (kubelet restarts it)."""
    assert service.bridge is not None
    proc = service.bridge.process(service.namespace, pod["metadata"]["name"])
    if proc is None or proc.pid is None:
        raise RuntimeError(f"no process for {pod['metadata']['name']}")
    os.kill(proc.pid, signal.SIGKILL)


def pod_named(service: Service, name: str) -> dict[str, Any] | None:
    return next((p for p in service.pods() if p["metadata"]["name"] == name), None)


def restarted_and_ready(service: Service, name: str, before: int) -> bool:
    pod = pod_named(service, name)
    return pod is not None and restarts(pod) > before and is_ready(pod)


def record_run(outcome: Outcome, figures: Mapping[str, float], failed: str | None) -> None:
    """Add one run's client figures to the row; `failed` says why the run failed, if it did."""
    outcome.runs += 1
    outcome.requests = (outcome.requests or 0) + int(figures["requests"])
    lost = figures["in_flight_broken"] + figures["failed_before_settled"]
    outcome.lost = (outcome.lost or 0) + int(lost + figures["failed_after_settled"])
    outcome.figures.setdefault("runs", []).append(dict(figures))
    if failed:
        outcome.fail(failed)


def serving(service: Service) -> bool:
    """Every pod Ready and the router lists all three workers as healthy."""
    pods = service.pods()
    if len(pods) != 4 or not all(is_ready(p) for p in pods):
        return False
    listed = router_workers(service.router()) or {}
    return len(listed) == 3 and all(healthy for _, healthy in listed.values())


def kill_router(service: Service, pod: Mapping[str, Any], wait_s: float, t0: float) -> Marks:
    """After `wait_s`, SIGKILL the router; settled once it is back, Ready, with 3 workers."""
    name, before, url = pod["metadata"]["name"], restarts(pod), service.router()
    time.sleep(wait_s)
    kill_pod_process(service, pod)
    kill = time.monotonic() - t0
    wait_until(partial(restarted_and_ready, service, name, before), 60, "the router back")
    wait_until(lambda: len(router_workers(url) or {}) == 3, 30, "the router to list 3 workers")
    return {"kill": kill, "settled": time.monotonic() - t0}


def kill_worker(service: Service, pod: Mapping[str, Any], wait_s: float, t0: float) -> Marks:
    """After `wait_s`, SIGKILL a worker; settled when the router stops listing it as healthy
    or it is back (restarted, Ready, healthy in the router), whichever comes first."""
    name, before, worker, router = (
        pod["metadata"]["name"], restarts(pod), pod_url(pod), service.router(),
    )  # fmt: skip
    time.sleep(wait_s)
    kill_pod_process(service, pod)
    marks = {"kill": time.monotonic() - t0}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        healthy = (router_workers(router) or {}).get(worker, ("", False))[1]
        now = time.monotonic() - t0
        if not healthy:
            marks.setdefault("noticed", now)
        if healthy and restarted_and_ready(service, name, before):
            marks["back"] = now
            marks["settled"] = min(marks.get("noticed", now), now) + ROUTING_SLACK_S
            return marks
        time.sleep(0.2)
    raise TimeoutError(f"{name} not back and healthy in the router within 90 s")


def repeat_under_load(
    outcome: Outcome,
    service: Service,
    runs: int,
    fault: Callable[[Service, Mapping[str, Any], float, float], Marks],
    role: str,
    seed: int,
    progress: Progress,
) -> Outcome:
    """`runs` times: LOAD through the router while `fault` hits a random pod of `role`.
    A run fails when the fault does not settle, or when a request that started after it
    settled failed."""
    rng = random.Random(seed)
    for run in range(runs):
        wait_until(partial(serving, service), 180, "every pod Ready and the router listing 3")
        pod = rng.choice(service.role_pods(role))
        hit = partial(fault, service, pod, rng.uniform(5.0, 10.0))
        try:
            records, marks = under_load(service.router(), hit, seed + run)
        except TimeoutError as error:
            outcome.runs += 1
            outcome.fail(f"run {run + 1}: {error}")
            continue
        figures = {**split_failures(records, marks["kill"], marks["settled"]), **marks}
        late = late_failures(records, marks["settled"])
        record_run(outcome, figures, f"run {run + 1}: failed after: {late[:3]}" if late else None)
        progress(f"  run {run + 1}: {figures}")
    return outcome


def router_killed(
    service: Service, runs: int, seed: int = 4, progress: Progress = print
) -> Outcome:
    """The router's process SIGKILLed under load; the bridge restarts it (restartPolicy
    Always). A single replica: streams through it break and new requests are refused until
    it is back; nothing may fail after."""
    outcome = Outcome("router process SIGKILLed under load", requests=0, lost=0)
    return repeat_under_load(
        outcome, service, runs, kill_router, labels.ROLE_ROUTER, seed, progress
    )


def worker_killed(
    service: Service, runs: int, seed: int = 5, progress: Progress = print
) -> Outcome:
    """A decode worker SIGKILLed mid-stream: its in-flight streams break and requests the
    router sends it before it notices fail (both counted); nothing may fail after that."""
    outcome = Outcome("decode worker SIGKILLed mid-stream", requests=0, lost=0)
    return repeat_under_load(
        outcome, service, runs, kill_worker, labels.ROLE_DECODE, seed, progress
    )


def autoscaling_patch(prometheus_url: str) -> dict[str, Any]:
    """Autoscaling on, with room to move both ways, a 30 s window and no stabilization delay
    upwards: without the hold, missing metrics would show as decisions at once."""
    return {
        "spec": {
            labels.ROLE_PREFILL: {"replicas": {"min": 1, "max": 2, "initial": 1}},
            labels.ROLE_DECODE: {"replicas": {"min": 1, "max": 3, "initial": 2}},
            "slo": {"ttft": {"target": "500ms"}, "itl": {"target": "50ms"}, "window": "30s"},
            "autoscaling": {
                "enabled": True,
                "gpuBudget": 5,
                "prometheus": {"url": prometheus_url},
                "interval": "5s",
                "scaleUpStabilization": "0s",
                "scaleDownStabilization": "20s",
            },
        }
    }


def autoscaling_off_patch(counts: Mapping[str, int]) -> dict[str, Any]:
    """What :func:`autoscaling_patch` changed, undone: no autoscaler and no SLOs (a JSON merge
    patch's nulls remove them), the pools fixed at `counts`."""
    return {"spec": {"autoscaling": None, "slo": None, **replicas_patch(counts)["spec"]}}


def metrics_condition(service: Service) -> dict[str, Any]:
    obj = get_isvc(service.api, service.namespace, service.name)
    found = [
        c for c in (obj.get("status") or {}).get("conditions") or ()
        if c["type"] == "MetricsAvailable"
    ]  # fmt: skip
    return dict(found[0]) if found else {}


def desired(service: Service) -> tuple[int, int]:
    status = get_isvc(service.api, service.namespace, service.name).get("status") or {}
    return tuple(int((status.get(r) or {}).get("desired", 0)) for r in labels.WORKER_ROLES)  # type: ignore[return-value]


def warning_counts(service: Service) -> dict[str, tuple[str, int]]:
    """MetricsUnavailable Warning Events: name -> (message, count)."""
    found = service.events(["MetricsUnavailable"])
    return {
        e.metadata.name: (e.message or "", int(e.count or 1)) for e in found if e.type == "Warning"
    }


def new_warnings(
    before: Mapping[str, tuple[str, int]], after: Mapping[str, tuple[str, int]], reason: str
) -> int:
    """Pure: MetricsUnavailable Warnings naming `reason` recorded between two snapshots."""
    return sum(
        count - (before[name][1] if name in before else 0)
        for name, (message, count) in after.items()
        if reason in message
    )


#: The Prometheus faults, in the order one run injects them: how, and the reason the
#: operator must give (docs/reliability.md).
PROMETHEUS_FAULTS: dict[str, tuple[str, str]] = {
    "down": ("Prometheus down (autoscaler on)", "MetricsMissing"),
    "nan": ("Prometheus answering NaN series (autoscaler on)", "MetricsNaN"),
    "stale": ("Prometheus answering stale samples (autoscaler on)", "MetricsStale"),
}
#: How long each fault lasts once the operator reported it (no decision may change desired).
HOLD_S = 20.0


def prometheus_fault(
    service: Service, prometheus: Prometheus, proxy: PrometheusProxy, fault: str, t0: float
) -> Marks:
    """Fresh metrics, then `fault` (Prometheus stopped, or the proxy corrupting its answers):
    MetricsAvailable=False with the fault's reason and a Warning Event, no change of either
    pool's desired replicas while it lasts; then it ends: True again. A wait that times out
    ends the fault and is reported as `timed_out` (1.0) in the marks."""
    reason = PROMETHEUS_FAULTS[fault][1]
    fresh = lambda: metrics_condition(service).get("status") == "True"  # noqa: E731
    marks: Marks = {"start": time.monotonic() - t0, "timed_out": 0.0}
    try:
        wait_until(fresh, 120, "MetricsAvailable=True")
        events, before = warning_counts(service), desired(service)
        marks["start"] = start = time.monotonic() - t0
        if fault == "down":
            prometheus.stop()
        else:
            proxy.switch("nan" if fault == "nan" else "stale")
        wait_until(
            lambda: metrics_condition(service).get("reason") == reason,
            60, f"MetricsAvailable=False ({reason})",
        )  # fmt: skip
        marks["held_after_s"] = time.monotonic() - t0 - start
        changed = []
        for _ in range(round(HOLD_S)):
            now = desired(service)
            if now != before:
                changed.append(now)
            time.sleep(1.0)
        marks["desired_changes_during"] = float(len(changed))
        marks["warning_events"] = float(new_warnings(events, warning_counts(service), reason))
    except TimeoutError as error:
        print(f"  {fault}: {error}", flush=True)
        marks["timed_out"] = 1.0
    finally:
        if fault == "down":
            prometheus.restart()
        proxy.switch("pass")
    try:
        wait_until(fresh, 120, "MetricsAvailable=True after the fault")
        marks["ended_after_s"] = time.monotonic() - t0 - marks["start"]
    except TimeoutError as error:
        print(f"  {fault}: {error}", flush=True)
        marks["timed_out"] = 1.0
    return marks


def late_failures(records: Sequence[Record], start_s: float, end_s: float = math.inf) -> list[str]:
    """Pure: what each request that started in [start_s, end_s) and failed got."""
    return [
        f"{r.outcome} at {r.start_s:.1f}s: {r.detail}"
        for r in records
        if r.outcome != OK and start_s <= r.start_s < end_s
    ]


def prometheus_faults(
    cluster: Cluster, service: Service, runs: int, workdir: Path, progress: Progress = print
) -> list[Outcome]:
    """With the autoscaler on, reading a real Prometheus through PrometheusProxy, under load:
    each run stops Prometheus, then makes it answer NaN, then stale samples (one row each).
    The autoscaler must hold (no change of desired), say why (condition reason, Warning Event)
    and resume after each. No request may fail: none depends on Prometheus. Each row counts
    the requests that started from its fault's start to the next fault's (the first row from
    the load's start, the last to its end)."""
    outcomes = {f: Outcome(row, requests=0, lost=0) for f, (row, _) in PROMETHEUS_FAULTS.items()}
    with start_for_cluster(cluster, workdir, namespaces=[service.namespace]) as prometheus:
        proxy = PrometheusProxy(prometheus.url)
        with proxy.running():
            patch_isvc(service.api, service.namespace, service.name, autoscaling_patch(proxy.url))
            for run in range(runs):

                def inject_all(t0: float) -> dict[str, Marks]:
                    return {f: prometheus_fault(service, prometheus, proxy, f, t0)
                            for f in PROMETHEUS_FAULTS}  # fmt: skip

                records, marks = under_load(service.router(), inject_all, 10 + run, OUTAGE_LOAD)
                starts = [0.0, *[m["start"] for m in marks.values()][1:], math.inf]
                for i, (fault, m) in enumerate(marks.items()):
                    segment = [r for r in records if starts[i] <= r.start_s < starts[i + 1]]
                    failed = late_failures(segment, starts[i])
                    figures = {"requests": float(len(segment)), "in_flight_broken": 0.0,
                               "failed_before_settled": 0.0,
                               "failed_after_settled": float(len(failed)), **m}  # fmt: skip
                    why = ["timed out (see the log)"] if m["timed_out"] else []
                    if m.get("desired_changes_during"):
                        why.append("desired changed while the metrics were bad")
                    if not m.get("warning_events"):
                        why.append("no MetricsUnavailable Warning Event")
                    if failed:
                        why.append(f"{len(failed)} requests failed: {failed[:3]}")
                    record_run(outcomes[fault], figures, f"run {run + 1}: {why}" if why else None)
                    progress(f"  {fault} run {run + 1}: {figures}")
    return list(outcomes.values())


# ----- the command -----------------------------------------------------------------------------

Fault = Callable[[Cluster, Any, Path, argparse.Namespace, Progress], Outcome]

#: Faults on the cluster where kwok runs every pod, in table order.
CONTROL_PLANE: dict[str, Fault] = {
    "sigkill": lambda c, api, wd, a, p: operator_sigkill(c, api, wd, a.reconciles, progress=p),
    "apiserver": lambda c, api, wd, a, p: apiserver_restart(c, api, wd, a.runs, progress=p),
    "conflicts": lambda c, api, wd, a, p: conflicts_and_throttling(c, api, wd, a.runs, progress=p),
}


ServiceFault = Callable[[Cluster, Service, argparse.Namespace, Progress], list[Outcome]]

#: Faults on the bridge cluster's service (1 prefill, 2 decode workers, 1 router), in order.
DATA_PLANE: dict[str, ServiceFault] = {
    "router": lambda _, svc, a, p: [router_killed(svc, a.runs, progress=p)],
    "worker": lambda _, svc, a, p: [worker_killed(svc, a.runs, progress=p)],
    # Last: it turns the autoscaler on, after which the pools may change size.
    "prometheus": lambda c, svc, a, p: prometheus_faults(
        c, svc, a.prometheus_runs, a.workdir / "prometheus", p
    ),
}
FLEET = {labels.ROLE_PREFILL: 1, labels.ROLE_DECODE: 2}


def selected(names: Mapping[str, Any], args: argparse.Namespace) -> list[str]:
    return [name for name in names if not args.only or name in args.only]


def run_service_faults(
    cluster: Cluster, args: argparse.Namespace, progress: Progress
) -> list[Outcome]:
    """The data-plane faults, on one service run by the bridge."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    outcomes = []
    try:
        apply_crds(cluster, api)
        progress("the bridge fleet (1 prefill, 2 decode, router) ...")
        with deployed_service(cluster, api, args.workdir / "pods", FLEET) as service:
            for name in selected(DATA_PLANE, args):
                progress(f"{name} ...")
                outcomes += DATA_PLANE[name](cluster, service, args, progress)
    finally:
        api.close()
    return outcomes


def run_faults(
    cluster: Cluster, faults: Mapping[str, Fault], args: argparse.Namespace, progress: Progress
) -> list[Outcome]:
    """Run each fault of `faults` that `args.only` selects, each with a work folder of its own."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    outcomes = []
    try:
        apply_crds(cluster, api)
        for name in selected(faults, args):
            fault = faults[name]
            workdir = args.workdir / name
            workdir.mkdir(parents=True, exist_ok=True)
            progress(f"{name} ...")
            outcomes.append(fault(cluster, api, workdir, args, progress))
    finally:
        api.close()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write results.json, table.md")
    parser.add_argument("--reconciles", type=int, default=200)
    parser.add_argument("--runs", type=int, default=10, help="repetitions of the other faults")
    parser.add_argument(
        "--prometheus-runs",
        type=int,
        default=3,
        help="runs of the three Prometheus faults (~3.5 min each)",
    )
    parser.add_argument("--only", nargs="*", default=[], choices=[*CONTROL_PLANE, *DATA_PLANE])
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    args = parser.parse_args(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pdfleet-faults-"))
    print(f"logs: {args.workdir}", flush=True)

    def progress(line: str) -> None:
        print(line, flush=True)

    outcomes: list[Outcome] = []
    if selected(CONTROL_PLANE, args):
        with local_cluster(args.workdir / "kwok-plain", "pdfleet-faults", bridge_label=None) as cp:
            outcomes += run_faults(cp, CONTROL_PLANE, args, progress)
    if selected(DATA_PLANE, args):
        with local_cluster(args.workdir / "kwok-bridge", "pdfleet-faults-fleet") as fleet:
            outcomes += run_service_faults(fleet, args, progress)
    print(table(outcomes))
    for o in outcomes:
        for problem in o.problems:
            print(f"{o.fault}: {problem}", file=sys.stderr)
    if args.out is not None:
        write_results(args.out, outcomes)
    return 1 if any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
