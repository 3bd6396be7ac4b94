"""Pure helpers over pod and node JSON: IPs, times, exit and restart policy, status patches.

Where it fits: the pod worker (``worker``) asks these what kubelet would do (which IP, when to
SIGKILL, restart or end the pod) and what to write to ``pods/status``; the bridge (``bridge``)
asks which nodes are kwok's. No I/O: plain functions and values, unit-tested in
``tests/unit/e2e/test_bridge.py``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Manifest = dict[str, Any]

#: kwokctl's kwok controller manages nodes with this annotation (e2e/platform/cluster.py sets it).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


def pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_kwok_node(node: Mapping[str, Any]) -> bool:
    annotations = node.get("metadata", {}).get("annotations") or {}
    return KWOK_NODE_ANNOTATION in annotations


def node_pod_cidr(node: Mapping[str, Any]) -> str | None:
    spec = node.get("spec", {})
    cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    return str(cidrs[0]) if cidrs else None


def node_internal_ip(node: Mapping[str, Any]) -> str:
    for address in node.get("status", {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address["address"])
    return ""


def allocate_pod_ip(pod_cidr: str, used: set[str]) -> str:
    """The highest free host address of ``pod_cidr``.

    kwok's pool hands out addresses from the bottom of a node's podCIDR upwards (and reuses
    freed ones), so allocating from the top keeps the two apart until the range is full;
    ``used`` (every pod IP on the node) makes the choice collision-free and deterministic.
    """
    net = ipaddress.ip_network(pod_cidr)
    for host in reversed(list(net.hosts())):
        if str(host) not in used:
            return str(host)
    raise ValueError(f"no free address left in {pod_cidr}")


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (as the API server writes it) -> epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def grace_deadline(pod: Mapping[str, Any], now: float) -> float:
    """When kubelet would SIGKILL: ``deletionTimestamp`` is deletion start + grace period."""
    deleted = parse_time(pod.get("metadata", {}).get("deletionTimestamp"))
    return deleted if deleted is not None else now


def exit_action(restart_policy: str, exit_code: int) -> Literal["restart", "Succeeded", "Failed"]:
    """What kubelet does when a container exits on its own."""
    if restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0):
        return "restart"
    return "Succeeded" if exit_code == 0 else "Failed"


def exit_code(returncode: int) -> int:
    """A container's exit code as kubelet reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def restart_delay(restarts: int, base_s: float, max_s: float) -> float:
    """kubelet-style exponential back-off before restart number ``restarts + 1``."""
    return float(min(max_s, base_s * (2 ** min(restarts, 20))))


@dataclass(frozen=True)
class ContainerView:
    """What kubelet reports for one container; equal views mean no status write."""

    name: str
    image: str
    state: Literal["waiting", "running", "terminated"] = "waiting"
    reason: str = "ContainerCreating"
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    last_exit: tuple[int, float, float] | None = None  # exit code, started, finished
    container_id: str = ""
    message: str = ""  # why a waiting container is not running (CreateContainerConfigError)


def _state(
    kind: str,
    reason: str,
    code: int | None,
    started: float | None,
    fin: float | None,
    message: str = "",
) -> Manifest:
    if kind == "running":
        return {"running": {"startedAt": rfc3339(started or 0.0)}}
    if kind == "terminated":
        return {
            "terminated": {
                "exitCode": code or 0,
                "reason": reason,
                "startedAt": rfc3339(started or 0.0),
                "finishedAt": rfc3339(fin or 0.0),
            }
        }
    waiting = {"reason": reason} | ({"message": message} if message else {})
    return {"waiting": waiting}


def container_status(view: ContainerView) -> Manifest:
    """One ``status.containerStatuses`` entry."""
    status: Manifest = {
        "name": view.name,
        "image": view.image,
        "imageID": "",
        "containerID": view.container_id,
        "ready": view.ready,
        "started": view.started,
        "restartCount": view.restart_count,
        "state": _state(
            view.state, view.reason, view.exit_code, view.started_at, view.finished_at, view.message
        ),
    }
    if view.last_exit is not None:
        code, started, finished = view.last_exit
        reason = "Completed" if code == 0 else "Error"
        status["lastState"] = _state("terminated", reason, code, started, finished)
    return status


def pod_conditions(
    previous: Sequence[Mapping[str, Any]], ready: bool, now: float
) -> list[Manifest]:
    """The pod conditions kubelet owns; a transition time moves only when a status changes."""
    before = {str(c.get("type")): c for c in previous}
    wanted = {
        "PodScheduled": True,
        "PodReadyToStartContainers": True,
        "Initialized": True,
        "ContainersReady": ready,
        "Ready": ready,
    }
    out: list[Manifest] = []
    for ctype, value in wanted.items():
        status = "True" if value else "False"
        old = before.get(ctype)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        cond: Manifest = {
            "type": ctype,
            "status": status,
            "lastTransitionTime": since or rfc3339(now),
        }
        if not value:
            cond["reason"] = "ContainersNotReady"
        out.append(cond)
    return out


def pod_phase(views: Sequence[ContainerView], terminal: str | None) -> str:
    if terminal is not None:
        return terminal
    if any(v.state == "running" or v.restart_count > 0 for v in views):
        return "Running"
    return "Pending"


def status_patch(
    pod: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    views: Sequence[ContainerView],
    now: float,
    terminal: str | None = None,
) -> Manifest:
    """The strategic-merge patch of ``pods/status`` for the current container views.

    ``metadata.uid`` makes the write fail instead of landing on a newer pod of the same name
    (StatefulSet pods reuse names).
    """
    status = pod.get("status", {})
    ready = bool(views) and all(v.ready for v in views) and terminal is None
    body: Manifest = {
        "phase": pod_phase(views, terminal),
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": status.get("startTime") or rfc3339(now),
        "conditions": pod_conditions(status.get("conditions") or [], ready, now),
        "containerStatuses": [container_status(v) for v in views],
    }
    if host_ip:
        body |= {"hostIP": host_ip, "hostIPs": [{"ip": host_ip}]}
    return {"metadata": {"uid": pod["metadata"]["uid"]}, "status": body}


def ip_patch(pod: Mapping[str, Any], pod_ip: str, host_ip: str) -> Manifest:
    """Claim ``pod_ip`` for a pod kwok gave none; ``resourceVersion`` makes it conditional."""
    meta = pod["metadata"]
    return {
        "metadata": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
        "status": {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]}
        | ({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}]} if host_ip else {}),
    }
