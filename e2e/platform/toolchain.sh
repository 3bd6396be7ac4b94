#!/usr/bin/env bash
# Build the local Kubernetes toolchain used by the integration tests and the demo.
#
# Every binary is compiled from the Go module proxy at a pinned version and stored
# in a cache OUTSIDE the checkout, keyed by those versions:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/toolchain/<key>/bin
#
# Usage:
#   e2e/platform/toolchain.sh                  build whatever is missing (no-op when complete)
#   e2e/platform/toolchain.sh --print-bin-dir  print the bin dir and exit (builds nothing)
#   e2e/platform/toolchain.sh --check          exit 1 (listing what is missing) unless complete
#
# Binaries are built one at a time (the build machines have few cores), with
# -trimpath -ldflags "-s -w"; GOCACHE and GOMODCACHE stay at Go's defaults, so a
# second build on the same machine is fast. See docs/testinfra.md.
#
# Two runs at once (`make demo` beside `make test`) wait for each other on <key>.lock, and
# the build goes into <key>.partial, renamed to <key> when complete (e2e/platform/cachelock.sh):
# <key>/bin is either absent or complete. Each binary prints a progress line, step k of n.
set -euo pipefail

# ---- pinned versions (change any of them and the cache key changes) -------------
K8S_VERSION=1.36.3          # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
ETCD_VERSION=3.6.16         # newest 3.6.x on the proxy (3.6.10, which kwok names, is not served)
KWOK_VERSION=0.8.0          # kwok + kwokctl; built against k8s 0.36.x
HELM_VERSION=3.22.0
PROMETHEUS_MODULE=0.316.0   # github.com/prometheus/prometheus v0.316.0 == Prometheus 3.16.0
PROMETHEUS_VERSION=3.16.0
RECIPE=1                    # bump when the build flags below change

KEY="k8s${K8S_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-helm${HELM_VERSION}-prom${PROMETHEUS_VERSION}-r${RECIPE}"
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet/toolchain/${KEY}"
BIN="${ROOT}/bin"

BINARIES=(kwok kwokctl etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler
          kubectl helm prometheus promtool)

# missing_binaries [ROOT]: the binaries ROOT/bin lacks (default: the cache's).
missing_binaries() {
  local b bin="${1:-$ROOT}/bin"
  for b in "${BINARIES[@]}"; do
    [[ -x "${bin}/${b}" ]] || echo "$b"
  done
}

toolchain_complete() { [[ -z "$(missing_binaries "$1")" ]]; }

case "${1:-}" in
  --print-bin-dir) echo "$BIN"; exit 0 ;;
  --check)
    m=$(missing_binaries)
    if [[ -n "$m" ]]; then echo "missing in ${BIN}:" $m >&2; exit 1; fi
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-bin-dir|--check]" >&2; exit 2 ;;
esac

if toolchain_complete "$ROOT"; then
  echo "toolchain complete: ${BIN}"
  exit 0
fi

log() { printf '[toolchain %(%H:%M:%S)T] %s\n' -1 "$*"; }

