"""Health as kstatus computes it, on a live InferenceService reconciled by the operator.

kstatus is the real library behind Flux's health checks (sigs.k8s.io/cli-utils, the program
e2e/platform/kstatus that `make kstatus` builds); the Argo CD side is the chart's health script.
At every reading both run on the same object the API server returned, and both must answer as
the row of docs/gitops.md's health table that the status is in (e2e/platform/health.py).

The service goes through creation (the operator stopped, then started), Ready, a spec change,
a scale-down (it serves while a worker drains: the one row on which the tools differ), a stall
(a decode worker no node can hold, past a short spec.progressDeadline) and its fix, and a
paired rollout that cannot place its new revision (serving, then Stalled) and its revert. The GitOps
helpers (the operator process, a server-side apply as Flux does it) are test_gitops.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.platform.cluster import Cluster
from e2e.platform.health import (
    CURRENT,
    GITOPS_DOC,
    PROGRESSING,
    SERVING_WHILE_RECONCILING,
    STALE,
    STALLED,
    Health,
    health_table,
    kstatus,
    kstatus_binary,
    table_state,
)
from e2e.platform.operator_process import OperatorProcess
from e2e.platform.tools import ToolMissingError
from tests.integration.cluster.kube_helpers import condition, get_isvc, wait_for
from tests.integration.cluster.test_gitops import NAME, apply
from tests.integration.cluster.test_gitops import operator as operator  # the fixture
from tests.spec_cases import merge_patch, sample
from tests.unit.chart.test_argocd_health import run_health_check

# Short enough to keep the test short, long enough that each state is seen for seconds.
DEADLINE = "15s"
DRAIN_TIMEOUT = "8s"


@pytest.fixture(scope="session")
def kstatus_program() -> Path:
    """Before the cluster starts: a missing program fails the test at once."""
    try:
        return kstatus_binary()
    except ToolMissingError as error:
        missing = str(error)
    pytest.fail(missing, pytrace=False)


@dataclass(frozen=True)
class Reading:
    state: str
    kstatus: Health
    argocd: dict[str, str]
    obj: dict[str, Any]


class Reader:
    """One GET of the service, both tools on what it returned, held to the table."""

    def __init__(self, api: Any, namespace: str, program: Path) -> None:
        self.api, self.namespace, self.program = api, namespace, program
        self.table = health_table(GITOPS_DOC.read_text())

    def read(self) -> Reading:
        obj = get_isvc(self.api, self.namespace, NAME)
        state = table_state(obj)
        conditions = [
            (c["type"], c["status"], c["reason"]) for c in obj["status"].get("conditions", [])
        ]
        where = (
            f"generation {obj['metadata']['generation']}, observedGeneration "
            f"{obj['status'].get('observedGeneration')}, conditions {conditions}"
        )
        assert state is not None, f"no row of the health table describes this status: {where}"
        ks, argocd = kstatus(obj, self.program), run_health_check(obj)
        assert (ks.status, argocd["status"]) == self.table[state], (
            f"{state}: kstatus {ks}, Argo CD {argocd}; the table says {self.table[state]}; {where}"
        )
        return Reading(state, ks, argocd, obj)

    def until(
        self, done: Callable[[Reading], bool], timeout: float, what: str
    ) -> tuple[Reading, list[str]]:
        """Read until `done`; the last reading and the states seen on the way (in order,
        repeats dropped)."""
        seen: list[str] = []

        def reached() -> Reading | None:
            reading = self.read()
            if not seen or seen[-1] != reading.state:
                seen.append(reading.state)
            return reading if done(reading) else None

        return wait_for(reached, timeout, f"{what} (states so far: {seen})", 0.25), seen


def manifest(namespace: str, **spec: Any) -> dict[str, Any]:
    """The user's file: the minimal sample, drains that give up after DRAIN_TIMEOUT (kwok's
    pods run no engine and its router no router, so a drain always waits that long), and no
    KV preflight (nothing listens in kwok's pods: a paired rollout would wait for a proof
    that never comes)."""
    base = {
        "metadata": {"namespace": namespace},
        "spec": {
            "drain": {"timeout": DRAIN_TIMEOUT},
            "kvTransfer": {"preflight": {"enabled": False}},
        },
    }
    wanted: dict[str, Any] = merge_patch(merge_patch(sample("minimal"), base), {"spec": spec})
    return wanted


def recovered(apply_spec: Callable[..., None], reader: Reader, image: dict[str, Any]) -> Reading:
    """The fix is the spec as it was: Current again once the workers are back."""
    apply_spec(**image)
    ready, seen = reader.until(lambda r: r.state == CURRENT, 120, "Ready after the fix")
    assert STALLED not in seen[1:], seen
    assert ready.obj["metadata"]["generation"] == ready.obj["status"]["observedGeneration"]
    decode = ready.obj["status"]["decode"]
    assert (decode["ready"], decode["replicas"], decode["pending"]) == (1, 1, 0), decode
    assert ready.kstatus == Health("Current", "Resource is Ready")
    return ready


def test_kstatus_and_argocd_read_the_live_service_as_the_table_says(
    kstatus_program: Path,
    cluster: Cluster,
    api_client: Any,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    reader = Reader(api_client, namespace, kstatus_program)
    path = tmp_path / "isvc.yaml"

    def apply_spec(**spec: Any) -> None:
        path.write_text(yaml.safe_dump(manifest(namespace, **spec)))
        apply(cluster, path)

    def is_state(state: str) -> Callable[[Reading], bool]:
        return lambda reading: reading.state == state

    # Created while the operator is down: the CRD's default status says generation 1 is not
    # observed yet. Without it kstatus would read the object as Current. (SIGKILL: only the
    # operator's absence matters here, and a kill takes no time.)
    operator.kill()
    apply_spec()
    created = reader.read()
    assert created.state == STALE
    assert created.obj["status"] == {"observedGeneration": 0}
    assert created.kstatus == Health(
        "InProgress", "InferenceService generation is 1, but latest observed generation is 0"
    )

    operator.start().wait_healthy()
    ready, seen = reader.until(is_state(CURRENT), 90, "Ready at generation 1")
    assert set(seen) <= {STALE, PROGRESSING, CURRENT}, seen
    assert ready.kstatus == Health("Current", "Resource is Ready")

    # A spec change: InProgress until the operator has observed it, and while the workers roll
    # (a new image is a new KV revision: the old pods serve, Ready, until the new have taken over).
    operator.kill()
    image = {"engine": {"image": "example.com/worker:2"}}
    apply_spec(**image)
    stale = reader.read()
    assert stale.state == STALE and stale.obj["metadata"]["generation"] == 2
    assert stale.kstatus.message.endswith("generation is 2, but latest observed generation is 1")
    operator.start().wait_healthy()
    ready, seen = reader.until(is_state(CURRENT), 90, "Ready at generation 2")
    assert set(seen) <= {STALE, PROGRESSING, SERVING_WHILE_RECONCILING, CURRENT}, seen
    assert "rollout" not in ready.obj["status"], ready.obj["status"]

    # A scale-down: the pool serves with one decoder while the other drains. kstatus reads
    # Reconciling first (InProgress), Argo CD's script Ready first (Healthy).
    apply_spec(**image, decode={"replicas": {"min": 2, "max": 2}})
    reader.until(
        lambda r: r.state == CURRENT and r.obj["status"]["decode"]["ready"] == 2,
        90,
        "two Ready decoders",
    )
    apply_spec(**image)
    draining, _ = reader.until(is_state(SERVING_WHILE_RECONCILING), 60, "a decoder draining")
    decode = draining.obj["status"]["decode"]
    assert (decode["desired"], decode["replicas"]) == (1, 2), decode
    assert draining.kstatus.status == "InProgress" and draining.argocd["status"] == "Healthy"
    ready, seen = reader.until(is_state(CURRENT), 90, "Ready after the drain")
    assert set(seen) <= {SERVING_WHILE_RECONCILING, PROGRESSING, CURRENT}, seen
    assert ready.obj["status"]["decode"]["replicas"] == 1

    # A stall: decode workers no node can hold (a node label none has; not a KV change, so
    # the pool rolls in place). Before the deadline it is only reported
    # (InsufficientCapacity, InProgress); past it, Failed.
    nowhere = {"nodeSelector": {"example.com/no-such-pool": "true"}}
    apply_spec(**image, progressDeadline=DEADLINE, decode=nowhere)
    unplaced, _ = reader.until(
        lambda r: (
            r.state == PROGRESSING
            and condition(r.obj, "InsufficientCapacity").get("status") == "True"
        ),
        60,
        "InsufficientCapacity before the deadline",
    )
    assert unplaced.kstatus.status == "InProgress"
    stalled, seen = reader.until(is_state(STALLED), 90, "Stalled past the deadline")
    assert seen[-2:] == [PROGRESSING, STALLED], seen
    cause = condition(stalled.obj, "Stalled")
    assert cause["reason"] == "InsufficientCapacity"
    assert f"spec.progressDeadline {DEADLINE}" in cause["message"]
    assert stalled.kstatus == Health("Failed", cause["message"])
    assert stalled.argocd["status"] == "Degraded"
    recovered(apply_spec, reader, image)

    # A paired rollout that cannot place its new decode (16 GPUs, more than any node has):
    # the old revision serves (Ready, Reconciling: InProgress for kstatus, Healthy for Argo
    # CD) until the deadline, then the rollout is Stalled (Failed, Degraded).
    apply_spec(**image, progressDeadline=DEADLINE, decode={"parallelism": {"tensor": 8, "data": 2}})
    surging, _ = reader.until(
        lambda r: (
            r.state == SERVING_WHILE_RECONCILING
            and condition(r.obj, "InsufficientCapacity").get("status") == "True"
        ),
        60,
        "a rollout waiting for capacity while the old revision serves",
    )
    assert surging.obj["status"]["rollout"]["phase"] == "Surging"
    assert (surging.kstatus.status, surging.argocd["status"]) == ("InProgress", "Healthy")
    stalled, seen = reader.until(is_state(STALLED), 90, "the rollout Stalled past the deadline")
    cause = condition(stalled.obj, "Stalled")
    assert cause["reason"] == "RolloutStalled", cause
    assert stalled.kstatus == Health("Failed", cause["message"])
    assert stalled.argocd["status"] == "Degraded"
    ready = recovered(apply_spec, reader, image)
    assert "rollout" not in ready.obj["status"], ready.obj["status"]
