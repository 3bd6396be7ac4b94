#!/usr/bin/env bash
# Run a command inside a fresh, private network namespace.
#
#   e2e/platform/netns.sh CMD [ARGS...]      e.g. e2e/platform/netns.sh .venv/bin/pytest tests/e2e
#   e2e/platform/netns.sh bash               an interactive shell in a new namespace
#   e2e/platform/netns.sh --join PID CMD...  run CMD in the namespace started by
#                                            `e2e/platform/netns.sh` process PID
#                                            ($PDFLEET_NETNS_PID inside it)
#
# The namespace has only `lo`: it is brought up and the pod CIDR (default
# 10.244.0.0/16, override with PDFLEET_POD_CIDR) is routed locally, so every pod IP
# that kwok hands out is a bindable, reachable local address, and no packet can leave
# the machine (there is no other interface and no default route). Install everything
# (apt, pip, e2e/platform/toolchain.sh) BEFORE entering: registries are unreachable inside.
#
# CMD also gets its own PID namespace: when CMD exits, or is killed, every process left
# in there (a local cluster included) is killed by the kernel, so an aborted test run
# never leaves a control plane behind.
#
# As root this uses `unshare --net --pid`; other users get a user namespace as well
# (`--user --map-root-user`). PDFLEET_NETNS=1 is exported inside.
set -euo pipefail

POD_CIDR=${PDFLEET_POD_CIDR:-10.244.0.0/16}

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

if [[ "${1:-}" == "--inside" ]]; then
  # PID 1 of the new namespaces: configure the network, run CMD in the foreground
  # (an interactive shell keeps the terminal), and reap orphans until it exits.
  shift
  ip link set lo up
  ip route add local "$POD_CIDR" dev lo
  export PDFLEET_NETNS=1 PDFLEET_POD_CIDR=$POD_CIDR
  rc=0
  "$@" || rc=$?
  exit "$rc"
fi

(($#)) || usage

if [[ "$1" == "--join" ]]; then
  (($# >= 3)) || usage
  outer=$2; shift 2
  # The namespaces belong to the child of that unshare process (PID 1 inside).
  target=$(pgrep -o -P "$outer" || true)
  [[ -n "$target" && -e "/proc/${target}/ns/net" ]] || { echo "no namespace under pid ${outer}" >&2; exit 1; }
  export PDFLEET_NETNS=1 PDFLEET_POD_CIDR=$POD_CIDR PDFLEET_NETNS_PID=$outer
  if [[ $(id -u) -eq 0 ]]; then
    exec nsenter --target "$target" --net --pid --mount -- "$@"
  fi
  exec nsenter --target "$target" --user --net --pid --mount --preserve-credentials -- "$@"
fi

[[ "$1" == -* ]] && usage

# This process becomes `unshare`; --kill-child takes the namespace down with it.
export PDFLEET_NETNS_PID=$$
flags=(--net --pid --fork --kill-child --mount-proc)
[[ $(id -u) -eq 0 ]] || flags=(--user --map-root-user "${flags[@]}")
exec unshare "${flags[@]}" -- "$0" --inside "$@"
