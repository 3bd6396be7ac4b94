"""The fault suite: each fault repeated against the real pieces, with the table it produces.

Where it fits: docs/reliability.md shows the table; tests/e2e_faults runs a short version of
each fault as pytest tests; this command runs the full repetitions (inside the private network
namespace) and writes the results::

    e2e/netns.sh .venv/bin/python -m e2e.faults --out docs/benchmarks/faults

Faults, on two local clusters (e2e/cluster.py): control-plane faults on one where kwok runs
every pod (the operator alone matters there, and pods start at once); data-plane faults on one
where the process bridge runs the simulated workers and the real vllm-router.

* operator SIGKILL at random points while spec changes stream in, restarted each time;
* etcd and kube-apiserver SIGKILLed and started again, the operator left running;
* 409 Conflict and 429 Too Many Requests on a share of the operator's writes (e2e/fault_proxy.py);
* the router process killed under streaming load; a decode worker killed mid-stream;
* Prometheus stopped, and Prometheus with its scrape targets gone, under an enabled autoscaler.

After every run the service must converge (e2e/children.py: children equal the render of the
final spec, owned by it, no orphan or duplicate, observedGeneration current). "Lost" counts
client-visible failures: a request that got no complete response (HTTP error, broken or short
stream); the load generator retries nothing, so each one would have reached a user.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, config

from e2e.children import (
    convergence_problems,
    get_isvc,
    list_children,
    patch_isvc,
    pod_summary,
)
from e2e.cluster import Cluster, wait_until
from e2e.fault_proxy import FaultProxy, FaultRates, injected, proxied_kubeconfig, summary
from e2e.operator_process import OperatorProcess
from pdfleet import labels

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


def write_results(out: Path, outcomes: Sequence[Outcome]) -> None:
    """`results.json` (every figure) and `table.md` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    (out / "table.md").write_text(table(outcomes) + "\n")


# ----- spec changes (pure) ---------------------------------------------------------------------


def base_service(name: str, namespace: str) -> dict[str, Any]:
    """A minimal service whose forced drains end fast: the control-plane cluster's pods are
    run by kwok, so no router answers the drain's in-flight reads."""
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
    api: Any, namespace: str, names: Sequence[str], timeout_s: float, require_ready: bool = True
) -> list[str]:
    """Poll until every service converged; the problems left at the deadline (empty: ok)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = problems_of(api, namespace, names, require_ready)
        except (client.ApiException, OSError) as error:  # the API server may still be waking
            left = [f"read failed: {error}"]
        if not left or time.monotonic() > deadline:
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
    operator.start().wait_healthy()
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
    SIGKILL is tests/integration/test_operator_ha.py's subject)."""
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


def lease_renewed_after(api: Any, name: str, moment: float) -> bool:
    coordination: Any = client.CoordinationV1Api(api)
    lease = coordination.read_namespaced_lease(name, "kube-system")
    renewed = lease.spec.renew_time
    return renewed is not None and renewed.timestamp() > moment


def apiserver_restart(
    cluster: Cluster, api: Any, workdir: Path, runs: int = 5, seed: int = 2,
    progress: Progress = print,
) -> Outcome:  # fmt: skip
    """etcd and kube-apiserver SIGKILLed and started again (their data survives) while the
    operator (leader election on) runs: without a restart of its own it must re-establish its
    watches (a spec change made after the restart is reconciled) and keep renewing its lease."""
    rng = random.Random(seed)
    outcome = Outcome("etcd + kube-apiserver SIGKILLed and restarted")
    with services(cluster, api, 1, "apiserver") as (namespace, names):
        operator = operator_for(cluster.kubeconfig, workdir, namespace)
        stale = 0
        try:
            pid = start_converged(operator, api, namespace, names)
            for run in range(runs):
                outcome.runs += 1
                # Shorter than the 15 s lease: a leader cut off longer exits by design.
                down_s = rng.uniform(0.0, 6.0)
                cluster.crash_and_restart(("etcd", "kube-apiserver"), down_s)
                wait_until(cluster.is_running, 120, "the API server back", interval_s=0.5)
                back = time.time()
                patch_isvc(api, namespace, names[0], random_change(rng))
                # Children and observedGeneration: the watches are back. Ready is reported
                # apart: kopf keeps objects deleted during the outage in its indexes (see
                # docs/reliability.md), so the pool counts in status can stay stale.
                problems = wait_converged(api, namespace, names, 120, require_ready=False)
                if wait_converged(api, namespace, names, 30):
                    stale += 1
                if not same_process(operator, pid):
                    problems.append("the operator exited")
                try:
                    wait_until(
                        partial(lease_renewed_after, api, operator.lease_name, back),
                        30, "the lease renewed after the restart",
                    )  # fmt: skip
                except TimeoutError as error:
                    problems.append(str(error))
                if problems:
                    outcome.fail(f"restart {run + 1} (down {down_s:.1f}s): {problems[:5]}")
                progress(f"  restart {run + 1} (down {down_s:.1f}s): ok={not problems}")
        finally:
            operator.stop()
    outcome.figures = {"status_not_ready_after_restart": stale}
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


# ----- the command -----------------------------------------------------------------------------

Fault = Callable[[Cluster, Any, Path, argparse.Namespace, Progress], Outcome]

#: Faults on the cluster where kwok runs every pod, in table order.
CONTROL_PLANE: dict[str, Fault] = {
    "sigkill": lambda c, api, wd, a, p: operator_sigkill(c, api, wd, a.reconciles, progress=p),
    "apiserver": lambda c, api, wd, a, p: apiserver_restart(c, api, wd, a.runs, progress=p),
    "conflicts": lambda c, api, wd, a, p: conflicts_and_throttling(c, api, wd, a.runs, progress=p),
}


def run_faults(
    cluster: Cluster, faults: Mapping[str, Fault], args: argparse.Namespace, progress: Progress
) -> list[Outcome]:
    """Run each fault of `faults` that `args.only` selects, each with a work folder of its own."""
    from e2e.drain_scenario import apply_crds

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    outcomes = []
    try:
        apply_crds(cluster, api)
        for name, fault in faults.items():
            if args.only and name not in args.only:
                continue
            workdir = args.workdir / name
            workdir.mkdir(parents=True, exist_ok=True)
            progress(f"{name} ...")
            outcomes.append(fault(cluster, api, workdir, args, progress))
    finally:
        api.close()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    from e2e.drain_scenario import local_cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write results.json, table.md")
    parser.add_argument("--reconciles", type=int, default=200)
    parser.add_argument("--runs", type=int, default=10, help="repetitions of the other faults")
    parser.add_argument("--only", nargs="*", default=[], choices=[*CONTROL_PLANE])
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    args = parser.parse_args(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pdfleet-faults-"))
    print(f"logs: {args.workdir}", flush=True)

    def progress(line: str) -> None:
        print(line, flush=True)

    outcomes: list[Outcome] = []
    with local_cluster(args.workdir / "kwok-plain", "pdfleet-faults", bridge_label=None) as cp:
        outcomes += run_faults(cp, CONTROL_PLANE, args, progress)
    print(table(outcomes))
    for o in outcomes:
        for problem in o.problems:
            print(f"{o.fault}: {problem}", file=sys.stderr)
    if args.out is not None:
        write_results(args.out, outcomes)
    return 1 if any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
