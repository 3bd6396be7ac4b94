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


def test_a_vllm_process_is_reported_with_its_python_stack(
    stand_in: subprocess.Popen[bytes],
) -> None:
    report = engine_stacks()
    ours = report.split(f"--- pid {stand_in.pid}:", 1)
    assert len(ours) == 2, report
    assert "<module> (<string>:2)" in ours[1].split("\n--- pid", 1)[0], report


def test_a_stack_that_cannot_be_read_is_reported_not_raised(
    stand_in: subprocess.Popen[bytes],
) -> None:
    report = engine_stacks(py_spy="/nonexistent/py-spy")
    ours = report.split(f"--- pid {stand_in.pid}:", 1)[1].split("\n--- pid", 1)[0]
    assert "py-spy failed" in ours, report
