"""`pdfleet-agent`: the worker container's entrypoint and its Kubernetes hooks.

Where it fits: the image's ENTRYPOINT is `pdfleet-agent launch` (exec vLLM with the command
built from PDFLEET_* env), the pod's preStop is `pdfleet-agent prestop` and its readiness
probe `pdfleet-agent ready`. `pdfleet-agent command` prints the command for debugging.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence

from pdfleet_worker import drain, launcher

_WILDCARD = {"", "0.0.0.0", "::", "[::]"}


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
    sys.stdout.flush()
    os.execve(exe, argv, child_env)  # replaces this process; signals go straight to vLLM


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
        sys.exit(cmd_ready(env))
    except launcher.LaunchConfigError as err:
        print(f"pdfleet-agent: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
