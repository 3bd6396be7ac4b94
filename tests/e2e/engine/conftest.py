"""Fixtures for the real-engine tier: real vLLM (its CPU build) on the local cluster.

* ``bridge_cluster``, ``api_client`` (session): from tests/e2e/support.py;
* ``engine`` (session): the engine install of e2e/platform/engine.sh (`make engine`);
* ``prometheus`` (session): Prometheus discovering the pods with the shipped scrape config;
* ``service`` (session): one prefill and two decode pods of real vLLM behind the real
  vllm-router, reconciled by a real ``pdfleet operator run``, Ready. One for the whole tier:
  engines take minutes to start, so every test waits for the pools it needs instead;
* ``pace`` (session): how fast those engines answer today, from which every wait for an
  engine's answer is derived.

A failed test's report carries the Python stacks of every vLLM process (py-spy).

Every test here is marked ``e2e``. Run them inside the private network namespace:
``e2e/platform/netns.sh .venv/bin/pytest tests/e2e/engine``. A missing engine, toolchain or
namespace is a failure, never a skip."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.cluster import Cluster
from e2e.platform.prometheus import Prometheus, start_for_cluster
from e2e.platform.real_engine import (
    EngineMissingError,
    Pace,
    deployed_engine_service,
    engine_root,
    engine_stacks,
    measure_pace,
)
from e2e.platform.service import Service
from tests.e2e.support import api_client, bridge_cluster, mark_folder

__all__ = ["api_client", "bridge_cluster"]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``e2e``."""
    mark_folder(items, HERE, pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test reports where every vLLM process stood: an engine that stalls on this
    machine does so rarely, and its stacks are the evidence the logs lack."""
    report = yield
    if report.when == "call" and report.failed:
        report.sections.append(("vLLM processes at the failure", engine_stacks()))
    return report


@pytest.fixture(scope="session")
def engine() -> Path:
    try:
        return engine_root()
    except EngineMissingError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def prometheus(
    bridge_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    prom = start_for_cluster(bridge_cluster, tmp_path_factory.mktemp("prometheus"))
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="session")
def service(
    bridge_cluster: Cluster,
    api_client: Any,
    engine: Path,
    prometheus: Prometheus,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    # Engines starting on the same two cores can keep the API server from answering the
    # controller-manager's and the scheduler's lease renewals in time, and they then exit on
    # purpose; a control-plane node's supervisor (systemd, kubelet) starts them again.
    bridge_cluster.supervise()
    log_dir = tmp_path_factory.mktemp("engine")
    with deployed_engine_service(
        bridge_cluster, api_client, log_dir, engine, prometheus.url
    ) as svc:
        yield svc
    print(f"control-plane components started again: {bridge_cluster.component_restarts()}")


@pytest.fixture(scope="session")
def pace(service: Service) -> Pace:
    measured = measure_pace(service)
    print(f"engine pace: {measured}")
    return measured
