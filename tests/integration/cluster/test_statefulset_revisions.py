"""What revision-paired rollouts (docs/design/paired-rollouts.md) need from the StatefulSet
controller, held to the real kube-controller-manager: one StatefulSet runs two revisions of
its template side by side, a scale-up past `partition` adds pods of the new revision only,
and raising `ordinals.start` removes the oldest pods, the lowest ordinals, and nothing else.

The design was drawn from the API reference; the last test records where the reference
leaves it open: after `ordinals.start` moved, `partition` counts positions from the start,
not ordinals.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tests.integration.cluster.kube_helpers import wait_for

NAME = "pool"
SELECTOR = {"app": NAME}


def statefulset(image: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": replicas,
            "serviceName": NAME,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": SELECTOR},
            "template": _template(image),
        },
    }


def _template(image: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": SELECTOR},
        "spec": {"containers": [{"name": "engine", "image": image}]},
    }


def roll(apps: client.AppsV1Api, namespace: str, image: str, replicas: int, partition: int) -> None:
    """The new template, held back below position `partition`, and the pool's new size."""
    body = {
        "spec": {
            "replicas": replicas,
            "template": _template(image),
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
        }
    }
    apps.patch_namespaced_stateful_set(NAME, namespace, body)


def pods_by_image(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """Live pods: name -> image (pods being deleted left out)."""
    listed = core.list_namespaced_pod(namespace, label_selector=f"app={NAME}")
    pods: list[dict[str, Any]] = core.api_client.sanitize_for_serialization(listed)["items"]
    return {
        p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def status(apps: client.AppsV1Api, namespace: str) -> dict[str, Any]:
    found = apps.read_namespaced_stateful_set(NAME, namespace)
    serialized: dict[str, Any] = apps.api_client.sanitize_for_serialization(found)
    return dict(serialized.get("status") or {})


def settled(
    core: client.CoreV1Api, namespace: str, expected: dict[str, str]
) -> dict[str, str] | None:
    found = pods_by_image(core, namespace)
    return found if found == expected else None


def test_one_statefulset_serves_two_revisions_and_retires_the_old_one(
    api_client: Any, namespace: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_stateful_set(
        namespace, client.V1StatefulSet.model_validate(statefulset("engine:1", 2))
    )
    wait_for(
        lambda: settled(core, namespace, {"pool-0": "engine:1", "pool-1": "engine:1"}),
        60,
        "two pods of revision 1",
    )

    # Surge: two more pods, of the new revision; the old ones are untouched.
    roll(apps, namespace, "engine:2", replicas=4, partition=2)
    surge = {"pool-0": "engine:1", "pool-1": "engine:1", "pool-2": "engine:2", "pool-3": "engine:2"}
    wait_for(lambda: settled(core, namespace, surge), 60, "revision 2 beside revision 1")
    surged = status(apps, namespace)
    assert surged["currentRevision"] != surged["updateRevision"]
    assert (surged["currentReplicas"], surged["updatedReplicas"]) == (2, 2)

    # Retire: the start moves past the old pods, which go; the new ones stay as they are.
    apps.patch_namespaced_stateful_set(
        NAME, namespace, {"spec": {"replicas": 2, "ordinals": {"start": 2}}}
    )
    retired = {"pool-2": "engine:2", "pool-3": "engine:2"}
    wait_for(lambda: settled(core, namespace, retired), 60, "only revision 2 left")
    current = wait_for(
        lambda: (s := status(apps, namespace))["currentRevision"] == s["updateRevision"] and s,
        60,
        "revision 2 current",
    )
    assert current["replicas"] == 2

    # The next rollout from the moved start: `partition` is a position (2 = the third pod),
    # not an ordinal (2 would be every pod).
    roll(apps, namespace, "engine:3", replicas=4, partition=2)
    wait_for(
        lambda: settled(core, namespace, {**retired, "pool-4": "engine:3", "pool-5": "engine:3"}),
        60,
        "revision 3 beside revision 2, at positions 2 and 3",
    )
