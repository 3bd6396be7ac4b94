"""Run `pdfleet operator run` as a real process against a local cluster, as users run it.

Used by the integration tests (restart, kill, leader election), the e2e scenarios and the
demo. Metrics and health endpoints are bound to loopback on free ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from e2e.platform.cluster import free_port

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {"name{labels}": value} (comments skipped)."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match:
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    resync_seconds: float = 5.0
    leader_election: bool = True
    identity: str = "op-0"
    lease_namespace: str = "kube-system"
    # Unique per process unless given: operators started by different tests on one cluster
    # must not wait on each other's lease. HA tests pass one name to several processes.
    lease_name: str = field(default_factory=lambda: f"pdfleet-{uuid.uuid4().hex[:8]}")
    extra_args: tuple[str, ...] = ()
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "pdfleet.cli", "operator", "run",
            "--kubeconfig", str(self.kubeconfig),
            "--bind", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            "--resync-seconds", str(self.resync_seconds),
            "--identity", self.identity,
            "--lease-namespace", self.lease_namespace,
            "--lease-name", self.lease_name,
            "--leader-election" if self.leader_election else "--no-leader-election",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> OperatorProcess:
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no lease release, like a node dying."""
        if self.process is not None and self.running():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None or not self.running():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    @contextlib.contextmanager
    def serving(self, healthy_within: float = 60.0) -> Iterator[OperatorProcess]:
        """Started and healthy for the block, stopped after it (a test's operator)."""
        self.start().wait_healthy(timeout=healthy_within)
        try:
            yield self
        finally:
            self.stop()

    def metrics(self) -> dict[str, float]:
        """Current metric samples; empty while the endpoint is not up (e.g. a standby)."""
        try:
            response = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2)
        except httpx.HTTPError:
            return {}
        return parse_metrics(response.text)

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if not self.running():
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"operator exited; log tail:\n{tail}")
            time.sleep(0.2)
        self.stop()
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise TimeoutError(f"operator not healthy after {timeout}s; log tail:\n{tail}")
