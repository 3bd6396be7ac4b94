"""An InferenceService's health as GitOps tools compute it, and as docs/gitops.md states it.

kstatus is the real library (sigs.k8s.io/cli-utils/pkg/kstatus/status) behind Flux's health
checks, wrapped in a small program, e2e/platform/kstatus, that reads one object on stdin; the
Makefile builds it on first use (`make kstatus`) and names its path (`make kstatus-path`).
The Argo CD side is charts/pdfleet/argocd/health.lua, run by the tests under Lua 5.1.

docs/gitops.md's health table says which state of the status reads as what, first matching
row first; `table_state` says which row a status is in, `health_table` reads the table, so a
test holds both tools to the page users read. Both are pure.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.platform.cluster import REPO_ROOT
from e2e.platform.tools import built_tool
from pdfleet.reconcile.status import condition_status

GITOPS_DOC = REPO_ROOT / "docs" / "gitops.md"
TABLE_HEADER = "| state | kstatus | Argo CD | when |"

# The health table's rows (their first cell), in the order the table lists them.
STALE = "`status.observedGeneration` < `metadata.generation`"
STALLED = "`Stalled=True`"
PROGRESSING = "`Reconciling=True`, `Ready=False`"
SERVING_WHILE_RECONCILING = "`Ready=True`, `Reconciling=True`"
CURRENT = "`Ready=True`, `Reconciling=False`"
STATES = (STALE, STALLED, PROGRESSING, SERVING_WHILE_RECONCILING, CURRENT)


@dataclass(frozen=True)
class Health:
    status: str
    message: str


def parse_kstatus_output(text: str) -> Health:
    """The program's one JSON line: {"status": ..., "message": ...}."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        raise ValueError(f"not a kstatus result: {text!r}")
    return Health(status=data["status"], message=str(data.get("message", "")))


def kstatus_binary(environ: Mapping[str, str] | None = None) -> Path:
    """The program `make kstatus` builds (`PDFLEET_KSTATUS` names another build)."""
    return built_tool(
        "kstatus", "PDFLEET_KSTATUS", "kstatus (e2e/platform/kstatus, built with Go)", environ
    )


def kstatus(obj: Mapping[str, Any], binary: Path) -> Health:
    """What kstatus computes for `obj`, a whole object as the API server returns it."""
    result = subprocess.run(
        [str(binary)], input=json.dumps(obj), capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"kstatus failed ({result.returncode}): {result.stderr.strip()}")
    return parse_kstatus_output(result.stdout)


def _condition_true(status: Mapping[str, Any], kind: str) -> bool:
    return condition_status(status, kind) == "True"


def table_state(obj: Mapping[str, Any]) -> str | None:
    """The row of docs/gitops.md's health table that `obj`'s status is in (one of STATES);
    None when no row describes it."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return STALE
    if _condition_true(status, "Stalled"):
        return STALLED
    ready = _condition_true(status, "Ready")
    if _condition_true(status, "Reconciling"):
        return SERVING_WHILE_RECONCILING if ready else PROGRESSING
    return CURRENT if ready else None


def health_table(markdown: str) -> dict[str, tuple[str, str]]:
    """docs/gitops.md's health table: {state: (kstatus, Argo CD)}, in the page's order."""
    lines = markdown.splitlines()
    try:
        start = lines.index(TABLE_HEADER) + 2  # past the header and its |---| line
    except ValueError:
        raise ValueError(f"no table headed {TABLE_HEADER!r}") from None
    table: dict[str, tuple[str, str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) != 4:
            raise ValueError(f"a row of the health table without 4 cells: {line!r}")
        table[cells[0]] = (cells[1], cells[2])
    return table
