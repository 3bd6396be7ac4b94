"""Operator restarts and high availability: one active replica, convergence after SIGKILL."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.cluster import Cluster
from e2e.platform.operator_process import OperatorProcess
from pdfleet.kube.lease import LEASE_DURATION_S
from tests.integration.cluster.kube_helpers import create_isvc, list_children, wait_for, wait_ready
from tests.integration.cluster.test_reconciler import EXPECTED_CHILDREN
from tests.spec_cases import merge_patch, sample


@pytest.fixture
def operators(cluster: Cluster, crds: list[str], tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    """Two replicas competing for one Lease (unique per test), as a Deployment would run them."""
    lease = f"pdfleet-{uuid.uuid4().hex[:8]}"
    procs = [
        OperatorProcess(
            kubeconfig=cluster.kubeconfig,
            log_path=tmp_path / f"op-{i}.log",
            identity=f"op-{i}",
            resync_seconds=2.0,
            lease_name=lease,
        )
        for i in range(2)
    ]
    yield procs
    for proc in procs:
        proc.stop()


def _leader(procs: list[OperatorProcess]) -> OperatorProcess | None:
    leaders = [p for p in procs if p.metrics().get("pdfleet_leader") == 1]
    assert len(leaders) <= 1, "two active replicas"
    return leaders[0] if leaders else None


def test_sigkill_mid_reconcile_converges_without_duplicates_or_orphans(
    api_client: Any, namespace: str, operators: list[OperatorProcess]
) -> None:
    first = operators[0].start()
    first.wait_healthy()
    for i in range(3):
        create_isvc(
            api_client,
            namespace,
            merge_patch(sample("minimal"), {"metadata": {"name": f"svc-{i}"}}),
        )
    time.sleep(0.3)  # in the middle of the first passes
    first.kill()
    restarted = OperatorProcess(
        kubeconfig=first.kubeconfig,
        log_path=first.log_path,
        identity=first.identity,
        resync_seconds=2.0,
        lease_name=first.lease_name,
    )
    operators.append(restarted)
    # The killed holder's lease must expire before the restarted replica takes over.
    restarted.start().wait_healthy(timeout=60)
    for i in range(3):
        wait_ready(api_client, namespace, f"svc-{i}", timeout=90)
        children = list_children(api_client, namespace, f"svc-{i}")
        assert len(children) == EXPECTED_CHILDREN
        assert len({(c["kind"], c["metadata"]["name"]) for c in children}) == EXPECTED_CHILDREN


def test_one_active_replica_and_failover(
    api_client: Any, namespace: str, operators: list[OperatorProcess]
) -> None:
    for proc in operators:
        proc.start()
    leader = wait_for(lambda: _leader(operators), 30, "a leader")
    standby = next(p for p in operators if p is not leader)
    time.sleep(3)
    assert _leader(operators) is leader and standby.running()
    assert standby.metrics().get("pdfleet_leader") == 0, "a standby says it is not leading"
    assert standby.healthy(), "a standby is alive (liveness must not restart it)"
    assert standby.metrics().get("pdfleet_child_writes_total") == 0, "and writes nothing"

    leader.kill()
    started = time.monotonic()
    wait_for(lambda: _leader([standby]) is standby, 40, "the standby to take over")
    failover = time.monotonic() - started
    create_isvc(api_client, namespace, sample("minimal"))
    wait_ready(api_client, namespace, "llama-8b", timeout=60)
    assert list_children(api_client, namespace, "llama-8b")
    print(f"failover took {failover:.1f}s (lease duration 15s)")


#: The chart's terminationGracePeriodSeconds: past it the kubelet kills the operator.
CHART_GRACE_S = 30


def test_sigterm_ends_the_leader_and_hands_its_lease_over(
    operators: list[OperatorProcess],
) -> None:
    """A rolling upgrade of the operator: the old leader, sent SIGTERM, exits on its own
    well within the pod's grace period and releases the Lease, so the standby leads without
    waiting out the lease duration."""
    for proc in operators:
        proc.start()
    leader = wait_for(lambda: _leader(operators), 30, "a leader")
    standby = next(p for p in operators if p is not leader)
    wait_for(lambda: standby.healthy(), 30, "the standby to be up")
    assert leader.process is not None
    leader.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = leader.process.wait(timeout=CHART_GRACE_S)
    exited = time.monotonic() - started
    wait_for(lambda: _leader([standby]) is standby, 40, "the standby to take over")
    handover = time.monotonic() - started
    print(f"exited after {exited:.1f}s with {code}; standby leading after {handover:.1f}s")
    assert code == 0
    assert exited < CHART_GRACE_S / 3, "the operator lingers after SIGTERM"
    # Without a release the standby could only take an expired lease.
    assert handover < LEASE_DURATION_S, "the lease was not released"
