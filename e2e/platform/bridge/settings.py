"""What the bridge runs and how: its settings and the rules that pick a container's runner.

Where it fits: ``BridgeSettings`` is what pytest fixtures, the fleet helpers and the command
line (``__main__``) hand to ``Bridge``; its ``rules`` send each container to a runner of
``commands`` (simulator worker, real engine, router, activator). No I/O.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.platform.bridge.pods import pod_labels
from pdfleet import labels

#: Pods carrying this label (any value) belong to the bridge; use the same key as
#: ``ClusterConfig.bridge_label`` so that kwok leaves them alone.
OWNED_LABEL = labels.ROLE
VENV_BIN = Path(sys.executable).parent
WORKER_ROLES = frozenset(labels.WORKER_ROLES)


@dataclass(frozen=True)
class RunnerRule:
    """Containers this rule sends to ``runner``: by pod role label and/or image pattern."""

    runner: str
    roles: frozenset[str] = frozenset()  # values of pdfleet.dev/role; empty: any
    image: str = "*"  # fnmatch pattern on the container image

    def matches(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> bool:
        role = pod_labels(pod).get(labels.ROLE, "")
        if self.roles and role not in self.roles:
            return False
        return fnmatch.fnmatchcase(str(container.get("image", "")), self.image)


#: Worker pods of this image run the real vLLM engine (its CPU build, installed by
#: e2e/platform/engine.sh) instead of the simulator: a fleet chooses its engine by the image it
#: names.
REAL_ENGINE_IMAGE = "*/pdfleet-worker-cpu:*"

DEFAULT_RULES: tuple[RunnerRule, ...] = (
    RunnerRule("engine", roles=WORKER_ROLES, image=REAL_ENGINE_IMAGE),
    RunnerRule("worker", roles=WORKER_ROLES),
    RunnerRule("router", roles=frozenset({labels.ROLE_ROUTER})),
    # `pdfleet activator`, found on bin_dir (the venv's console script).
    RunnerRule("activator", roles=frozenset({labels.ROLE_ACTIVATOR})),
)


@dataclass(frozen=True)
class BridgeSettings:
    """What the bridge runs and how. Only ``kubeconfig`` and ``log_dir`` are required."""

    kubeconfig: Path
    log_dir: Path
    owned_label: str = OWNED_LABEL
    namespace: str | None = None  # watch one namespace; None: all
    time_scale: float = 1.0  # PDFLEET_SIM_TIME_SCALE: wall seconds per simulated second
    sim_preset: str | None = None  # PDFLEET_SIM_PRESET; None: the simulator's default
    engine_root: Path | None = None  # e2e/platform/engine.sh's install, for REAL_ENGINE_IMAGE pods
    bin_dir: Path = VENV_BIN  # searched first for commands (pdfleet-agent, vllm-router, pdfleet)
    rules: tuple[RunnerRule, ...] = DEFAULT_RULES
    ip_wait_s: float = 3.0  # wait this long for kwok's pod IP before allocating one
    probe_period_max_s: float | None = None  # cap on probe periods (faster tests); None: spec
    # Floor on probe timeouts: here every pod shares the machine's few cores, so an exec probe
    # (a process start) can take longer than on a node of its own; None: spec.
    probe_timeout_min_s: float | None = None
    restart_backoff_s: float = 1.0  # first restart delay; doubles up to restart_backoff_max_s
    restart_backoff_max_s: float = 30.0
    tick_s: float = 0.1  # how often a pod's thread looks at its process and probes
    # How long a container start waits for a Service it names to have an endpoint address
    # (the activator's upstream: the router's pod may not have its IP yet) before it fails
    # with CreateContainerConfigError, to be tried again with back-off.
    service_wait_s: float = 60.0
