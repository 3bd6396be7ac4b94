"""`pdfleet-agent`: the worker container's entrypoint and its Kubernetes hooks.

Where it fits: the image's ENTRYPOINT is `pdfleet-agent launch` (exec vLLM with the command
built from PDFLEET_* env), the pod's preStop is `pdfleet-agent prestop` and its readiness
probe `pdfleet-agent ready`. `pdfleet-agent command` prints the command for debugging.
With PDFLEET_PREFLIGHT_PORT set, `launch` first starts the KV transport preflight listener
(`pdfleet-agent preflight-serve`) beside the engine; `pdfleet-agent preflight --peer URL`
runs one measurement against a prefill pod by hand (docs/kv-preflight.md).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet_worker import drain, launcher

_WILDCARD = {"", "0.0.0.0", "::", "[::]"}
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def base_url(env: Mapping[str, str]) -> str:
    """Where `prestop` and `ready` reach the engine: loopback when it binds every address
    (the default, PDFLEET_HOST unset or 0.0.0.0), else the one address it binds (e.g. the
    pod IP, as the e2e process bridge runs it)."""
    host = env.get("PDFLEET_HOST", "").strip()
    if host in _WILDCARD:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{env.get('PDFLEET_PORT', '').strip() or '8000'}"


def _drain_file(env: Mapping[str, str]) -> str:
    return env.get("PDFLEET_DRAIN_FILE", "").strip() or drain.DEFAULT_DRAIN_FILE


def _drain_timeout(env: Mapping[str, str]) -> float:
    raw = env.get("PDFLEET_DRAIN_TIMEOUT", "").strip()
    if raw:
        return float(raw)
    return float(env.get("PDFLEET_SHUTDOWN_TIMEOUT", "").strip() or "60")


def cmd_launch(env: Mapping[str, str]) -> int:
    argv = launcher.build_vllm_command(env)
    child_env = {**env, **launcher.build_vllm_env(env)}
    exe = shutil.which(argv[0], path=child_env.get("PATH"))
    if exe is None:
        print(f"pdfleet-agent: {argv[0]} not found on PATH", file=sys.stderr)
        return 127
    # A stale marker from a previous container in the same pod must not keep it unready.
    path = _drain_file(env)
    if drain.is_draining(path):
        os.remove(path)
    if env.get("PDFLEET_PREFLIGHT_PORT", "").strip():
        start_preflight_listener(env)
    sys.stdout.flush()
    os.execve(exe, argv, child_env)  # replaces this process; signals go straight to vLLM


def _die_with_parent() -> None:
    """Runs in the listener's child between fork and exec: SIGTERM it when its parent (the
    engine, after the exec below) exits, so the listener never outlives the container's
    main process."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start_preflight_listener(env: Mapping[str, str]) -> None:
    """Start the listener as a child that the engine inherits: it runs in the same container
    (same GPUs, RDMA devices, capabilities, UCX env) and costs nothing until asked to measure.
    The engine stays the container's main process and gets the signals."""
    exe = shutil.which("pdfleet-agent", path=env.get("PATH")) or "pdfleet-agent"
    subprocess.Popen(
        [exe, "preflight-serve"],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )


def cmd_preflight(env: Mapping[str, str], args: argparse.Namespace) -> int:
    import pdfleet_wire.preflight as wire
    from pdfleet_worker.preflight import transfer

    request = wire.PreflightRequest(
        peer=args.peer.rstrip("/"),
        tokens=args.tokens,
        block_size=args.block_size,
        geometry=wire.KVCacheShape(args.layers, args.kv_heads, args.head_dim, args.dtype_bytes),
        tp=args.tp,
        iterations=args.iterations,
        memory=args.memory,
        timeout_s=args.timeout,
    )
    result = transfer.run(request, env)
    print(json.dumps(result.to_json(), indent=2))
    return 0 if result.ok else 1


def _preflight_parser(sub: Any) -> None:
    pre = sub.add_parser("preflight", help="READ a prefill pod's offer over NIXL and report")
    pre.add_argument("--peer", required=True, help="the prefill pod's listener, http://IP:5590")
    pre.add_argument("--tokens", type=int, default=4096, help="prompt length to move")
    pre.add_argument("--block-size", type=int, default=16, help="vLLM KV block size")
    pre.add_argument("--layers", type=int, default=32)
    pre.add_argument("--kv-heads", type=int, default=8)
    pre.add_argument("--head-dim", type=int, default=128)
    pre.add_argument("--dtype-bytes", type=int, default=2)
    pre.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the prefill")
    pre.add_argument("--iterations", type=int, default=5)
    pre.add_argument("--memory", choices=["DRAM", "VRAM"], default=None)
    pre.add_argument("--timeout", type=float, default=120.0)
    sub.add_parser("preflight-serve", help="the preflight listener (started by launch)")


def cmd_prestop(env: Mapping[str, str], interval_s: float) -> int:
    drain.mark_draining(_drain_file(env))
    result = drain.wait_idle(base_url(env), _drain_timeout(env), interval_s=interval_s)
    print(
        json.dumps(
            {
                "drained": result.drained,
                "waited_s": round(result.waited_s, 3),
                "in_flight": result.last_in_flight,
            }
        )
    )
    # Exit 0 either way: SIGTERM follows and vLLM's --shutdown-timeout takes over.
    return 0


def cmd_ready(env: Mapping[str, str]) -> int:
    ok, why = drain.check_ready(base_url(env), _drain_file(env))
    if not ok:
        print(why, file=sys.stderr)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="pdfleet-agent", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("launch", help="exec the engine built from PDFLEET_* env")
    sub.add_parser("command", help="print the engine command and env as JSON")
    pre = sub.add_parser("prestop", help="mark draining, wait for in-flight requests")
    pre.add_argument("--interval", type=float, default=1.0, help="poll interval, seconds")
    sub.add_parser("ready", help="readiness probe: exit 0 when ready")
    _preflight_parser(sub)
    args = p.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.cmd == "launch":
            sys.exit(cmd_launch(env))
        if args.cmd == "command":
            print(
                json.dumps(
                    {"argv": launcher.build_vllm_command(env), "env": launcher.build_vllm_env(env)},
                    indent=2,
                )
            )
            sys.exit(0)
        if args.cmd == "prestop":
            sys.exit(cmd_prestop(env, args.interval))
        if args.cmd == "preflight":
            sys.exit(cmd_preflight(env, args))
        if args.cmd == "preflight-serve":
            from pdfleet_worker.preflight import server

            server.serve(env)
            sys.exit(0)
        sys.exit(cmd_ready(env))
    except launcher.LaunchConfigError as err:
        print(f"pdfleet-agent: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
