"""One container's local process: start, signals, exit code, exec hooks and probe runs.

Where it fits: the pod worker owns one ``ContainerRun`` per container and decides, with
``probes`` and ``pods``, when to start, probe, restart or stop it; this module does the I/O
(processes, HTTP and TCP probes, its log and event files).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import httpx

from e2e.platform.bridge.commands import LocalCommand
from e2e.platform.bridge.pods import ContainerView, Manifest, exit_code, rfc3339
from e2e.platform.bridge.probes import Probe, ProbeTracker


def which(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """argv with its command resolved on env's PATH, as a container runtime would."""
    found = shutil.which(argv[0], path=env.get("PATH"))
    if found is None:
        raise FileNotFoundError(f"{argv[0]} not found on {env.get('PATH')}")
    return [found, *argv[1:]]


def run_exec(
    command: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: Path
) -> tuple[int, str]:
    """An exec probe or hook: exit code (-1 on timeout or spawn failure) and output."""
    try:
        proc = subprocess.run(
            which(command, env),
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=max(timeout_s, 0.1),
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        out = err.stdout if isinstance(err.stdout, str) else ""
        return -1, f"{out}timed out after {timeout_s:.1f}s"
    except OSError as err:
        return -1, str(err)
    return proc.returncode, proc.stdout + proc.stderr


def probe_once(probe: Probe, pod_ip: str, env: Mapping[str, str], cwd: Path) -> tuple[bool, str]:
    """Run one probe against the container the way kubelet would."""
    if probe.kind == "http":
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        url = f"{probe.scheme.lower()}://{host}:{probe.port}{probe.path}"
        try:
            resp = httpx.get(url, timeout=probe.timeout_s, verify=False)
        except httpx.HTTPError as err:
            return False, f"GET {url}: {err!r}"
        return 200 <= resp.status_code < 400, f"GET {url}: {resp.status_code}"
    if probe.kind == "tcp":
        try:
            with socket.create_connection((pod_ip, probe.port), timeout=probe.timeout_s):
                return True, "connected"
        except OSError as err:
            return False, f"connect {pod_ip}:{probe.port}: {err}"
    code, out = run_exec(probe.command, env, probe.timeout_s, cwd)
    return code == 0, out.strip()


@dataclass
class ContainerRun:
    """The local process behind one container, its probes and its reported view."""

    spec: Manifest
    command: LocalCommand
    log_path: Path
    events_path: Path
    startup: ProbeTracker | None
    readiness: ProbeTracker | None
    liveness: ProbeTracker | None
    view: ContainerView
    popen: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    #: Set while kubelet stops the container to restart it: SIGKILL falls due then.
    kill_at: float | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def event(self, message: str) -> None:
        with self.events_path.open("a") as f:
            f.write(f"{rfc3339(time.time())} {message}\n")

    def start(self, cwd: Path) -> None:
        argv = which(self.command.argv, self.command.env)
        self._log = self.log_path.open("ab")
        self._log.write(f"==== {rfc3339(time.time())} start: {' '.join(argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            argv,
            env=dict(self.command.env),
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: signals reach its children
        )
        now = time.time()
        for tracker in (self.startup, self.readiness):
            if tracker is not None:
                tracker.start(now)
        if self.liveness is not None:
            self.liveness.start(now, ok=True)
        self.view = replace(
            self.view,
            state="running",
            reason="",
            message="",
            started_at=now,
            finished_at=None,
            exit_code=None,
            ready=False,
            started=self.startup is None,
            container_id=f"bridge://{self.popen.pid}",
        )
        self.restart_at = None

    def signal(self, sig: int) -> None:
        """Like a container runtime: SIGTERM (any catchable signal) goes to the main process
        alone, which shuts its children down itself (vLLM's API server drains its engine
        core); SIGKILL takes the whole container, i.e. the process group."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(self.popen.pid, sig)
                else:
                    os.kill(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> bool:
        """True when the process has exited within ``timeout_s``."""
        if self.popen is None:
            return True
        try:
            self.popen.wait(max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def begin_stop(self, grace_s: float, now: float) -> None:
        """SIGTERM now; the supervisor sends SIGKILL at ``kill_at`` if it is still running."""
        self.kill_at = now + grace_s
        self.signal(signal.SIGTERM)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code."""
        self.signal(signal.SIGTERM)
        if not self.wait(grace_s):
            self.signal(signal.SIGKILL)
            self.wait(10)
        return self.exited()

    def exited(self) -> int | None:
        """The exit code once the process is gone (its log closed), else None."""
        if self.popen is None or self.popen.poll() is None:
            return None
        if self._log is not None:  # first look since it exited
            # A container ends with its main process: whatever it left behind goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self._log.close()
            self._log = None
        return exit_code(self.popen.returncode)
