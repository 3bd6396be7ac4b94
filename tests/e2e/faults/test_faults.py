"""The fault suite, short: each fault of e2e/scenarios/faults.py a few times (the command runs the
full repetitions and writes docs/benchmarks/faults). Every run must converge with nothing lost that
the fault did not necessarily cost; the figures are printed (-s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.platform.cluster import Cluster
from e2e.platform.service import Service
from e2e.scenarios.faults import (
    PROMETHEUS_FAULTS,
    Outcome,
    apiserver_restart,
    conflicts_and_throttling,
    operator_sigkill,
    prometheus_faults,
    router_killed,
    table,
    worker_killed,
)

pytestmark = pytest.mark.timeout(900)


def check(outcome: Outcome, runs: int) -> None:
    print(table([outcome]), outcome.figures)
    assert outcome.runs >= runs, outcome
    assert outcome.failures == 0, outcome.problems


def test_operator_sigkill_at_random_points_converges(
    control_plane: Cluster, cp_api: Any, tmp_path: Path
) -> None:
    outcome = operator_sigkill(control_plane, cp_api, tmp_path, reconciles_target=40)
    check(outcome, 1)
    assert outcome.figures["reconciles"] >= 40


def test_conflicts_and_throttling_converge_without_a_hot_loop(
    control_plane: Cluster, cp_api: Any, tmp_path: Path
) -> None:
    outcome = conflicts_and_throttling(control_plane, cp_api, tmp_path, runs=2)
    check(outcome, 2)
    injected = outcome.figures["injected"]
    assert injected.get(409) and injected.get(429), injected


def test_etcd_and_apiserver_crash_the_service_is_reconciled_and_ready_again(
    control_plane: Cluster, cp_api: Any, tmp_path: Path
) -> None:
    check(apiserver_restart(control_plane, cp_api, tmp_path, runs=2), 2)


def test_router_killed_under_load_nothing_fails_once_it_is_back(fleet: Service) -> None:
    outcome = router_killed(fleet, runs=1)
    check(outcome, 1)
    assert outcome.requests


def test_worker_killed_mid_stream_nothing_fails_once_the_router_noticed(fleet: Service) -> None:
    outcome = worker_killed(fleet, runs=1)
    check(outcome, 1)
    assert outcome.requests


def test_prometheus_down_nan_or_stale_the_autoscaler_holds_and_says_why(
    bridge_cluster: Cluster, fleet: Service, tmp_path: Path
) -> None:
    # It turns the autoscaler on; the `fleet` fixture turns it off again for the next test.
    outcomes = prometheus_faults(bridge_cluster, fleet, 1, tmp_path)
    print(table(outcomes))
    assert [o.fault for o in outcomes] == [row for row, _ in PROMETHEUS_FAULTS.values()]
    for outcome in outcomes:
        print(outcome.figures)
        (run,) = outcome.figures["runs"]
        assert run["warning_events"] >= 1 and run["desired_changes_during"] == 0, run
        assert run["requests"] > 0, run
    assert not [p for o in outcomes for p in o.problems], [o.problems for o in outcomes]
