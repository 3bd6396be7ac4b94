"""``PodWorker``: the thread that plays kubelet for one pod, from first sight to deletion.

Where it fits: the bridge (``bridge``) starts one worker per pod it owns and feeds it the
pod's watch events; the worker claims the pod IP, starts the containers (``commands``,
``containers``), runs their probes and restarts, writes ``pods/status`` (``pods``) through
the bridge, and on deletion runs preStop, stops the processes and deletes the pod.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from e2e.platform.bridge.commands import (
    RUNNERS,
    LaunchContext,
    LocalCommand,
    StartError,
    select_runner,
)
from e2e.platform.bridge.containers import ContainerRun, probe_once, run_exec
from e2e.platform.bridge.environment import resolve_env
from e2e.platform.bridge.pods import (
    ContainerView,
    Manifest,
    allocate_pod_ip,
    exit_action,
    grace_deadline,
    ip_patch,
    node_internal_ip,
    node_pod_cidr,
    parse_time,
    pod_key,
    restart_delay,
    status_patch,
)
from e2e.platform.bridge.probes import Probe, ProbeTracker, parse_probe

if TYPE_CHECKING:
    from e2e.platform.bridge.bridge import Bridge

log = logging.getLogger("pdfleet.bridge")


class PodWorker(threading.Thread):
    """Plays kubelet for one pod (one uid) from first sight to deletion."""

    def __init__(self, bridge: Bridge, pod: Manifest) -> None:
        super().__init__(name=f"pod-{pod_key(pod)}", daemon=True)
        self.bridge = bridge
        self.settings = bridge.settings
        self.key = pod_key(pod)
        self.uid = str(pod["metadata"]["uid"])
        self._pod = pod
        self._lock = threading.Lock()
        self.changed = threading.Event()
        self.gone = threading.Event()  # the pod is no longer in the API
        self.stopping = threading.Event()  # bridge shutdown: kill, do not touch the API
        self.pod_ip = ""
        self.host_ip = ""
        # Like kubelet's /var/log/pods/<namespace>_<name>_<uid>: a recreated pod of the same
        # name (StatefulSet) gets its own directory.
        self.pod_dir = self.settings.log_dir / f"{self.key.replace('/', '_')}_{self.uid[:8]}"
        self.containers: list[ContainerRun] = []
        # Per container: builds its command, at each start (a runner may look the cluster up).
        self._commands: dict[str, Callable[[], LocalCommand]] = {}
        self._create_failures: dict[str, int] = {}  # consecutive StartErrors per container
        self.terminal: str | None = None
        self.timeline: dict[str, float] = {"seen": time.time()}
        self._written: tuple[object, ...] | None = None
        self.prestop_output: dict[str, str] = {}

    # -- fed by the watch thread ---------------------------------------------------------

    def update(self, pod: Manifest) -> None:
        with self._lock:
            self._pod = pod
        self.changed.set()

    @property
    def pod(self) -> Manifest:
        with self._lock:
            return self._pod

    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    def abandoned(self) -> bool:
        """The pod is being deleted or gone, or the bridge is stopping: stop waiting."""
        return self.stopping.is_set() or self.gone.is_set() or self.deleting()

    # -- the thread ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("%s: bridge worker failed", self.key)
            self.bridge.failed(self)
        finally:
            for c in self.containers:
                if c.running():
                    c.stop(grace_s=2.0)
            self.bridge.forget(self)

    def _run(self) -> None:
        terminal = self.pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if not terminal and self._claim_ip():
            self._start_containers()
            self._supervise()
        if self.deleting() and not (self.stopping.is_set() or self.gone.is_set()):
            self._terminate()

    def _claim_ip(self) -> bool:
        """Take kwok's pod IP, waiting ``ip_wait_s`` for it, else allocate one."""
        node = self.bridge.node(str(self.pod["spec"]["nodeName"]))
        self.host_ip = node_internal_ip(node)
        deadline = time.monotonic() + self.settings.ip_wait_s
        while True:
            if self.stopping.is_set() or self.gone.is_set() or self.deleting():
                return False
            pod = self.pod
            ip = pod.get("status", {}).get("podIP")
            if ip:
                self.pod_ip = str(ip)
                self.host_ip = str(pod["status"].get("hostIP") or self.host_ip)
                self.timeline["ip"] = time.time()
                return True
            if time.monotonic() >= deadline:
                cidr = node_pod_cidr(node)
                if cidr is None:
                    raise RuntimeError(f"node {pod['spec']['nodeName']} has no podCIDR")
                used = self.bridge.pod_ips_on(str(pod["spec"]["nodeName"]))
                ip = allocate_pod_ip(cidr, used)
                if self.bridge.patch_status(pod, ip_patch(pod, ip, self.host_ip)):
                    log.info("%s: allocated pod IP %s (kwok gave none)", self.key, ip)
                    self.pod_ip = ip
                    self.timeline["ip"] = time.time()
                    return True
                deadline = time.monotonic() + 0.5  # lost a race: look again
            self.changed.wait(0.2)
            self.changed.clear()

    def _start_containers(self) -> None:
        pod = self.pod
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        ctx = LaunchContext(
            pod_ip=self.pod_ip,
            pod_dir=self.pod_dir,
            bin_dir=self.settings.bin_dir,
            kubeconfig=self.settings.kubeconfig,
            search_path=os.environ.get("PATH", os.defpath),
            time_scale=self.settings.time_scale,
            sim_preset=self.settings.sim_preset,
            engine_root=self.settings.engine_root,
            namespace=str(pod["metadata"]["namespace"]),
            resolve_service=functools.partial(
                self.bridge.resolve_service,
                wait_s=self.settings.service_wait_s,
                abandoned=self.abandoned,
            ),
        )
        for spec in pod["spec"]["containers"]:
            runner = select_runner(pod, spec, self.settings.rules)
            if runner is None:
                raise RuntimeError(f"no runner for container {spec['name']} ({spec.get('image')})")
            env = resolve_env(spec, pod, self.pod_ip, self.host_ip, self.bridge.lookup(pod))
            cap, floor = self.settings.probe_period_max_s, self.settings.probe_timeout_min_s
            run = ContainerRun(
                spec=spec,
                command=LocalCommand((), env),  # built at each start, by _create
                log_path=self.pod_dir / f"{spec['name']}.log",
                events_path=self.pod_dir / f"{spec['name']}.events.log",
                startup=_tracker(parse_probe(spec.get("startupProbe"), spec, cap, floor)),
                readiness=_tracker(parse_probe(spec.get("readinessProbe"), spec, cap, floor)),
                liveness=_tracker(parse_probe(spec.get("livenessProbe"), spec, cap, floor)),
                view=ContainerView(name=str(spec["name"]), image=str(spec.get("image", ""))),
            )
            self.containers.append(run)
            self._commands[run.name] = functools.partial(RUNNERS[runner], spec, env, ctx)
            if self._create(run):
                log.info("%s/%s: %s on %s", self.key, run.name, runner, self.pod_ip)
        self.timeline["started"] = time.time()
        self._write_status()

    def _create(self, c: ContainerRun) -> bool:
        """Build the container's command and start its process; False when it cannot start
        yet (StartError: the activator's upstream Service has no endpoint address). Then, as
        kubelet does for a container it cannot create, the container waits with
        ``CreateContainerConfigError`` and the reason as message (the pod stays Pending, its
        other containers run), and ``_supervise`` tries again after a back-off. Any other
        error (a runner that is not installed, a command not found) fails the pod's worker,
        as it always has."""
        try:
            c.command = self._commands[c.name]()
        except StartError as err:
            failures = self._create_failures.get(c.name, 0)
            self._create_failures[c.name] = failures + 1
            delay = restart_delay(
                failures, self.settings.restart_backoff_s, self.settings.restart_backoff_max_s
            )
            c.event(f"cannot start: {err}; trying again in {delay:g}s")
            log.warning("%s/%s cannot start: %s", self.key, c.name, err)
            c.restart_at = time.time() + delay
            c.view = replace(
                c.view,
                state="waiting",
                reason="CreateContainerConfigError",
                message=str(err),
                ready=False,
                started=False,
            )
            return False
        self._create_failures.pop(c.name, None)
        c.start(self.pod_dir)
        return True

    def _supervise(self) -> None:
        """Probes, exits and restarts until the pod is deleted (or the bridge stops)."""
        restart_policy = str(self.pod["spec"].get("restartPolicy", "Always"))
        while not (self.stopping.is_set() or self.gone.is_set() or self.deleting()):
            now = time.time()
            for c in self.containers:
                self._check_container(c, restart_policy, now)
            if self.containers and all(c.view.state == "terminated" for c in self.containers):
                codes = [c.view.exit_code or 0 for c in self.containers]
                self.terminal = "Succeeded" if not any(codes) else "Failed"
            self._write_status()
            if self.terminal is not None:
                return
            self.changed.wait(self.settings.tick_s)
            self.changed.clear()

    def _check_container(self, c: ContainerRun, restart_policy: str, now: float) -> None:
        if c.view.state == "terminated":
            return
        if c.restart_at is not None:
            if now >= c.restart_at:
                first = c.popen is None  # it never started: its creation failed
                if self._create(c):
                    c.event(
                        "started" if first else f"restarted (restartCount {c.view.restart_count})"
                    )
            return
        code = c.exited()
        if code is not None:
            c.kill_at = None
            self._on_exit(c, code, restart_policy, now)
            return
        if c.kill_at is not None and now >= c.kill_at:
            c.event("grace period over: SIGKILL")
            c.signal(signal.SIGKILL)
            c.kill_at = float("inf")  # one SIGKILL; still stopping until its exit is seen
        self._probe(c, now)

    def _on_exit(self, c: ContainerRun, code: int, restart_policy: str, now: float) -> None:
        started = c.view.started_at or now
        action = exit_action(restart_policy, code)
        c.event(f"exited with {code}: {action}")
        log.warning("%s/%s exited with %s (%s)", self.key, c.name, code, action)
        if action == "restart":
            delay = restart_delay(
                c.view.restart_count,
                self.settings.restart_backoff_s,
                self.settings.restart_backoff_max_s,
            )
            c.restart_at = now + delay
            c.view = replace(
                c.view,
                state="waiting",
                reason="CrashLoopBackOff",
                ready=False,
                started=False,
                restart_count=c.view.restart_count + 1,
                last_exit=(code, started, now),
            )
        else:
            reason = "Completed" if code == 0 else "Error"
            c.view = replace(
                c.view,
                state="terminated",
                reason=reason,
                exit_code=code,
                finished_at=now,
                ready=False,
                started=False,
            )

    def _probe(self, c: ContainerRun, now: float) -> None:
        env, cwd = c.command.env, self.pod_dir
        if c.startup is not None and not c.startup.ok:
            if c.startup.due(now):
                ok, why = probe_once(c.startup.probe, self.pod_ip, env, cwd)
                if c.startup.observe(ok, time.time()):
                    c.view = replace(c.view, started=True)
                elif c.startup.failures >= c.startup.probe.failure_threshold:
                    c.event(f"startup probe failed: {why}")
                    self._kill_for_restart(c)
            return
        # Like kubelet: a container being stopped gets no liveness probe (it would only
        # cut its drain short), while readiness is still probed.
        if c.kill_at is None and c.liveness is not None and c.liveness.due(now):
            ok, why = probe_once(c.liveness.probe, self.pod_ip, env, cwd)
            if c.liveness.observe(ok, time.time()) and not c.liveness.ok:
                c.event(f"liveness probe failed: {why}")
                self._kill_for_restart(c)
                return
        if c.readiness is None:
            c.view = replace(c.view, ready=True)
        elif c.readiness.due(now):
            ok, why = probe_once(c.readiness.probe, self.pod_ip, env, cwd)
            if c.readiness.observe(ok, time.time()):
                c.event(f"readiness {'succeeded' if ok else 'failed'}: {why}")
                c.view = replace(c.view, ready=c.readiness.ok)

    def _kill_for_restart(self, c: ContainerRun) -> None:
        # Capped: a liveness kill of a pod with a drain-length grace period would stall
        # the test that provoked it.
        c.begin_stop(min(self._grace_s(), 5.0), time.time())

    def stop_main_container(self) -> None:
        """Stop the first container the way kubelet stops one it restarts: SIGTERM, no
        liveness probe meanwhile, SIGKILL after the pod's grace period; it then restarts
        under the pod's restartPolicy."""
        if self.containers and self.containers[0].running():
            self.containers[0].begin_stop(self._grace_s(), time.time())
            self.changed.set()

    def _grace_s(self) -> float:
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _write_status(self) -> None:
        views = tuple(c.view for c in self.containers)
        state = (views, self.terminal)
        if state == self._written:
            return
        patch = status_patch(self.pod, self.pod_ip, self.host_ip, views, time.time(), self.terminal)
        if self.bridge.patch_status(self.pod, patch):
            self._written = state
            if views and all(v.ready for v in views) and "ready" not in self.timeline:
                self.timeline["ready"] = time.time()
                created = parse_time(self.pod["metadata"].get("creationTimestamp"))
                log.info(
                    "%s: Ready, %.2fs after the bridge saw it (%.1fs after creation)",
                    self.key,
                    self.timeline["ready"] - self.timeline["seen"],
                    self.timeline["ready"] - (created or self.timeline["seen"]),
                )

    def _terminate(self) -> None:
        """preStop, SIGTERM, SIGKILL at the grace deadline, then remove the pod object."""
        self.timeline["deleting"] = time.time()
        deadline = grace_deadline(self.pod, time.time())
        for c in self.containers:
            pre_stop = (c.spec.get("lifecycle") or {}).get("preStop") or {}
            pause = float((pre_stop.get("sleep") or {}).get("seconds") or 0)
            if pause and c.running():
                # kubelet's sleep action: the container keeps serving for that long.
                time.sleep(max(0.0, min(pause, deadline - time.time())))
                c.event(f"preStop slept {pause:g}s")
            hook = pre_stop.get("exec")
            if hook and c.running():
                t0 = time.time()
                code, out = run_exec(
                    hook.get("command") or [], c.command.env, deadline - t0, self.pod_dir
                )
                self.prestop_output[c.name] = out
                c.event(f"preStop exited {code} after {time.time() - t0:.2f}s: {out.strip()}")
        for c in self.containers:
            c.signal(signal.SIGTERM)
        for c in self.containers:
            # kubelet grants at least 2 s after preStop, even past the deadline.
            if not c.wait(max(deadline - time.time(), 2.0)):
                c.event("grace period over: SIGKILL")
                c.signal(signal.SIGKILL)
                c.wait(10)
            c.event(f"stopped, exit code {c.exited()}")
        self.timeline["stopped"] = time.time()
        self._finalize()

    def _finalize(self) -> None:
        self.bridge.delete_pod(self.pod)
        log.info("%s: deleted", self.key)

    def shutdown(self) -> None:
        self.stopping.set()
        self.changed.set()


def _tracker(probe: Probe | None) -> ProbeTracker | None:
    return ProbeTracker(probe) if probe is not None else None
