"""A stuck pod is named at once (PodsStuck, one Event) and the service Stalled once it has not
been Ready for longer than spec.progressDeadline (reconcile/status.py), on a clock the tests
move by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.controller import Controller
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo
from pdfleet.reconcile.status import compute_status, condition_events, missing_networks
from tests.spec_cases import merge_patch, sample
from tests.unit.fakes import Writer

START = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
DESIRED = {"prefill": 1, "decode": 1}
BACK_OFF = ("ImagePullBackOff", 'container vllm: Back-off pulling image "worker:nope"')
CRASH = ("CrashLoopBackOff", "container vllm exited with OOMKilled (exit code 137)")
PVC = '0/4 nodes are available: persistentvolumeclaim "models" not found.'
NO_GPUS = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
FABRIC = {"kvTransfer": {"fabric": {"rdmaResource": "rdma/ib", "networks": ["ib-rdma-net"]}}}


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _service(**spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = merge_patch(sample("minimal"), {"spec": spec})
    obj["metadata"].update(namespace="serving", uid="u1", generation=1)
    return obj


def _isvc(**spec: Any) -> InferenceService:
    return InferenceService.model_validate(_service(**spec))


def _pod(role: str = "decode", ready: bool = False, **fields: Any) -> PodInfo:
    values: dict[str, Any] = {"phase": "Running" if ready else "Pending", "ready": ready}
    if not ready:
        values["unready_since"] = _stamp(START)
    return PodInfo(name=f"llama-8b-{role}-0", role=role, ordinal=0, **(values | fields))


def _observed(*pods: PodInfo, networks: frozenset[str] | None = None) -> Observed:
    children = {
        ("StatefulSet", f"llama-8b-{role}"): ChildRef(
            "StatefulSet", f"llama-8b-{role}", "h", replicas=1, generation=1
        )
        for role in DESIRED
    }
    children[("Deployment", "llama-8b-router")] = ChildRef(
        "Deployment", "llama-8b-router", "h", replicas=1, available_replicas=1
    )
    return Observed(children=children, pods=pods, networks=networks)


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


class Service:
    """One service's passes: each status computed from the one before, as the controller
    does, with the Events each pass records."""

    def __init__(self, isvc: InferenceService) -> None:
        self.isvc = isvc
        self.status: dict[str, Any] | None = None
        self.events: list[tuple[str, str]] = []

    def at(self, minutes: float, *pods: PodInfo, **observed: Any) -> dict[str, tuple[str, ...]]:
        now = START + timedelta(minutes=minutes)
        new = compute_status(self.isvc, _observed(*pods, **observed), self.status, DESIRED, now, 0)
        self.events += condition_events(self.status, new)
        self.status = new
        return {k: v[:2] for k, v in _conditions(new).items()}

    def message(self, kind: str) -> str:
        assert self.status is not None
        return _conditions(self.status)[kind][2]


def test_a_pull_that_keeps_failing_is_named_then_stalls_after_the_deadline() -> None:
    service = Service(_isvc())
    prefill = _pod("prefill", ready=True)
    conditions = service.at(1, prefill, _pod(stuck=BACK_OFF))
    assert conditions["PodsStuck"] == ("True", "ImagePullBackOff")
    assert service.message("PodsStuck") == (
        'pod llama-8b-decode-0: container vllm: Back-off pulling image "worker:nope"'
    )
    assert conditions["Ready"] == ("False", "PodsStuck")
    assert conditions["Reconciling"] == ("True", "Progressing")
    assert conditions["Stalled"] == ("False", "Progressing")
    assert conditions["InsufficientCapacity"] == ("False", "AllPodsScheduled")
    assert service.events == [("ImagePullBackOff", service.message("PodsStuck"))]

    # Passes while nothing changes (pod events, resyncs): no new Event.
    for minute in (2, 5, 9.9):
        assert service.at(minute, prefill, _pod(stuck=BACK_OFF))["Stalled"][0] == "False"
    assert len(service.events) == 1

    conditions = service.at(10, prefill, _pod(stuck=BACK_OFF))
    assert conditions["Stalled"] == ("True", "ImagePullBackOff")
    assert conditions["Reconciling"] == ("False", "Stalled")
    assert service.message("Stalled") == (
        service.message("PodsStuck") + " (not Ready for more than spec.progressDeadline 10m)"
    )
    assert service.events[1:] == [("ProgressDeadlineExceeded", service.message("Stalled"))]

    conditions = service.at(11, prefill, _pod(ready=True))  # the image was pushed
    assert conditions["PodsStuck"] == ("False", "NoPodStuck")
    assert conditions["Stalled"] == ("False", "Reconciled")
    assert conditions["Ready"] == ("True", "Serving")
    assert len(service.events) == 2


def test_another_cause_is_news_and_the_deadline_is_the_spec_s() -> None:
    service = Service(_isvc(progressDeadline="90s"))
    service.at(0.5, _pod("prefill", ready=True), _pod(stuck=BACK_OFF))
    conditions = service.at(1, _pod("prefill", ready=True), _pod(stuck=CRASH))
    assert conditions["PodsStuck"] == ("True", "CrashLoopBackOff")
    assert conditions["Stalled"][0] == "False"
    assert [reason for reason, _ in service.events] == ["ImagePullBackOff", "CrashLoopBackOff"]
    assert service.at(1.5, _pod("prefill", ready=True), _pod(stuck=CRASH))["Stalled"] == (
        "True", "CrashLoopBackOff",
    )  # fmt: skip
    assert "spec.progressDeadline 90s" in service.message("Stalled")


def test_a_missing_claim_is_a_stuck_pod_not_a_lack_of_capacity() -> None:
    service = Service(_isvc())
    pod = _pod(unschedulable=PVC, stuck=("VolumeUnavailable", PVC))
    conditions = service.at(1, _pod("prefill", ready=True), pod)
    assert conditions["InsufficientCapacity"] == ("False", "AllPodsScheduled")
    assert conditions["PodsStuck"] == ("True", "VolumeUnavailable")
    assert service.message("PodsStuck") == f"pod llama-8b-decode-0: {PVC}"
    assert service.at(10, _pod("prefill", ready=True), pod)["Stalled"] == (
        "True", "VolumeUnavailable",
    )  # fmt: skip


def test_too_few_gpus_waits_the_same_deadline_for_a_cluster_autoscaler() -> None:
    service = Service(_isvc())
    pod = _pod(unschedulable=NO_GPUS)
    conditions = service.at(5, _pod("prefill", ready=True), pod)
    assert conditions["InsufficientCapacity"] == ("True", "Unschedulable")
    assert conditions["PodsStuck"][0] == "False" and conditions["Stalled"][0] == "False"
    assert conditions["Ready"] == ("False", "InsufficientCapacity")
    assert service.at(10, _pod("prefill", ready=True), pod)["Stalled"] == (
        "True", "InsufficientCapacity",
    )  # fmt: skip
    assert NO_GPUS in service.message("Stalled")
    assert [reason for reason, _ in service.events] == [
        "InsufficientCapacity", "ProgressDeadlineExceeded",
    ]  # fmt: skip


def test_a_pod_that_makes_no_progress_without_a_named_cause_stalls_naming_it() -> None:
    service = Service(_isvc())
    creating = _pod()  # ContainerCreating: e.g. a volume kubelet cannot mount
    assert service.at(9, _pod("prefill", ready=True), creating)["Stalled"][0] == "False"
    conditions = service.at(10, _pod("prefill", ready=True), creating)
    assert conditions["Stalled"] == ("True", "ProgressDeadlineExceeded")
    assert conditions["PodsStuck"] == ("False", "NoPodStuck")
    assert service.message("Stalled").startswith(
        "pod llama-8b-decode-0: Pending and not Ready; its Events say why"
    )


def test_the_named_cause_wins_over_capacity_and_terminating_pods_do_not_count() -> None:
    service = Service(_isvc())
    pods = (
        PodInfo("llama-8b-decode-0", "decode", 0, "Pending", False, unschedulable=NO_GPUS,
                unready_since=_stamp(START)),
        PodInfo("llama-8b-decode-1", "decode", 1, "Pending", False, stuck=BACK_OFF,
                unready_since=_stamp(START)),
        PodInfo("llama-8b-prefill-0", "prefill", 0, "Running", False, terminating=True,
                stuck=CRASH, unready_since=_stamp(START)),
    )  # fmt: skip
    conditions = service.at(10, _pod("prefill", ready=True), *pods)
    assert conditions["Stalled"] == ("True", "ImagePullBackOff")
    assert service.message("PodsStuck") == (
        'pod llama-8b-decode-1: container vllm: Back-off pulling image "worker:nope"'
    )


@pytest.mark.parametrize(
    ("networks", "missing"),
    [
        (None, []),  # no Multus CRD (or not listed yet): the operator cannot tell
        (frozenset(), ["ib-rdma-net"]),
        (frozenset({"other"}), ["ib-rdma-net"]),
        (frozenset({"ib-rdma-net"}), []),
    ],
)
def test_missing_networks(networks: frozenset[str] | None, missing: list[str]) -> None:
    assert missing_networks(_isvc(**FABRIC), networks) == missing
    assert missing_networks(_isvc(), frozenset()) == []  # no fabric, no network to check


def test_a_missing_network_is_named_while_workers_are_short_then_stalls_them() -> None:
    service = Service(_isvc(**FABRIC))
    missing = (
        "NetworkAttachmentDefinition serving/ib-rdma-net not found "
        "(spec.kvTransfer.fabric.networks): workers cannot attach it"
    )
    # Before the workers' pods exist, and while they say only ContainerCreating.
    assert service.at(0, networks=frozenset())["PodsStuck"] == ("True", "NetworkAttachmentMissing")
    assert service.message("PodsStuck") == missing
    router = PodInfo("llama-8b-router-0", "router", 0, "Pending", False)
    conditions = service.at(1, _pod("prefill"), router, networks=frozenset({"other"}))
    assert conditions["PodsStuck"] == ("True", "NetworkAttachmentMissing")
    assert service.events == [("NetworkAttachmentMissing", missing)]  # once
    assert service.at(10, _pod("prefill"), networks=frozenset())["Stalled"] == (
        "True", "NetworkAttachmentMissing",
    )  # fmt: skip
    assert service.message("Stalled").startswith(f"pod llama-8b-prefill-0: {missing} (")

    # Created: the workers start. A network missing under Ready workers stops no one yet.
    ready = (_pod("prefill", ready=True), _pod("decode", ready=True))
    assert service.at(11, *ready, networks=frozenset({"ib-rdma-net"}))["PodsStuck"][0] == "False"
    assert service.at(12, *ready, networks=frozenset())["PodsStuck"][0] == "False"
    # The operator cannot tell (no Multus CRD): nothing is said.
    assert service.at(13, _pod("prefill"), networks=None)["PodsStuck"][0] == "False"


def test_the_controller_records_one_event_per_new_cause() -> None:
    clock = [START + timedelta(minutes=1)]
    writer = Writer()
    controller = Controller(writer, clock=lambda: clock[0])
    body = _service()

    def events() -> list[str]:
        return [arg for call, arg in writer.calls if call == "event"]

    observed = _observed(_pod("prefill", ready=True), _pod(stuck=BACK_OFF))
    controller.reconcile(body, observed)
    assert "ImagePullBackOff" in events()
    body["status"] = writer.last_status
    for minutes in (2, 3):
        clock[0] = START + timedelta(minutes=minutes)
        controller.reconcile(body, observed)
    assert events().count("ImagePullBackOff") == 1
    clock[0] = START + timedelta(minutes=10)
    controller.reconcile(body, observed)
    assert events().count("ProgressDeadlineExceeded") == 1
    assert writer.last_status["conditions"][2]["reason"] == "ImagePullBackOff"  # Stalled
