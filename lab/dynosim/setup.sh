#!/usr/bin/env bash
# Install DynoSim (Dynamo's replay simulator) for `make bench-autoscale-dynosim`.
#
# The install lives OUTSIDE the checkout, keyed by every pinned version:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/dynosim/<key>/venv        ai-dynamo, its runtime,
#                                                                    aiconfigurator-core
#   ${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/dynosim/<key>/timing.npz  the timing table (built
#                                                                    by the benchmark if missing)
#
# Usage:
#   lab/dynosim/setup.sh                 install whatever is missing (no-op when complete)
#   lab/dynosim/setup.sh --print-root    print the install root and exit (installs nothing)
#   lab/dynosim/setup.sh --check         exit 1 unless complete
#
# No torch: DynoSim's replay needs only the wheels' own requirements (numpy, pandas,
# transformers without a model, ...). This checkout's operator/, worker-image/ and lab/
# sources are put on the venv's path by a .pth file, rewritten on every call (the venv is
# shared by checkouts; the last one to call wins), with the few packages the policy and the
# lab import that DynoSim does not already bring.
set -euo pipefail

AI_DYNAMO_VERSION=1.3.1
AI_DYNAMO_RUNTIME_VERSION=1.3.1
AICONFIGURATOR_CORE_VERSION=0.12.0
PYTHON=${PDFLEET_DYNOSIM_PYTHON:-python3}
RECIPE=1                    # bump when the install steps change

KEY="dynamo${AI_DYNAMO_VERSION}-runtime${AI_DYNAMO_RUNTIME_VERSION}-aic${AICONFIGURATOR_CORE_VERSION}-r${RECIPE}"
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/dynosim/${KEY}"
VENV="${ROOT}/venv"
DONE="${ROOT}/.complete"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"

case "${1:-}" in
  --print-root) echo "$ROOT"; exit 0 ;;
  --check)
    [[ -f "$DONE" ]] || { echo "DynoSim not installed in ${ROOT} (run lab/dynosim/setup.sh)" >&2; exit 1; }
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-root|--check]" >&2; exit 2 ;;
esac

log() { printf '[dynosim %(%H:%M:%S)T] %s\n' -1 "$*"; }

link_checkout() {
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "${REPO}/operator/src" "${REPO}/worker-image/src" "${REPO}/lab/src" \
    >"${site}/pdfleet-checkout.pth"
}

mkdir -p "$ROOT"
exec 9>"${ROOT}.lock"
flock 9
if [[ -f "$DONE" ]]; then link_checkout; echo "DynoSim complete: ${ROOT}"; exit 0; fi

T_START=$SECONDS
rm -rf "$VENV"
log "venv ${VENV} ($("$PYTHON" --version))"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
"${PIP[@]}" install --upgrade pip
log "ai-dynamo ${AI_DYNAMO_VERSION}, ai-dynamo-runtime ${AI_DYNAMO_RUNTIME_VERSION}, aiconfigurator-core ${AICONFIGURATOR_CORE_VERSION}"
"${PIP[@]}" install "ai-dynamo==${AI_DYNAMO_VERSION}" \
  "ai-dynamo-runtime==${AI_DYNAMO_RUNTIME_VERSION}" \
  "aiconfigurator-core==${AICONFIGURATOR_CORE_VERSION}"
# What pdfleet.autoscale and pdfleet_lab import beyond DynoSim's own requirements.
"${PIP[@]}" install "pydantic>=2.9,<3" "prometheus-client>=0.20" "PyYAML>=6" "numpy>=1.26"
link_checkout

log "import check"
"$VENV/bin/python" -c '
import dynamo.replay.main, dynamo.mocker, aiconfigurator_core.sdk.engine
import pdfleet.autoscale.policy, pdfleet.autoscale.metrics, pdfleet_lab.dynosim.runtime
from importlib.metadata import version
print("ai-dynamo", version("ai-dynamo"), "aiconfigurator-core", version("aiconfigurator-core"))
' 2>&1 | grep -v 'PyTorch was not found'
touch "$DONE"
log "DynoSim complete in $((SECONDS - T_START))s: ${ROOT}"
