"""The process bridge: a kubelet stand-in that runs pdfleet pods as local processes.

Where it fits: the local cluster (``e2e/platform/cluster.py``) has a real control plane and kwok's
fake GPU nodes. kwok alone only pretends: pods turn Running with nothing behind them. For the e2e
scenarios and the demo, pods that carry the bridge label (by default ``pdfleet.dev/role``, present
on every prefill, decode, router and activator pod the operator renders) are left by kwok to this
bridge, which plays kubelet for them:

* kwok's bridge stage gives a scheduled pod its IP from the node's podCIDR (phase Pending,
  containers ``ContainerCreating``); without that stage the bridge allocates one itself, from
  the top of the node's podCIDR down, away from kwok's pool, which grows from the bottom;
* the bridge resolves the container's environment, maps the container to a local command
  (``pdfleet-agent launch`` with ``PDFLEET_ENGINE=sim`` for workers, or with the real vLLM
  engine for workers of the CPU engine image, the real ``vllm-router`` for the router,
  ``pdfleet activator`` for the activator) bound to the pod IP, which is a local address
  inside ``e2e/platform/netns.sh``. There is no cluster DNS or kube-proxy: the activator's
  upstream, the router's Service, becomes the address of one of its endpoints (its
  EndpointSlices) when the container starts; a container whose Service has no endpoint
  address yet waits (``CreateContainerConfigError``) and is tried again;
* it reports ``pods/status`` like kubelet (Running, container states, restarts) and drives
  Ready from the container's own startup/readiness probes (httpGet, exec, tcpSocket), writing
  only on change; liveness failures restart the container;
* on deletion it runs the preStop exec hook, SIGTERMs, SIGKILLs at the end of the grace period
  and then deletes the pod with ``gracePeriodSeconds=0`` (uid precondition);
* a process that exits by itself is restarted (restartPolicy Always, the only policy of
  StatefulSet and Deployment pods) with a capped back-off and a growing ``restartCount``;
  under Never/OnFailure the pod ends Succeeded or Failed as kubelet would.

The pure part (pod -> command and environment, IP allocation, probe bookkeeping, status
patches) is plain functions over Kubernetes JSON dicts, unit-tested in ``tests/unit/e2e``.
The I/O part is one watch thread plus one thread per pod. Use it as a class from pytest
(:class:`Bridge`) or from the command line, inside the cluster's network namespace::

    python -m e2e.platform.bridge --kubeconfig FILE [--time-scale 0.1] [--log-dir DIR]

One module per concept, each importing only the ones listed before it:

* ``pods``: pods and nodes, IPs, times, exit and restart policy, ``pods/status`` patches;
* ``environment``: a container's environment (``envFrom``, ``env``, downward API, ``$(VAR)``);
* ``probes``: probe specs and kubelet's success/failure bookkeeping;
* ``settings``: what the bridge runs and how (``BridgeSettings``, the runner rules);
* ``commands``: a container -> the local command of its runner (simulator, engine, router,
  activator);
* ``containers``: one container's process, exec hooks and probe runs (I/O);
* ``worker``: ``PodWorker``, the thread that plays kubelet for one pod (I/O);
* ``bridge``: ``Bridge``, the pod watch and the API calls (I/O); ``worker`` names it for
  type checking only;
* ``__main__``: the command line.

The first five do no I/O. This package re-exports what the rest of the harness uses.

See docs/e2e.md.
"""

from e2e.platform.bridge.bridge import Bridge, PodProcess, running
from e2e.platform.bridge.commands import LaunchContext, LocalCommand, worker_command
from e2e.platform.bridge.containers import which
from e2e.platform.bridge.environment import resolve_env
from e2e.platform.bridge.settings import (
    OWNED_LABEL,
    REAL_ENGINE_IMAGE,
    VENV_BIN,
    BridgeSettings,
    RunnerRule,
)

__all__ = [
    "OWNED_LABEL",
    "REAL_ENGINE_IMAGE",
    "VENV_BIN",
    "Bridge",
    "BridgeSettings",
    "LaunchContext",
    "LocalCommand",
    "PodProcess",
    "RunnerRule",
    "resolve_env",
    "running",
    "which",
    "worker_command",
]
