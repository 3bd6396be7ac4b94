"""`e2e.platform.real_engine.engine_stacks`: what a failed real-engine test reports about the
vLLM processes, tried on a stand-in process that carries vLLM's process title."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from e2e.platform.real_engine import engine_stacks


@pytest.fixture
def stand_in() -> Iterator[subprocess.Popen[bytes]]:
    # a Python process whose command line carries what vLLM's workers show as their title
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)", "VLLM::Worker"]
    )
    time.sleep(0.5)  # past the interpreter's start, so there is a stack to read
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _entry_of(pid: int, report: str) -> str:
    """The part of `report` about process `pid` (empty when it has none)."""
    _, found, rest = report.partition(f"--- pid {pid}:")
    return rest.split("\n--- pid", 1)[0] if found else ""


def test_a_vllm_process_is_reported_with_its_python_stack(
    stand_in: subprocess.Popen[bytes],
) -> None:
    report = engine_stacks()
    assert "<module> (<string>:2)" in _entry_of(stand_in.pid, report), report


def test_a_stack_that_cannot_be_read_is_reported_not_raised(
    stand_in: subprocess.Popen[bytes],
) -> None:
    report = engine_stacks(py_spy="/nonexistent/py-spy")
    assert "py-spy failed" in _entry_of(stand_in.pid, report), report