# ---- prerequisites -------------------------------------------------------------------
# Only the host tools the scripts need; Go itself (>= 1.26) must already be installed
# because Debian does not package a new enough one.
ensure_apt_packages() {
  local need=()
  command -v ip >/dev/null || need+=(iproute2)
  command -v unshare >/dev/null || need+=(util-linux)
  [[ -e /etc/ssl/certs/ca-certificates.crt ]] || need+=(ca-certificates)
  if ((${#need[@]})); then
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    log "installing apt packages: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
  fi
}
ensure_apt_packages

command -v go >/dev/null || { echo "go (>= 1.26) is required on PATH" >&2; exit 1; }
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
((go_minor >= 26)) || { echo "go >= 1.26 required, found $(go env GOVERSION)" >&2; exit 1; }

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# Low priority: the machine is shared with editors and test runs.
GO="nice -n 10 go"

# new_module DIR: an empty wrapper module with upstream's GODEBUG defaults.
new_module() {
  rm -rf "$1"; mkdir -p "$1"
  printf 'module example.invalid/%s\n\ngo 1.26.0\n\ngodebug default=go1.26\n' "$(basename "$1")" > "$1/go.mod"
}

STEP=0
# build NAME PKG [extra go build args...]: build one binary into $BIN atomically.
build() {
  local name=$1 pkg=$2; shift 2
  STEP=$((STEP + 1))
  local step="step ${STEP} of ${#BINARIES[@]}"
  if [[ -x "${BIN}/${name}" ]]; then log "${step}: have ${name}"; return; fi
  log "${step}: building ${name} (${pkg}), $(((SECONDS - T_START) / 60)) min so far"
  local t0=$SECONDS
  $GO build -trimpath "$@" -o "${BIN}/.${name}.tmp" "$pkg"
  mv "${BIN}/.${name}.tmp" "${BIN}/${name}"
  log "${step}: built ${name} in $((SECONDS - t0))s"
}

# build_toolchain DIR: every binary into DIR/bin (run by locked_build, in a subshell, under
# the lock; DIR is <key>.partial).
build_toolchain() {
  BIN="$1/bin"
  SRC="$1/src"   # throw-away wrapper modules (go.mod files only)
  mkdir -p "$BIN" "$SRC"
  log "building ${#BINARIES[@]} binaries into ${1} (about 40 minutes on 2 cores the first time)"

  # ---- kwok / kwokctl: no replace directives, version constants are hard-coded ------------
  M="$SRC/kwok"; new_module "$M"; cd "$M"
  $GO get -tool "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}" "sigs.k8s.io/kwok/cmd/kwokctl@v${KWOK_VERSION}"
  build kwok sigs.k8s.io/kwok/cmd/kwok -ldflags "-s -w"
  build kwokctl sigs.k8s.io/kwok/cmd/kwokctl -ldflags "-s -w"

  # ---- etcd: server/v3's own replaces break `go install`, a wrapper module works ---------
  M="$SRC/etcd"; new_module "$M"; cd "$M"
  $GO get -tool "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" "go.etcd.io/etcd/etcdctl/v3@v${ETCD_VERSION}"
  build etcd go.etcd.io/etcd/server/v3 -ldflags "-s -w"
  build etcdctl go.etcd.io/etcd/etcdctl/v3 -ldflags "-s -w"

  # ---- Kubernetes: pin every ./staging module to the matching v0.Y.Z tag -----------------
  M="$SRC/k8s"; new_module "$M"; cd "$M"
  K8S_MINOR=${K8S_VERSION#1.}; K8S_MINOR=${K8S_MINOR%%.*}
  STAGING="v0.${K8S_VERSION#1.}"
  gomod=$($GO mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [[ -f "$gomod" ]] || { echo "could not download k8s.io/kubernetes@v${K8S_VERSION}" >&2; exit 1; }
  staged=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$gomod")
  [[ -n "$staged" ]] || { echo "no staging replaces found in $gomod" >&2; exit 1; }
  for m in $staged; do go mod edit -replace="${m}=${m}@${STAGING}"; done
  log "pinned $(wc -w <<<"$staged") staging modules at ${STAGING}"
  K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  tools=(); for c in "${K8S_CMDS[@]}"; do tools+=("k8s.io/kubernetes/cmd/${c}@v${K8S_VERSION}"); done
  $GO get -tool "${tools[@]}"
  # Stamp the version like hack/lib/version.sh does, so skew checks see v1.36.x, not v0.0.0.
  K8S_LDFLAGS="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X ${p}.gitVersion=v${K8S_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${K8S_MINOR}"
    K8S_LDFLAGS+=" -X ${p}.gitTreeState=clean -X ${p}.buildDate=1970-01-01T00:00:00Z"
  done
  for c in "${K8S_CMDS[@]}"; do
    build "$c" "k8s.io/kubernetes/cmd/$c" -tags selinux,notest,grpcnotrace -ldflags "$K8S_LDFLAGS"
  done

  # ---- helm: plain `go install`-able module; built the same way for uniformity -----------
  M="$SRC/helm"; new_module "$M"; cd "$M"
  $GO get -tool "helm.sh/helm/v3/cmd/helm@v${HELM_VERSION}"
  build helm helm.sh/helm/v3/cmd/helm \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"

  # ---- prometheus: without the builtinassets tag the web UI is absent, the HTTP API works --
  M="$SRC/prometheus"; new_module "$M"; cd "$M"
  $GO get -tool "github.com/prometheus/prometheus/cmd/prometheus@v${PROMETHEUS_MODULE}" \
                "github.com/prometheus/prometheus/cmd/promtool@v${PROMETHEUS_MODULE}"
  PROM_LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION}"
  PROM_LDFLAGS+=" -X github.com/prometheus/common/version.Branch=HEAD"
  # Only the kubernetes SD provider (file and http SD are always built in): far fewer packages.
  PROM_TAGS=remove_all_sd,enable_kubernetes_sd
  build prometheus github.com/prometheus/prometheus/cmd/prometheus -tags "$PROM_TAGS" -ldflags "$PROM_LDFLAGS"
  build promtool github.com/prometheus/prometheus/cmd/promtool -tags "$PROM_TAGS" -ldflags "$PROM_LDFLAGS"

  m=$(missing_binaries "$1")
  [[ -z "$m" ]] || { echo "still missing:" $m >&2; exit 1; }
}

# shellcheck source=e2e/platform/cachelock.sh
source "$(dirname "${BASH_SOURCE[0]}")/cachelock.sh"
T_START=$SECONDS
locked_build "$ROOT" toolchain_complete build_toolchain
log "toolchain complete in $((SECONDS - T_START))s: ${BIN}"
