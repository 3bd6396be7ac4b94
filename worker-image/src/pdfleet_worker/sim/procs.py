"""Start and stop simulator (and router) processes on loopback, for tests and demos.

Where it fits: tests/unit/worker, tests/integration/router and the e2e process bridge need real
`pdfleet-sim` processes on free ports, always cleaned up and with bounded waits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was up")
        try:
            r = httpx.get(url, timeout=1.0)
            if r.status_code == 200:
                return
            last = r.status_code
        except httpx.HTTPError as err:
            last = err
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s}s (last: {last!r})")


@dataclass
class Proc:
    """A child process with its log file; stop() is idempotent and always reaps it."""

    argv: list[str]
    log_path: str
    popen: subprocess.Popen[bytes] = field(init=False)
    _log: IO[bytes] = field(init=False)

    def start(self, env: dict[str, str] | None = None) -> Proc:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        return self

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, grace_s: float = 5.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")


@dataclass
class SimProc(Proc):
    port: int = 0
    side_channel_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/sim/stats", timeout=5.0)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data


def start_sim(
    log_dir: str,
    model: str = "sim-model",
    extra: Sequence[str] = (),
    timeout_s: float = 15.0,
    name: str = "sim",
    attempts: int = 3,
) -> SimProc:
    """A `pdfleet-sim` on 127.0.0.1 with free API and side-channel ports, ready to serve.

    A port `free_port` found free can be taken before the simulator binds it (any outgoing
    connection may get it as its local port); that start is retried on fresh ports."""
    for attempt in range(1, attempts + 1):
        port, side = free_port(), free_port()
        argv = [
            sys.executable,
            "-m",
            "pdfleet_worker.sim.server",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--side-channel-host",
            "127.0.0.1",
            "--side-channel-port",
            str(side),
            *extra,
        ]
        p = SimProc(
            argv, os.path.join(log_dir, f"{name}-{port}.log"), port=port, side_channel_port=side
        )
        p.start()
        try:
            wait_http(f"{p.url}/health", timeout_s, p.popen)
            return p
        except BaseException as error:
            p.stop()
            taken = isinstance(error, RuntimeError) and "address already in use" in p.log()
            if not (taken and attempt < attempts):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def router_binary() -> str:
    """vllm-router, a dev dependency installed next to the interpreter (else on PATH). Missing
    is an error, never a reason to skip."""
    local = os.path.join(os.path.dirname(sys.executable), "vllm-router")
    found = local if os.path.exists(local) else shutil.which("vllm-router")
    if not found:
        raise RuntimeError("vllm-router is not installed (pip install vllm-router==0.1.17)")
    return found


# Round robin, and worker health checked every second: a test sees a stopped worker at once.
QUICK_ROUTER_ARGS = (
    "--policy", "round_robin", "--health-check-interval-secs", "1",
    "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "20",
)  # fmt: skip


def static_router_argv(
    port: int,
    prometheus_port: int,
    prefill_urls: Sequence[str],
    decode_urls: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """The real vllm-router in P/D mode on 127.0.0.1 with a static list of workers (the
    operator's router discovers pods instead; render/router.py)."""
    argv = [
        router_binary(), "--vllm-pd-disaggregation",
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port),
        *extra,
    ]  # fmt: skip
    for url in prefill_urls:
        argv += ["--prefill", url]
    for url in decode_urls:
        argv += ["--decode", url]
    return argv


@contextlib.contextmanager
def stopping(procs: list[Proc]) -> Any:
    """Stop every process on exit, whatever happened."""
    try:
        yield procs
    finally:
        for p in reversed(procs):
            with contextlib.suppress(Exception):
                p.stop()
