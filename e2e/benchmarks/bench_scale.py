"""Control plane at scale: N InferenceServices on the local cluster, measured (issue #10).

One run, one cluster (real etcd, kube-apiserver, kube-controller-manager, kube-scheduler;
kwok plays kubelet for fake GPU nodes sized for the run), in this order:

1. **floor**: the children the operator would create (``render_children`` for every
   service, the applied-hash annotation included) are server-side applied by a tight client
   loop with as many threads as the operator has child writes in flight, in namespaces of
   their own; the time until every pod is Ready is the floor. Then they are deleted.
2. **create**: the operator runs; N InferenceServices are created at once; time until every
   one is Ready (observedGeneration current), the operator's peak RSS and CPU seconds, API
   requests by verb (all clients: ``apiserver_request_total``; the operator: the audit log).
3. **steady**: nothing changes for ``--steady-s``; the operator's writes, CPU and RSS.
4. **latency**: ``--changes`` spec changes (a new engine image), one at a time, each on
   another service: patch -> the StatefulSet's template carries it (watch events).
5. **restart**: the operator is stopped and started again; time until every service has been
   reconciled once, and the writes it made meanwhile (target: none to unchanged objects).

The operator runs as its own user (a ServiceAccount token) and the API server keeps an audit
log of that user's requests only (Metadata level), so its requests by verb are the API
server's view, not a client-side counter. Lease renewals (leader election) are counted apart.

    # make bench-scale
    e2e/platform/netns.sh .venv/bin/python -m e2e.benchmarks.bench_scale --services 1000
    # a quick try
    e2e/platform/netns.sh .venv/bin/python -m e2e.benchmarks.bench_scale --services 100 \\
        --steady-s 60 --changes 20 --out /tmp/scale

Results: ``<out>/results.json`` and a Markdown table printed and written to
``<out>/table.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from e2e.platform.cluster import (
    REPO_ROOT,
    Cluster,
    ClusterConfig,
    NodeSpec,
    default_nodes,
    start,
    stop,
)
from e2e.platform.cluster import wait_until as poll_until
from e2e.platform.operator_process import OperatorProcess, parse_metrics
from e2e.platform.service import apply_crds
from e2e.platform.stats import percentile
from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.controller import WRITES_IN_FLIGHT
from pdfleet.kube.api import KubeWriter
from pdfleet.reconcile.plan import desired_replicas, with_hash
from pdfleet.render import render_children

SAMPLE = REPO_ROOT / "crds" / "samples" / "minimal.yaml"
OUT_DIR = REPO_ROOT / "docs" / "benchmarks" / "scale"
# One prefill, two decode workers and a router: four pods per service.
PREFILL, DECODE = 1, 2
PODS_PER_SERVICE = PREFILL + DECODE + 1
SERVICES_PER_NAMESPACE = 100
PODS_PER_NODE = 200  # inside a node's /24 podCIDR, from which kwok hands out pod IPs
HEADROOM = 1.25  # rolling updates briefly need a pod more
SERVICE_CIDR = "10.96.0.0/16"
OPERATOR_NS, OPERATOR_SA = "pdfleet-bench", "pdfleet-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
WATCH_VERBS = frozenset({"watch"})
# Client rate limits of a cluster sized for thousands of pods (the defaults, 20 and 50 QPS,
# would make the controllers, not the operator, the bottleneck of both runs).
CLIENT_QPS = (("kube-controller-manager", "200", "400"), ("kube-scheduler", "200", "400"))

TARGETS = {
    "convergence_ratio": 1.5,
    "peak_rss_mb": 250.0,
    "idle_writes": 0,
    "reconcile_p99_s": 1.0,
}


# ---------------------------------------------------------------------------------------
# Pure: sizing, manifests, parsing, statistics, the table
# ---------------------------------------------------------------------------------------


def scale_nodes(services: int) -> tuple[NodeSpec, ...]:
    """GPU nodes for the workers and CPU nodes for the routers, with ~25 % headroom."""
    gpu_nodes = max(2, math.ceil(services * (PREFILL + DECODE) * HEADROOM / PODS_PER_NODE))
    cpu_nodes = max(1, math.ceil(services * HEADROOM / PODS_PER_NODE))
    nodes = default_nodes(h100=gpu_nodes - gpu_nodes // 2, h200=gpu_nodes // 2, cpu=cpu_nodes)
    big = {"pods": PODS_PER_NODE, "cpu": "4000", "memory": "64Ti"}
    return tuple(
        dataclasses.replace(n, **big, gpus=PODS_PER_NODE, rdma=PODS_PER_NODE)  # type: ignore[arg-type]
        if n.gpu_product
        else dataclasses.replace(n, **big)  # type: ignore[arg-type]
        for n in nodes
    )


def namespaces(prefix: str, services: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(math.ceil(services / SERVICES_PER_NAMESPACE))]


def service_keys(prefix: str, services: int) -> list[tuple[str, str]]:
    """(namespace, name) of every service, SERVICES_PER_NAMESPACE per namespace."""
    spaces = namespaces(prefix, services)
    return [(spaces[i // SERVICES_PER_NAMESPACE], f"svc-{i:04d}") for i in range(services)]


def service_manifest(sample: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """The minimal sample with one prefill and two decode workers."""
    spec = dict(sample["spec"])
    spec["prefill"] = {**spec["prefill"], "replicas": {"min": PREFILL, "max": PREFILL}}
    spec["decode"] = {**spec["decode"], "replicas": {"min": DECODE, "max": DECODE}}
    return {**sample, "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def floor_children(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the operator applies for a fresh service (no owner: there is none to point to)."""
    isvc = InferenceService.model_validate(manifest)
    return [with_hash(m) for m in render_children(isvc, desired_replicas(isvc, None))]


