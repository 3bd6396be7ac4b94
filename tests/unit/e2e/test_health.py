"""e2e/platform/health.py: docs/gitops.md's health table as the tests read it, which of its rows
a status is in, and the kstatus program's path and output (a stand-in program here; the real
one runs in tests/integration/cluster/test_kstatus.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from e2e.platform.health import (
    CURRENT,
    GITOPS_DOC,
    PROGRESSING,
    SERVING_WHILE_RECONCILING,
    STALE,
    STALLED,
    STATES,
    TABLE_HEADER,
    Health,
    health_table,
    kstatus,
    kstatus_binary,
    parse_kstatus_output,
    table_state,
)
from e2e.platform.tools import ToolMissingError


def _obj(generation: int, status: dict[str, Any] | None, **conditions: str) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "llama-8b", "generation": generation}}
    if status is not None:
        listed = [{"type": kind, "status": value} for kind, value in conditions.items()]
        obj["status"] = {**status, "conditions": listed}
    return obj


def test_the_page_lists_every_state_in_order() -> None:
    table = health_table(GITOPS_DOC.read_text())
    assert tuple(table) == STATES
    assert set(table.values()) <= {
        (kstatus_, argocd)
        for kstatus_ in ("InProgress", "Current", "Failed")
        for argocd in ("Progressing", "Healthy", "Degraded")
    }


def test_a_table_is_read_to_its_last_row() -> None:
    text = f"intro\n\n{TABLE_HEADER}\n|---|---|---|---|\n| `A` | Current | Healthy | a \n\nafter |"
    assert health_table(text) == {"`A`": ("Current", "Healthy")}


@pytest.mark.parametrize(
    "text",
    ["no table here", f"{TABLE_HEADER}\n|---|---|---|---|\n| `A` | Current | Healthy |"],
    ids=["missing", "three-cells"],
)
def test_a_table_it_cannot_read_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        health_table(text)


@pytest.mark.parametrize(
    ("obj", "state"),
    [
        pytest.param(_obj(1, None), STALE, id="no-status"),
        pytest.param(_obj(1, {"observedGeneration": 0}), STALE, id="crd-default"),
        pytest.param(_obj(2, {"observedGeneration": 1}, Ready="True"), STALE, id="new-spec"),
        pytest.param(
            _obj(2, {"observedGeneration": 1}, Stalled="True"), STALE, id="stalled-old-spec"
        ),
        pytest.param(
            _obj(1, {"observedGeneration": 1}, Ready="False", Reconciling="False", Stalled="True"),
            STALLED,
            id="stalled",
        ),
        pytest.param(
            _obj(1, {"observedGeneration": 1}, Ready="False", Reconciling="True", Stalled="False"),
            PROGRESSING,
            id="progressing",
        ),
        pytest.param(
            _obj(3, {"observedGeneration": 3}, Ready="True", Reconciling="True"),
            SERVING_WHILE_RECONCILING,
            id="serving-while-draining",
        ),
        pytest.param(
            _obj(3, {"observedGeneration": 3}, Ready="True", Reconciling="False"),
            CURRENT,
            id="current",
        ),
        pytest.param(_obj(3, {"observedGeneration": 3}, Ready="True"), CURRENT, id="ready-only"),
        pytest.param(
            _obj(1, {"observedGeneration": 1}, Ready="False", Reconciling="False"),
            None,
            id="no-row",
        ),
    ],
)  # fmt: skip
def test_table_state(obj: dict[str, Any], state: str | None) -> None:
    assert table_state(obj) == state


def test_kstatus_output() -> None:
    line = '{"status": "Failed", "message": "pod llama-8b-decode-0: ..."}\n'
    assert parse_kstatus_output(line) == Health("Failed", "pod llama-8b-decode-0: ...")
    with pytest.raises(ValueError):
        parse_kstatus_output('{"message": "no status"}')


def _program(path: Path, script: str) -> Path:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_kstatus_runs_the_program_on_the_object(tmp_path: Path) -> None:
    received = tmp_path / "received.json"
    answer = '{"status": "Current", "message": "Resource is Ready"}'
    program = _program(tmp_path / "kstatus", f"cat > {received}; echo '{answer}'")
    obj = {"kind": "InferenceService", "metadata": {"generation": 2}}
    assert kstatus(obj, program) == Health("Current", "Resource is Ready")
    assert json.loads(received.read_text()) == obj
    failing = _program(tmp_path / "failing", "echo 'kstatus: bad object' >&2; exit 1")
    with pytest.raises(RuntimeError, match="bad object"):
        kstatus({}, failing)


def test_the_makefile_names_the_program_and_a_missing_one_says_how_to_build_it(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("PDFLEET_KSTATUS", None)
    with pytest.raises(ToolMissingError) as missing:
        kstatus_binary(env)
    message = str(missing.value)
    assert f"{tmp_path}/pdfleet/tools/kstatus-" in message and "run `make kstatus`" in message

    built = tmp_path / "pdfleet" / "tools" / message.split("/tools/")[1].split("/")[0]
    built.mkdir(parents=True)
    program = _program(built / "kstatus", "exit 0")
    assert kstatus_binary(env) == program
    assert kstatus_binary({"PDFLEET_KSTATUS": str(program)}) == program
