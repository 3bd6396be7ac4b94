"""Every way a pod can be stuck has a name: the pod projection (reconcile/observed.pod_info)
reads kubelet's container states and the scheduler's verdict, from pods as the API server
shows them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pdfleet.reconcile.observed import PodInfo, pod_info, volume_problem

CREATED = "2026-03-01T10:00:00Z"
STARTED = "2026-03-01T10:00:02Z"
IMAGE = "ghcr.io/pdfleet/worker:0.1.0-vllm0.33.0"

# A decode worker kubelet has started: scheduled, initialized, its container not ready yet.
STARTING: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "llama-8b-decode-0",
        "namespace": "serving",
        "creationTimestamp": CREATED,
        "labels": {"pdfleet.dev/service": "llama-8b", "pdfleet.dev/role": "decode"},
    },
    "spec": {"nodeName": "gpu-h200-0", "containers": [{"name": "vllm", "image": IMAGE}]},
    "status": {
        "phase": "Pending",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": STARTED},
            {"type": "Initialized", "status": "True", "lastTransitionTime": STARTED},
            {
                "type": "Ready", "status": "False", "lastTransitionTime": STARTED,
                "reason": "ContainersNotReady", "message": "containers with unready status: [vllm]",
            },
            {
                "type": "ContainersReady", "status": "False", "lastTransitionTime": STARTED,
                "reason": "ContainersNotReady", "message": "containers with unready status: [vllm]",
            },
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": CREATED},
        ],
        "hostIP": "10.0.0.5",
        "podIP": "10.244.1.7",
        "startTime": STARTED,
        "qosClass": "Guaranteed",
        "containerStatuses": [
            {
                "name": "vllm", "image": IMAGE, "imageID": "", "ready": False,
                "started": False, "restartCount": 0, "lastState": {},
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        ],
    },
}  # fmt: skip


def _pod(phase: str = "Pending", **container: Any) -> dict[str, Any]:
    """STARTING with its container status (and phase) replaced by what kubelet reports."""
    pod = copy.deepcopy(STARTING)
    pod["status"]["phase"] = phase
    pod["status"]["containerStatuses"][0].update(container)
    return pod


def _waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    waiting = {"reason": reason} | ({"message": message} if message else {})
    return {"waiting": waiting}


def _oom(finished: str) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": 137, "reason": "OOMKilled", "startedAt": STARTED,
            "finishedAt": finished, "containerID": "containerd://4f1c",
        }
    }  # fmt: skip


def _restarted(crashed: str, state: dict[str, Any]) -> dict[str, Any]:
    """A running pod whose container was OOM-killed at `crashed`, now in `state`."""
    return _pod("Running", restartCount=3, lastState=_oom(crashed), state=state)


OOM_LOOP = ("CrashLoopBackOff", "container vllm exited with OOMKilled (exit code 137)")


def _unschedulable(message: str) -> dict[str, Any]:
    pod = copy.deepcopy(STARTING)
    del pod["spec"]["nodeName"]
    pod["status"] = {
        "phase": "Pending",
        "qosClass": "Guaranteed",
        "conditions": [
            {
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": CREATED, "message": message,
            }
        ],
    }  # fmt: skip
    return pod


PULL_FAILED = (
    f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": '
    f"{IMAGE}: not found"
)
BACK_OFF = f'Back-off pulling image "{IMAGE}"'
PREEMPTION = " preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
PVC_MISSING = '0/4 nodes are available: persistentvolumeclaim "models" not found.' + PREEMPTION
UNBOUND = "0/4 nodes are available: pod has unbound immediate PersistentVolumeClaims." + PREEMPTION
NO_GPUS = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu." + PREEMPTION
MIXED = (
    "0/4 nodes are available: 1 node(s) had volume node affinity conflict, "
    "3 Insufficient nvidia.com/gpu." + PREEMPTION
)


@pytest.mark.parametrize(
    ("pod", "stuck"),
    [
        pytest.param(
            _pod(state=_waiting("ImagePullBackOff", BACK_OFF)),
            ("ImagePullBackOff", f"container vllm: {BACK_OFF}"),
            id="image-pull-back-off",
        ),
        pytest.param(
            # The state a failing pull alternates with: the same cause, named the same.
            _pod(state=_waiting("ErrImagePull", PULL_FAILED)),
            ("ImagePullBackOff", f"container vllm: {PULL_FAILED}"),
            id="err-image-pull",
        ),
        pytest.param(
            _pod(state=_waiting("InvalidImageName", 'Failed to apply default image tag "x:"')),
            ("InvalidImageName", 'container vllm: Failed to apply default image tag "x:"'),
            id="invalid-image-name",
        ),
        pytest.param(
            _pod(state=_waiting("CreateContainerConfigError", 'secret "hf-token" not found')),
            ("CreateContainerConfigError", 'container vllm: secret "hf-token" not found'),
            id="missing-secret",
        ),
        pytest.param(
            _pod(state=_waiting("CreateContainerError")),
            ("CreateContainerError", "container vllm: CreateContainerError"),
            id="create-container-error-without-message",
        ),
        pytest.param(_pod(), None, id="container-creating-is-progress"),
        pytest.param(_unschedulable(PVC_MISSING), ("VolumeUnavailable", PVC_MISSING), id="pvc"),
        pytest.param(_unschedulable(UNBOUND), ("VolumeUnavailable", UNBOUND), id="unbound-pvc"),
        pytest.param(_unschedulable(NO_GPUS), None, id="no-gpus-is-capacity"),
        pytest.param(_unschedulable(MIXED), None, id="gpus-or-volume-is-capacity"),
    ],
)  # fmt: skip
def test_each_stuck_state_is_named(pod: dict[str, Any], stuck: tuple[str, str] | None) -> None:
    info = pod_info(pod)
    assert info.stuck == stuck
    assert not info.ready


CRASHED = "2026-03-01T10:03:10Z"
RUNNING = {"running": {"startedAt": "2026-03-01T10:03:50Z"}}


@pytest.mark.parametrize(
    ("crashed", "state", "stuck"),
    [
        pytest.param(
            CRASHED, _waiting("CrashLoopBackOff", "back-off 40s restarting failed container"),
            OOM_LOOP, id="waiting-names-the-last-exit",
        ),
        # Just ended, before kubelet's back-off, or running again, not ready, between two
        # back-offs: the same crash loop, so the condition does not come and go.
        pytest.param(CRASHED, _oom("2026-03-01T10:04:00Z"), OOM_LOOP, id="just-ended"),
        pytest.param(CRASHED, RUNNING, OOM_LOOP, id="running-again"),
        # A crash from before the pod's current spell of not being Ready is history.
        pytest.param("2026-03-01T09:00:00Z", RUNNING, None, id="an-old-crash"),
    ],
)  # fmt: skip
def test_a_crash_loop_is_one_cause_through_its_states(
    crashed: str, state: dict[str, Any], stuck: tuple[str, str] | None
) -> None:
    assert pod_info(_restarted(crashed, state)).stuck == stuck


def test_a_failing_init_container_is_named_before_the_containers() -> None:
    pod = _pod("Pending", state=_waiting("PodInitializing"))
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "fetch-weights", "image": IMAGE, "ready": False, "restartCount": 2,
            "state": _waiting("CrashLoopBackOff", "back-off 20s restarting failed container"),
            "lastState": {
                "terminated": {
                    "exitCode": 1, "reason": "Error", "finishedAt": "2026-03-01T10:01:00Z",
                    "message": "401 Client Error: Unauthorized for url: https://huggingface.co/"
                    + "x" * 500,
                }
            },
        }
    ]  # fmt: skip
    reason, message = pod_info(pod).stuck or ("", "")
    assert reason == "CrashLoopBackOff"
    assert message.startswith(
        "container fetch-weights exited with Error (exit code 1): 401 Client Error"
    )
    assert len(message) < 300  # its last words, not all of them


def test_an_init_container_that_failed_once_and_completed_is_no_cause() -> None:
    pod = _pod("Pending", state=_waiting("PodInitializing"))
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "fetch-weights", "image": IMAGE, "ready": True, "restartCount": 1,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                     "finishedAt": "2026-03-01T10:02:00Z"}},
            "lastState": _oom("2026-03-01T10:01:00Z"),
        }
    ]  # fmt: skip
    assert pod_info(pod).stuck is None


def test_unschedulable_pods_keep_the_scheduler_message_and_only_capacity_lacks_capacity() -> None:
    volume, gpus = pod_info(_unschedulable(PVC_MISSING)), pod_info(_unschedulable(NO_GPUS))
    # Neither is capacity for the autoscaler, whatever the cause.
    assert volume.unschedulable == PVC_MISSING and gpus.unschedulable == NO_GPUS
    assert not volume.lacks_capacity and gpus.lacks_capacity
    assert volume.unready_since == gpus.unready_since == CREATED  # no kubelet has seen them


def test_not_ready_since_the_ready_transition_and_nothing_while_ready() -> None:
    assert pod_info(_pod(state=_waiting("ImagePullBackOff", BACK_OFF))).unready_since == STARTED
    pod = _pod("Running", ready=True, state={"running": {"startedAt": STARTED}})
    pod["status"]["conditions"][2].update(status="True", lastTransitionTime="2026-03-01T10:05:00Z")
    pod["status"]["containerStatuses"][0]["lastState"] = _oom("2026-03-01T10:03:10Z")
    info = pod_info(pod)
    assert info.ready and info.stuck is None and info.unready_since is None


def test_a_pod_no_kubelet_has_reported_is_not_ready_since_its_creation() -> None:
    pod = copy.deepcopy(STARTING)
    pod["status"] = {"phase": "Pending"}
    assert pod_info(pod) == PodInfo(
        name="llama-8b-decode-0", role="decode", ordinal=0, phase="Pending", ready=False,
        node="gpu-h200-0", unready_since=CREATED,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("message", "volume"),
    [
        (PVC_MISSING, True),
        (UNBOUND, True),
        ('persistentvolumeclaim "models" is being deleted', True),
        ("0/3 nodes are available: 3 node(s) didn't find available persistent volumes", True),
        ("0/3 nodes are available: 3 node(s) had volume node affinity conflict.", True),
        (MIXED, False),
        (NO_GPUS, False),
        ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.", False),
        ("0/1 nodes are available: 1 node(s) exceed max volume count.", False),
        ("", False),
    ],
)  # fmt: skip
def test_volume_problems_are_told_from_capacity(message: str, volume: bool) -> None:
    assert volume_problem(message) is volume
