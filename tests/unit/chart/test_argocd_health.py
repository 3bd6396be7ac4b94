"""The Argo CD health check (charts/pdfleet/argocd/health.lua), run by a real Lua 5.1
interpreter (Argo CD's gopher-lua implements 5.1) on status objects the operator's own status
code computes: Ready, Progressing, Stalled (capacity and invalid spec), stale generation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51  # type: ignore[import-untyped]
import pytest

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.observed import ChildRef, Observed, PodInfo
from pdfleet.reconcile.status import compute_status, invalid_status
from tests.spec_cases import ROOT, sample

HEALTH_LUA = ROOT / "charts" / "pdfleet" / "argocd" / "health.lua"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DESIRED = {"prefill": 1, "decode": 1}
GENERATION = 3


def run_health_check(obj: dict[str, Any], script: Path = HEALTH_LUA) -> dict[str, str]:
    """Evaluate the health script as Argo CD does: `obj` is a global, the script returns hs."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = runtime.table_from(obj, recursive=True)
    result = runtime.execute(script.read_text())
    return {str(key): str(value) for key, value in result.items()}


def _service() -> InferenceService:
    obj = sample("minimal")
    obj["metadata"].update(namespace="ns", uid="u1", generation=GENERATION)
    return InferenceService.model_validate(obj)


def _pod(role: str, **fields: Any) -> PodInfo:
    values: dict[str, Any] = {"phase": "Running", "ready": True, **fields}
    return PodInfo(name=f"llama-8b-{role}-0", role=role, ordinal=0, **values)


def _observed(pods: list[PodInfo]) -> Observed:
    children = {
        ("StatefulSet", f"llama-8b-{role}"): ChildRef(
            kind="StatefulSet", name=f"llama-8b-{role}", applied_hash="h", replicas=1,
            updated_replicas=1, generation=1, observed_generation=1,
        )
        for role in ("prefill", "decode")
    }  # fmt: skip
    children[("Deployment", "llama-8b-router")] = ChildRef(
        kind="Deployment", name="llama-8b-router", applied_hash="h", replicas=1,
        available_replicas=1,
    )  # fmt: skip
    return Observed(children=children, pods=tuple(pods))


def _object(status: dict[str, Any] | None, generation: int = GENERATION) -> dict[str, Any]:
    obj = sample("minimal")
    obj["metadata"].update(namespace="ns", generation=generation)
    if status is not None:
        obj["status"] = status
    return obj


def _unschedulable(age_s: float) -> PodInfo:
    since = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _pod(
        "decode", phase="Pending", ready=False, unready_since=since,
        unschedulable="0/5 nodes are available: 5 Insufficient nvidia.com/gpu.",
    )  # fmt: skip


READY = [_pod("prefill"), _pod("decode")]
STARTING = [_pod("prefill"), _pod("decode", ready=False)]


def _status(pods: list[PodInfo], writes: int = 0) -> dict[str, Any]:
    return compute_status(_service(), _observed(pods), None, DESIRED, NOW, writes)


@pytest.mark.parametrize(
    ("status", "generation", "health", "message"),
    [
        pytest.param(_status(READY), GENERATION, "Healthy", "Serving", id="ready"),
        pytest.param(_status(STARTING), GENERATION, "Progressing", "Progressing", id="starting"),
        pytest.param(_status(READY, writes=3), GENERATION, "Progressing", "", id="just-applied"),
        pytest.param(
            _status([_pod("prefill"), _unschedulable(10)]), GENERATION, "Progressing", "",
            id="unschedulable-briefly",
        ),
        pytest.param(
            _status([_pod("prefill"), _unschedulable(600)]), GENERATION, "Degraded",
            "Insufficient nvidia.com/gpu", id="stalled-capacity",
        ),
        pytest.param(
            invalid_status(None, GENERATION, "spec.decode.replicas: bad", NOW), GENERATION,
            "Degraded", "InvalidSpec: spec.decode.replicas: bad", id="stalled-invalid-spec",
        ),
        pytest.param(
            _status(READY), GENERATION + 1, "Progressing", "observe generation 4",
            id="stale-generation",
        ),
        pytest.param(None, GENERATION, "Progressing", "report status", id="no-status-yet"),
    ],
)  # fmt: skip
def test_health(status: dict[str, Any] | None, generation: int, health: str, message: str) -> None:
    result = run_health_check(_object(status, generation))
    assert result["status"] == health
    assert message in result["message"]


def test_status_without_observed_generation_is_progressing() -> None:
    status = _status(READY)
    del status["observedGeneration"]
    assert run_health_check(_object(status))["status"] == "Progressing"


def test_script_is_plain_lua_5_1() -> None:
    """gopher-lua has no goto, integer division or bit operators (5.2+ syntax)."""
    text = HEALTH_LUA.read_text()
    for construct in ("goto ", "//", "::", "&", "<<"):
        assert construct not in text, construct
