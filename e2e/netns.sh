#!/usr/bin/env bash
# Run a command inside a fresh, private network namespace.
#
#   e2e/netns.sh CMD [ARGS...]       e.g. e2e/netns.sh .venv/bin/pytest tests/integration
#   e2e/netns.sh bash                an interactive shell in a new namespace
#   e2e/netns.sh --join PID CMD...   run CMD in the namespace that process PID is in
#                                    (a second shell next to a running cluster)
#
# The namespace has only `lo`: it is brought up and the pod CIDR (default
# 10.244.0.0/16, override with PDFLEET_POD_CIDR) is routed locally, so every pod IP
# that kwok hands out is a bindable, reachable local address, and no packet can leave
# the machine (there is no other interface and no default route). Install everything
# (apt, pip, e2e/toolchain.sh) BEFORE entering: registries are unreachable inside.
#
# As root this uses `unshare --net`; other users get a user namespace as well
# (`unshare --user --map-root-user --net`). PDFLEET_NETNS=1 is exported inside.
set -euo pipefail

POD_CIDR=${PDFLEET_POD_CIDR:-10.244.0.0/16}

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

if [[ "${1:-}" == "--inside" ]]; then
  # Runs as "root" of the new namespace: configure it, then become CMD.
  shift
  ip link set lo up
  ip route add local "$POD_CIDR" dev lo
  export PDFLEET_NETNS=1 PDFLEET_POD_CIDR=$POD_CIDR
  exec "$@"
fi

(($#)) || usage

if [[ "$1" == "--join" ]]; then
  (($# >= 3)) || usage
  pid=$2; shift 2
  [[ -e "/proc/${pid}/ns/net" ]] || { echo "no such process: ${pid}" >&2; exit 1; }
  export PDFLEET_NETNS=1 PDFLEET_POD_CIDR=$POD_CIDR
  if [[ $(id -u) -eq 0 ]]; then
    exec nsenter --target "$pid" --net -- "$@"
  fi
  exec nsenter --target "$pid" --user --net --preserve-credentials -- "$@"
fi

[[ "$1" == -* ]] && usage

if [[ $(id -u) -eq 0 ]]; then
  exec unshare --net -- "$0" --inside "$@"
fi
exec unshare --user --map-root-user --net -- "$0" --inside "$@"
