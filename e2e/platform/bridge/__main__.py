"""``python -m e2e.platform.bridge``: run the bridge from the command line until a signal.

Where it fits: for a cluster started by hand (``python -m e2e.platform.cluster up``) inside
``e2e/platform/netns.sh``; tests and scenarios use ``Bridge`` directly. See docs/e2e.md.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from e2e.platform.bridge.bridge import Bridge
from e2e.platform.bridge.commands import RUNNERS
from e2e.platform.bridge.settings import (
    DEFAULT_RULES,
    OWNED_LABEL,
    REAL_ENGINE_IMAGE,
    BridgeSettings,
    RunnerRule,
)

log = logging.getLogger("pdfleet.bridge")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m e2e.platform.bridge --kubeconfig FILE``: run until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.platform.bridge",
        description="Run pdfleet pods on kwok nodes as local processes (see docs/e2e.md).",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/pdfleet-bridge"))
    parser.add_argument("--label", default=OWNED_LABEL, help="label key of the pods to run")
    parser.add_argument("--namespace", default=None, help="only this namespace")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale")
    parser.add_argument("--preset", default=None, help="simulator latency preset")
    parser.add_argument(
        "--probe-period-max", type=float, default=None, help="cap on probe periods (seconds)"
    )
    parser.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="IMAGE_GLOB=RUNNER",
        help=f"extra image rule (runners: {', '.join(RUNNERS)}), tried before the role rules",
    )
    parser.add_argument(
        "--engine-root",
        type=Path,
        default=None,
        help=(
            f"the real engine's install (e2e/platform/engine.sh --print-root), "
            f"for {REAL_ENGINE_IMAGE}"
        ),
    )
    args = parser.parse_args(argv)
    rules = tuple(_parse_rule(r) for r in args.rule) + DEFAULT_RULES
    settings = BridgeSettings(
        kubeconfig=args.kubeconfig.resolve(),
        log_dir=args.log_dir.resolve(),
        owned_label=args.label,
        namespace=args.namespace,
        time_scale=args.time_scale,
        sim_preset=args.preset,
        engine_root=args.engine_root,
        probe_period_max_s=args.probe_period_max,
        rules=rules,
    )
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=[
            logging.StreamHandler(),
            logging.FileHandler(settings.log_dir / "bridge.log"),
        ],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe otherwise
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with Bridge(settings):
        log.info("bridge running; logs in %s", settings.log_dir)
        done.wait()
    return 0


def _parse_rule(text: str) -> RunnerRule:
    image, eq, runner = text.rpartition("=")
    if not eq or runner not in RUNNERS:
        raise SystemExit(
            f"--rule {text!r}: expected IMAGE_GLOB=RUNNER, RUNNER in {sorted(RUNNERS)}"
        )
    return RunnerRule(runner, image=image)


if __name__ == "__main__":
    sys.exit(main())