def audit_policy(user: str) -> dict[str, Any]:
    """Log request metadata of ``user`` only: cheap, and attributes requests to it."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [user]}, {"level": "None"}],
    }


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    t: float  # request received
    verb: str
    resource: str
    user: str
    code: int
    done: float = math.nan  # response complete (watches: started)
    namespace: str = ""
    name: str = ""


def audit_entries(lines: Iterable[str]) -> Iterator[AuditEntry]:
    """One entry per request: watches at ResponseStarted (they finish much later), the rest
    at ResponseComplete."""
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        verb, stage = event.get("verb", ""), event.get("stage")
        if stage != ("ResponseStarted" if verb in WATCH_VERBS else "ResponseComplete"):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        yield AuditEntry(
            t=_epoch(event["requestReceivedTimestamp"]),
            verb=verb,
            resource=resource,
            user=(event.get("user") or {}).get("username", ""),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            done=_epoch(event["stageTimestamp"]),
            namespace=ref.get("namespace", ""),
            name=ref.get("name", ""),
        )


def requests_summary(entries: Iterable[AuditEntry], t0: float, t1: float) -> dict[str, Any]:
    """Requests in [t0, t1) by verb, writes by resource, and lease writes kept apart."""
    by_verb: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    for e in entries:
        if not t0 <= e.t < t1:
            continue
        by_verb[e.verb] += 1
        if e.verb in WRITE_VERBS:
            writes[f"{e.verb} {e.resource}"] += 1
    lease = sum(n for k, n in writes.items() if k.endswith(" leases"))
    return {
        "by_verb": dict(sorted(by_verb.items())),
        "writes_by_resource": dict(sorted(writes.items())),
        "writes": sum(writes.values()) - lease,
        "lease_writes": lease,
    }


def latency_breakdown(
    entries: Iterable[AuditEntry], changed: Sequence[tuple[str, str, float, float]]
) -> dict[str, Any]:
    """Where a spec change's latency goes, from the operator's StatefulSet writes in the audit
    log. ``changed`` holds (namespace, name, patch sent, patch answered). ``reaction`` = change
    sent -> the operator's first StatefulSet request received; ``after_commit`` = the same from
    the moment the API server answered the change's patch (the watch delivery, the queue and
    the pass); ``server`` = from that first StatefulSet request received to the last one of
    the pass answered (the writes go out at once)."""
    writes: dict[tuple[str, str], list[AuditEntry]] = {}
    for e in entries:
        if e.resource == "statefulsets" and e.verb == "patch":
            writes.setdefault((e.namespace, e.name), []).append(e)
    reaction, after_commit, server = [], [], []
    for namespace, name, sent, answered in changed:
        mine = [
            e
            for role in labels.WORKER_ROLES
            for e in writes.get((namespace, f"{name}-{role}"), ())
            if e.t >= sent
        ]
        mine = sorted(mine, key=lambda e: e.t)[: len(labels.WORKER_ROLES)]
        if mine:
            reaction.append(mine[0].t - sent)
            after_commit.append(mine[0].t - answered)
            server.append(max(e.done for e in mine) - mine[0].t)
    return {
        "changes": len(reaction),
        "reaction_p50_s": percentile(reaction, 50),
        "reaction_p99_s": percentile(reaction, 99),
        "after_commit_p50_s": percentile(after_commit, 50),
        "after_commit_p99_s": percentile(after_commit, 99),
        "server_p50_s": percentile(server, 50),
        "server_p99_s": percentile(server, 99),
    }


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def requests_by_verb(metrics_text: str) -> dict[str, float]:
    """``apiserver_request_total`` summed by verb (every client, every code)."""
    totals: dict[str, float] = {}
    for key, value in parse_metrics(metrics_text).items():
        if key.startswith("apiserver_request_total{"):
            verb = dict(_LABEL.findall(key)).get("verb", "")
            totals[verb] = totals.get(verb, 0.0) + value
    return totals


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, int]:
    keys = sorted(set(after) | set(before))
    out = {k: int(after.get(k, 0) - before.get(k, 0)) for k in keys}
    return {k: v for k, v in out.items() if v}


@dataclasses.dataclass(frozen=True)
class Usage:
    """Operator process use over a window: CPU seconds, peak and last RSS."""

    cpu_s: float
    peak_rss_mb: float
    end_rss_mb: float


def usage(samples: Sequence[tuple[float, float, float]], t0: float, t1: float) -> Usage:
    """From (t, cpu_s, rss_mb) samples, those inside [t0, t1]."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return Usage(math.nan, math.nan, math.nan)
    return Usage(
        cpu_s=inside[-1][1] - inside[0][1],
        peak_rss_mb=max(s[2] for s in inside),
        end_rss_mb=inside[-1][2],
    )


