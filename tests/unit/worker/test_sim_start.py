"""`start_sim` when the port it chose is taken before the simulator binds it: it starts again
on fresh ports instead of failing the test that asked for a simulator."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet_worker.sim import procs


def test_a_port_taken_before_the_simulator_binds_it_is_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        real = procs.free_port
        chosen: Iterator[int] = iter([busy, real(), real(), real()])
        monkeypatch.setattr(procs, "free_port", lambda host="127.0.0.1": next(chosen))
        sim = procs.start_sim(str(tmp_path), timeout_s=30.0)
        try:
            assert sim.port != busy
            assert "address already in use" in (tmp_path / f"sim-{busy}.log").read_text()
        finally:
            sim.stop()
