"""The Go tools a test tier needs beside the toolchain (kstatus, the OCI registry), as the
Makefile builds them: each under its own versioned cache directory, whose path only the
Makefile names (`make -s <tool>-path`), so a version bump is one edit there."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from e2e.platform.cluster import REPO_ROOT


class ToolMissingError(RuntimeError):
    """A tool the Makefile builds is not built (the message names the make target)."""


def built_tool(
    target: str, override: str, what: str, environ: Mapping[str, str] | None = None
) -> Path:
    """The binary `make <target>` builds, or the one the `override` variable names; raises
    ToolMissingError, naming `make <target>` and saying `what` it is, when it is not there."""
    environ = os.environ if environ is None else environ
    if environ.get(override):
        path = Path(environ[override])
    else:
        # A calling make's flags (jobserver, directory messages) are not for this one.
        env = {k: v for k, v in environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        out = subprocess.run(
            ["make", "-s", "--no-print-directory", "-C", str(REPO_ROOT), f"{target}-path"],
            capture_output=True, text=True, env=env, timeout=30, check=True,
        )  # fmt: skip
        path = Path(out.stdout.strip())
    if not os.access(path, os.X_OK):
        raise ToolMissingError(f"{what} is not built ({path}): run `make {target}`")
    return path