def _fmt(value: Any, unit: str = "") -> str:
    if isinstance(value, float):
        return f"{value:,.2f}{unit}" if abs(value) < 100 else f"{value:,.0f}{unit}"
    return f"{value:,}{unit}" if isinstance(value, int) else str(value)


def _seconds(figures: Mapping[str, Any], *keys: str) -> str:
    return " / ".join(_fmt(figures[k], " s") for k in keys)


def _verbs(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met."""
    op = results["operator"]
    measured = {
        "convergence_ratio": results["convergence_ratio"],
        "peak_rss_mb": results["peak_rss_mb"],
        "idle_writes": op["steady"]["operator_requests"]["writes"],
        "reconcile_p99_s": op["latency"]["p99_s"],
    }
    return [
        {"name": k, "target": v, "value": measured[k], "met": bool(measured[k] <= v)}
        for k, v in TARGETS.items()
    ]


def render_table(results: Mapping[str, Any]) -> str:
    """The short Markdown summary of a run."""
    op, floor = results["operator"], results["floor"]
    create, steady, lat, restart = op["create"], op["steady"], op["latency"], op["restart"]
    n = results["services"]
    rows = [
        ("Services / pods / child objects", f"{n:,} / {n * PODS_PER_SERVICE:,} / "
         f"{results['children']:,}"),
        ("Floor: tight apply loop, start -> all pods Ready", _fmt(floor["ready_s"], " s")),
        ("Operator: create -> every service Ready", _fmt(create["ready_s"], " s")),
        *(
            [("Operator: create -> every service's first KV preflight verdict",
              _fmt(create["verdicts_s"], " s"))]
            if "verdicts_s" in create else []
        ),
        ("Convergence ratio (operator / floor)", _fmt(results["convergence_ratio"], "x")),
        ("Operator peak RSS (whole run)", _fmt(results["peak_rss_mb"], " MB")),
        ("Operator CPU during convergence", _fmt(create["usage"]["cpu_s"], " s")),
        ("Operator requests during convergence",
         _verbs(create["operator_requests"]["by_verb"])),
        ("All API requests during convergence (apiserver_request_total)",
         _verbs(create["apiserver_requests"])),
        (f"Steady {steady['seconds']:.0f} s: operator writes (lease renewals apart)",
         f"{steady['operator_requests']['writes']} "
         f"({steady['operator_requests']['lease_writes']} lease)"),
        (f"Steady {steady['seconds']:.0f} s: operator CPU / RSS",
         f"{_fmt(steady['usage']['cpu_s'], ' s')} / {_fmt(steady['usage']['end_rss_mb'], ' MB')}"),
        (f"Reconcile latency, spec change -> StatefulSet ({lat['changes']} changes) p50 / p99",
         _seconds(lat, "p50_s", "p99_s")),
        *(
            [("  of which: change -> operator's first StatefulSet write, p50 / p99",
              _seconds(bd, "reaction_p50_s", "reaction_p99_s")),
             ("    from the change's patch answered (watch, queue, pass), p50 / p99",
              _seconds(bd, "after_commit_p50_s", "after_commit_p99_s")),
             ("  of which: the API server on those writes (first in -> last out), p50 / p99",
              _seconds(bd, "server_p50_s", "server_p99_s"))]
            if (bd := lat.get("breakdown")) else []
        ),
        ("Restart: start -> every service reconciled once",
         _fmt(restart["resumed_s"], " s") if restart["resumed_s"] is not None else
         f"not within {_fmt(restart['timeout_s'], ' s')} ({restart['reconciled']:,} reconciled)"),
        ("Restart: writes to objects (lease apart)",
         f"{restart['operator_requests']['writes']} "
         f"({restart['operator_requests']['lease_writes']} lease)"),
    ]  # fmt: skip
    lines = ["| What | Measured |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    lines += ["", "| Target | Limit | Measured | Met |", "|---|---|---|---|"]
    for t in targets(results):
        met = "yes" if t["met"] else "**no**"
        lines.append(f"| {t['name']} | {_fmt(t['target'])} | {_fmt(t['value'])} | {met} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# I/O: watches, sampling, the operator's identity
# ---------------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# Each watch request ends after this long and starts again from a fresh listing.
WATCH_S = 300


class Watched(threading.Thread):
    """A watch that keeps ``summarize(obj)`` per object and how many of them are truthy.

    Objects are kept as raw JSON (no model deserialization: thousands of pods)."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        summarize: Callable[[dict[str, Any]], Any],
        *args: Any,
        **kwargs: Any,
    ):
        super().__init__(daemon=True)
        self.list_fn, self.summarize, self.args, self.kwargs = list_fn, summarize, args, kwargs
        self.values: dict[tuple[str, str], Any] = {}
        self.truthy = 0
        self.changed = threading.Condition()
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        self._halt = threading.Event()

    def _set(self, key: tuple[str, str], value: Any) -> None:
        old = self.values.pop(key, None)
        self.truthy -= bool(old)
        if value is not None:
            self.values[key] = value
            self.truthy += bool(value)

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj["metadata"]
        return meta.get("namespace", ""), meta["name"]

    def _relist(self) -> str:
        """Replace every value from a fresh listing; the resourceVersion to watch from.

        A watch that dropped and started again without one misses the deletions made in
        between (a wait for those objects to go would never end), so every (re)start lists
        first and then watches from the listing's version."""
        resp = self.list_fn(*self.args, _preload_content=False, **self.kwargs)
        listing = json.loads(resp.data)
        fresh = {self._key(obj): self.summarize(obj) for obj in listing["items"]}
        with self.changed:
            self.values = {k: v for k, v in fresh.items() if v is not None}
            self.truthy = sum(bool(v) for v in self.values.values())
            self.changed.notify_all()
        return str(listing["metadata"]["resourceVersion"])

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                version = self._relist()
                stream = self._watch.stream(  # type: ignore[no-untyped-call]
                    self.list_fn,
                    *self.args,
                    resource_version=version,
                    deserialize=False,
                    timeout_seconds=WATCH_S,
                    _request_timeout=(10, WATCH_S + 30),  # a stalled stream raises
                    **self.kwargs,
                )
                for event in stream:
                    if event["type"] in ("BOOKMARK", "ERROR"):
                        continue
                    obj = event["object"]
                    value = None if event["type"] == "DELETED" else self.summarize(obj)
                    with self.changed:
                        self._set(self._key(obj), value)
                        self.changed.notify_all()
            except ApiException as error:  # 410 Gone: the next pass lists afresh
                if error.status != 410:
                    raise
            except urllib3.exceptions.HTTPError:  # a dropped or stalled connection
                if not self._halt.wait(1.0):
                    _log("watch connection dropped; listing and watching again")

    def wait(self, predicate: Callable[[Watched], bool], timeout_s: float, what: str) -> float:
        """Block until ``predicate(self)``; the monotonic time it first held."""
        with self.changed:
            if not self.changed.wait_for(lambda: predicate(self), timeout_s):
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            return time.monotonic()

    def stop(self) -> None:
        self._halt.set()
        self._watch.stop()  # type: ignore[no-untyped-call]


def pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def isvc_ready(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"].get("generation"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def kv_verdict(obj: dict[str, Any]) -> bool:
    """The KV transport preflight has reported (KVTransportReady present, whatever its status).
    kwok pods run no preflight listener, so every verdict is a failure: recorded once per
    service, then retried without writes (docs/kv-preflight.md)."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "KVTransportReady" for c in conditions)


def template_image(sts: dict[str, Any]) -> str:
    return str(sts["spec"]["template"]["spec"]["containers"][0]["image"])


class Sampler(threading.Thread):
    """(t, cpu seconds, RSS MB) of one process every ``period_s``, from /proc."""

    def __init__(self, pid: int, period_s: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.period_s = pid, period_s
        self.samples: list[tuple[float, float, float]] = []
        self._halt = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> tuple[float, float, float] | None:
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        fields = stat.rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
        rss_kb = [int(line.split()[1]) for line in status.splitlines() if line[:6] == "VmRSS:"]
        if not rss_kb:  # an exited process not yet reaped has no memory lines
            return None
        return time.monotonic(), cpu, rss_kb[0] / 1024

    def run(self) -> None:
        while not self._halt.wait(self.period_s):
            if (s := self.sample()) is not None:
                self.samples.append(s)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        if (s := self.sample()) is not None:
            self.samples.append(s)


def operator_kubeconfig(cluster: Cluster, workdir: Path) -> Path:
    """A kubeconfig for a ServiceAccount bound to cluster-admin: the operator's own user."""
    cluster.kubectl("create", "namespace", OPERATOR_NS)
    cluster.kubectl("create", "serviceaccount", OPERATOR_SA, "-n", OPERATOR_NS)
    cluster.kubectl(
        "create", "clusterrolebinding", OPERATOR_SA, "--clusterrole=cluster-admin",
        f"--serviceaccount={OPERATOR_NS}:{OPERATOR_SA}",
    )  # fmt: skip
    token = cluster.kubectl(
        "create", "token", OPERATOR_SA, "-n", OPERATOR_NS, "--duration=24h"
    ).strip()
    kubeconfig = yaml.safe_load(cluster.kubectl("config", "view", "--raw", "--minify", "--flatten"))
    kubeconfig["users"][0]["user"] = {"token": token}
    path = workdir / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


def apiserver_counts(api: client.ApiClient) -> dict[str, float]:
    response = api.call_api(*api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"]))
    return requests_by_verb(response.read().decode())  # type: ignore[no-untyped-call]


def create_namespaces(core: client.CoreV1Api, names: Sequence[str]) -> None:
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    # kube-controller-manager creates the default ServiceAccount; pods wait for it.
    def accounts(namespace: str) -> list[Any]:
        found = core.list_namespaced_service_account(
            namespace, field_selector="metadata.name=default"
        )
        return list(found.items)

    for name in names:
        poll_until(lambda: accounts(name), 60, f"default ServiceAccount in {name}")  # noqa: B023


def delete_namespaces(core: client.CoreV1Api, names: Sequence[str], timeout_s: float) -> float:
    started = time.monotonic()
    for name in names:
        core.delete_namespace(name)

    def gone() -> bool:
        left = {ns.metadata.name for ns in core.list_namespace().items if ns.metadata}
        return not left & set(names)

    poll_until(gone, timeout_s, f"namespaces {names[0]}.. to be deleted", interval_s=2.0)
    return time.monotonic() - started


def parallel(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(fn, items):
            pass


# ---------------------------------------------------------------------------------------
# The phases
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Bench:
    cluster: Cluster
    api: client.ApiClient
    workdir: Path
    services: int
    workers: int
    timeout_s: float
    audit_log: Path
    # Called with each phase's figures as soon as it ends, so a run cut short keeps them.
    checkpoint: Callable[[str, dict[str, Any]], None] = lambda _phase, _figures: None
    # A restart that has not reconciled every service by then is recorded as such (how many
    # it had reached), and the run goes on to write its results.
    restart_timeout_s: float | None = None
    sample: dict[str, Any] = dataclasses.field(
        default_factory=lambda: yaml.safe_load(SAMPLE.read_text())
    )

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def pods(self, selector: str = labels.SERVICE) -> Watched:
        w = Watched(self.core.list_pod_for_all_namespaces, pod_ready, label_selector=selector)
        w.start()
        return w

    def operator_entries(self) -> list[AuditEntry]:
        """The operator's requests so far, from the audit log."""
        with self.audit_log.open() as lines:
            return [e for e in audit_entries(lines) if e.user == OPERATOR_USER]

    def operator_requests(self, t0: float, t1: float) -> dict[str, Any]:
        """The operator's requests in the wall-clock window."""
        return requests_summary(self.operator_entries(), t0, t1)

    def floor(self) -> dict[str, Any]:
        keys = service_keys("floor", self.services)
        spaces = namespaces("floor", self.services)
        create_namespaces(self.core, spaces)
        writer = KubeWriter(self.api, field_manager="pdfleet-floor")
        work = [(ns, floor_children(service_manifest(self.sample, ns, name))) for ns, name in keys]
        target = self.services * PODS_PER_SERVICE
        pods = self.pods()
        before = apiserver_counts(self.api)
        _log(f"floor: applying {sum(len(c) for _, c in work):,} children")
        started = time.monotonic()
        parallel(lambda item: [writer.apply(m, item[0]) for m in item[1]], work, self.workers)
        applied = time.monotonic()
        _log(f"floor: applied in {applied - started:.1f}s; waiting for {target:,} pods Ready")
        ready = pods.wait(lambda w: w.truthy >= target, self.timeout_s, "floor pods Ready")
        requests = delta(apiserver_counts(self.api), before)
        _log(f"floor: all pods Ready after {ready - started:.1f}s; deleting")
        deleted = delete_namespaces(self.core, spaces, self.timeout_s)
        pods.wait(lambda w: not w.values, self.timeout_s, "floor pods gone")
        pods.stop()
        return {
            "children": sum(len(c) for _, c in work),
            "apply_s": applied - started,
            "ready_s": ready - started,
            "apiserver_requests": requests,
            "delete_s": deleted,
        }

    def start_operator(self, kubeconfig: Path, log: Path) -> tuple[OperatorProcess, Sampler]:
        op = OperatorProcess(
            kubeconfig=kubeconfig,
            log_path=log,
            resync_seconds=60.0,  # the command's default
            identity="bench",
        )
        op.start().wait_healthy(timeout=120)
        assert op.process is not None
        sampler = Sampler(op.process.pid)
        sampler.start()
        return op, sampler

    def operator_run(
        self, kubeconfig: Path, steady_s: float, changes: int, settle_s: float
    ) -> dict[str, Any]:
        keys = service_keys("scale", self.services)
        create_namespaces(self.core, namespaces("scale", self.services))
        custom = client.CustomObjectsApi(self.api)
        isvcs, verdicts = (
            Watched(
                custom.list_cluster_custom_object,
                predicate,
                labels.GROUP,
                labels.VERSION,
                labels.PLURAL,
            )
            for predicate in (isvc_ready, kv_verdict)
        )
        isvcs.start()
        verdicts.start()
        op, sampler = self.start_operator(kubeconfig, self.workdir / "operator.log")
        result: dict[str, Any] = {}
        try:
            result["create"] = self._create(custom, keys, isvcs, verdicts, sampler)
            self.checkpoint("create", result["create"])
            time.sleep(settle_s)
            result["steady"] = self._steady(steady_s, sampler)
            self.checkpoint("steady", result["steady"])
            result["latency"] = self._latency(custom, keys, changes)
            self.checkpoint("latency", result["latency"])
            isvcs.wait(lambda w: w.truthy >= self.services, self.timeout_s, "Ready again")
            time.sleep(settle_s)
            op.stop()
            sampler.stop()
            first = sampler.samples
            result["restart"], op, sampler = self._restart(kubeconfig)
            self.checkpoint("restart", result["restart"])
            result["peak_rss_mb"] = max(s[2] for s in [*first, *sampler.samples])
        finally:
            op.stop()
            sampler.stop()
            isvcs.stop()
            verdicts.stop()
        return result

    def _window(self, sampler: Sampler, wall0: float, mono0: float) -> dict[str, Any]:
        wall1, mono1 = time.time(), time.monotonic()
        return {
            "operator_requests": self.operator_requests(wall0, wall1),
            "usage": dataclasses.asdict(usage(sampler.samples, mono0, mono1)),
        }

    def _create(
        self,
        custom: client.CustomObjectsApi,
        keys: Sequence[tuple[str, str]],
        isvcs: Watched,
        verdicts: Watched,
        sampler: Sampler,
    ) -> dict[str, Any]:
        before = apiserver_counts(self.api)
        wall0, started = time.time(), time.monotonic()

        def create(key: tuple[str, str]) -> None:
            body = service_manifest(self.sample, *key)
            custom.create_namespaced_custom_object(
                labels.GROUP, labels.VERSION, key[0], labels.PLURAL, body
            )

        _log(f"operator: creating {len(keys):,} InferenceServices")
        parallel(create, keys, self.workers)
        created = time.monotonic()
        _log(f"operator: created in {created - started:.1f}s; waiting for every one Ready")
        ready = isvcs.wait(lambda w: w.truthy >= self.services, self.timeout_s, "services Ready")
        _log(f"operator: all Ready after {ready - started:.1f}s")
        # The steady window starts once the last service's first KV preflight verdict is in:
        # it is a one-off write per service that a fleet this size spreads over minutes.
        settled = verdicts.wait(
            lambda w: w.truthy >= self.services, self.timeout_s, "KV preflight verdicts"
        )
        _log(f"operator: every KV preflight verdict recorded after {settled - started:.1f}s")
        return {
            "create_s": created - started,
            "ready_s": ready - started,
            "verdicts_s": settled - started,
            "apiserver_requests": delta(apiserver_counts(self.api), before),
            **self._window(sampler, wall0, started),
        }

    def _steady(self, seconds: float, sampler: Sampler) -> dict[str, Any]:
        _log(f"steady: {seconds:.0f}s with nothing changing")
        before = apiserver_counts(self.api)
        wall0, mono0 = time.time(), time.monotonic()
        time.sleep(seconds)
        return {
            "seconds": seconds,
            "apiserver_requests": delta(apiserver_counts(self.api), before),
            **self._window(sampler, wall0, mono0),
        }

    def _latency(
        self, custom: client.CustomObjectsApi, keys: Sequence[tuple[str, str]], changes: int
    ) -> dict[str, Any]:
        apps = client.AppsV1Api(self.api)
        stss = Watched(
            apps.list_stateful_set_for_all_namespaces,
            template_image,
            label_selector=f"{labels.ROLE}=decode",
        )
        stss.start()
        stss.wait(lambda w: len(w.values) >= self.services, 120, "StatefulSets listed")
        image = self.sample["spec"]["engine"]["image"]
        latencies, changed = [], []
        _log(f"latency: {changes} spec changes, one at a time")
        for i in range(changes):
            namespace, name = keys[(i * len(keys)) // changes]
            new = f"{image.rpartition(':')[0]}:bench-{i}"
            patch = {"spec": {"engine": {"image": new}}}
            sent, started = time.time(), time.monotonic()
            custom.patch_namespaced_custom_object(
                labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name, patch
            )
            changed.append((namespace, name, sent, time.time()))
            key = (namespace, f"{name}-decode")

            def updated(w: Watched, key: tuple[str, str] = key, image: str = new) -> bool:
                return bool(w.values.get(key) == image)

            done = stss.wait(updated, 60, f"{key} updated")
            latencies.append(done - started)
        stss.stop()
        return {
            "changes": changes,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "max_s": max(latencies),
            "latencies_s": [round(x, 4) for x in latencies],
            "changed": changed,
            "breakdown": latency_breakdown(self.operator_entries(), changed),
        }

    def _restart(self, kubeconfig: Path) -> tuple[dict[str, Any], OperatorProcess, Sampler]:
        _log("restart: starting the operator again over the existing services")
        wall0, started = time.time(), time.monotonic()
        op, sampler = self.start_operator(kubeconfig, self.workdir / "operator-restart.log")
        healthy = time.monotonic()

        def passes() -> float:
            return op.metrics().get("pdfleet_reconcile_duration_seconds_count", 0)

        limit = self.restart_timeout_s or self.timeout_s
        resumed: float | None = None
        try:
            poll_until(lambda: passes() >= self.services, limit, "a pass over every service",
                       interval_s=0.2)  # fmt: skip
            resumed = time.monotonic() - started
        except TimeoutError:
            _log(f"restart: {passes():.0f} of {self.services} services reconciled in {limit:.0f}s")
        time.sleep(10)  # writes that a late pass might still make
        return (
            {
                "healthy_s": healthy - started,
                "resumed_s": resumed,
                "timeout_s": limit,
                "reconciled": int(passes()),
                **self._window(sampler, wall0, started),
            },
            op,
            sampler,
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="pdfleet-scale-"))
    audit_log = workdir / "audit.log"
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit_policy(OPERATOR_USER)))
    extra = [
        ("kube-apiserver", "audit-policy-file", str(policy)),
        ("kube-apiserver", "audit-log-path", str(audit_log)),
        # Every router Service takes a ClusterIP: the default range, a /24, holds 253.
        ("kube-apiserver", "service-cluster-ip-range", SERVICE_CIDR),
    ]
    for component, qps, burst in CLIENT_QPS:
        extra += [(component, "kube-api-qps", qps), (component, "kube-api-burst", burst)]
    nodes = scale_nodes(args.services)
    cfg = ClusterConfig(
        name="pdfleet-scale",
        workdir=workdir / "kwok",
        nodes=nodes,
        bridge_label=None,  # kwok runs every pod: Running and Ready at once
        extra_args=tuple(extra),
        start_timeout_s=300,
    )
    _log(f"starting the cluster ({len(nodes)} nodes) in {workdir}")
    cluster = start(cfg)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        apply_crds(cluster, api)
        kubeconfig = operator_kubeconfig(cluster, workdir)
        partial: dict[str, Any] = {"services": args.services, "workdir": str(workdir)}
        partial_file = args.out / "results.partial.json"
        args.out.mkdir(parents=True, exist_ok=True)

        def checkpoint(phase: str, figures: dict[str, Any]) -> None:
            partial[phase] = figures
            partial_file.write_text(json.dumps(partial, indent=2) + "\n")

        bench = Bench(
            cluster, api, workdir, args.services, args.workers, args.timeout_s, audit_log,
            checkpoint=checkpoint, restart_timeout_s=args.restart_timeout_s,
        )  # fmt: skip
        floor = bench.floor()
        checkpoint("floor", floor)
        operator = bench.operator_run(kubeconfig, args.steady_s, args.changes, args.settle_s)
    finally:
        api.close()
        stop(cluster)
    peak = operator.pop("peak_rss_mb")
    results = {
        "services": args.services,
        "pods_per_service": PODS_PER_SERVICE,
        "children": floor["children"],
        "nodes": {"gpu": sum(1 for n in nodes if n.gpu_product), "cpu": sum(
            1 for n in nodes if not n.gpu_product)},
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, shared with other test runs",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "floor": floor,
        "operator": operator,
        "convergence_ratio": operator["create"]["ready_s"] / floor["ready_s"],
        "peak_rss_mb": peak,
    }  # fmt: skip
    results["targets"] = targets(results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.benchmarks.bench_scale", description=__doc__
    )
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--steady-s", type=float, default=300.0)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--restart-timeout-s", type=float, default=None,
                        help="how long the restart may take (default: --timeout-s)")  # fmt: skip
    parser.add_argument("--settle-s", type=float, default=15.0,
                        help="wait after convergence before a quiet window starts")  # fmt: skip
    parser.add_argument("--workers", type=int, default=WRITES_IN_FLIGHT,
                        help="client threads: the operator's child writes in flight")  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    results = run(args)
    table = render_table(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "table.md").write_text(table)
    (args.out / "results.partial.json").unlink(missing_ok=True)
    print(table)
    return 0 if all(t["met"] for t in results["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
