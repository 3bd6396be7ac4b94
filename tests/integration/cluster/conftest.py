"""Fixtures for tests against a real local control plane (see docs/testinfra.md).

* ``cluster``: one kwok cluster for the whole run (real etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler; fake GPU nodes), torn down at the end;
* ``api_client``: a ``kubernetes.client.ApiClient`` for it;
* ``crds``: every CustomResourceDefinition in ``crds/*.yaml``, applied and Established;
* ``namespace``: a fresh namespace per test, deleted afterwards.

Every test in this folder is marked ``integration``. These tests must run inside the
private network namespace: ``e2e/platform/netns.sh .venv/bin/pytest tests/integration/cluster``.
A missing toolchain or namespace is a failure, never a skip.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.platform.cluster import BRIDGE_LABEL, REPO_ROOT, Cluster, wait_until
from tests.e2e.support import kube_client, local_cluster

HERE = Path(__file__).resolve().parent
CRD_DIR = REPO_ROOT / "crds"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything collected from this folder as ``integration``."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's cluster: started once, stopped (and its state deleted) at the end."""
    with local_cluster(
        tmp_path_factory, "pdfleet-it", BRIDGE_LABEL, "tests/integration/cluster"
    ) as c:
        yield c


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` configured from the cluster's kubeconfig."""
    with kube_client(cluster) as api:
        yield api


def crd_files(directory: Path = CRD_DIR) -> list[Path]:
    """The CRD manifests shipped in ``crds/`` (samples live in a subfolder)."""
    return sorted(directory.glob("*.yaml"))


def crd_names(paths: list[Path]) -> list[str]:
    """``metadata.name`` of every CustomResourceDefinition document in ``paths``."""
    names: list[str] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    return names


def is_established(crd: client.V1CustomResourceDefinition) -> bool:
    """True when a V1CustomResourceDefinition reports Established=True."""
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


@pytest.fixture(scope="session")
def crds(cluster: Cluster, api_client: Any) -> list[str]:
    """Apply every ``crds/*.yaml`` and wait until each CRD is Established; their names."""
    files = crd_files()
    names = crd_names(files)
    if not names:
        pytest.fail(f"no CustomResourceDefinition found in {CRD_DIR}/*.yaml", pytrace=False)
    for path in files:
        cluster.apply(list(yaml.safe_load_all(path.read_text())))
    ext = client.ApiextensionsV1Api(api_client)

    def established(name: str) -> bool:
        return is_established(ext.read_custom_resource_definition(name))

    for name in names:
        wait_until(partial(established, name), 30, f"CRD {name} to be Established")
    return names


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount ready); deleted after the test."""
    core = client.CoreV1Api(api_client)
    name = f"it-{uuid.uuid4().hex[:10]}"
    core.create_namespace(
        client.V1Namespace.model_validate(
            {"metadata": {"name": name, "labels": {"pdfleet.dev/test": "true"}}}
        )
    )
    try:
        # kube-controller-manager creates it; pods are rejected until it exists.
        wait_until(
            lambda: (
                core.list_namespaced_service_account(
                    name, field_selector="metadata.name=default"
                ).items
            ),
            30,
            f"default ServiceAccount in {name}",
        )
        yield name
    finally:
        core.delete_namespace(name)
