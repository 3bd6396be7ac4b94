# Sourced by e2e/platform/toolchain.sh: build a cache directory under a lock, all or nothing.
#
#   locked_build DEST IS_COMPLETE BUILD
#
# DEST is the directory to produce; IS_COMPLETE DIR succeeds when DIR holds a complete build;
# BUILD DIR builds into DIR, in a subshell with errexit (`cd` and `exit` stay inside it, and a
# failed step stops it). Two builds of the same DEST started side by side wait for each other on
# flock(1) of DEST.lock, and the second finds the first one's result. The build runs in
# DEST.partial and is renamed to DEST only once IS_COMPLETE accepts it: DEST is either absent or
# complete, never half-built, so readers need no lock. A build that stops half-way leaves
# DEST.partial for the next one to resume; a DEST left incomplete by an older script is moved
# there too.

locked_build() {
  local dest=$1 is_complete=$2 build=$3
  local lock="${dest}.lock" stage="${dest}.partial" fd
  mkdir -p "$(dirname "$dest")"
  exec {fd}>"$lock"
  if ! flock --nonblock "$fd"; then
    echo "waiting for another build of ${dest} (lock: ${lock})" >&2
    flock "$fd"
  fi
  if "$is_complete" "$dest"; then
    exec {fd}>&-
    return 0
  fi
  if [[ -d "$dest" ]]; then
    if [[ -d "$stage" ]]; then rm -rf "$dest"; else mv -T "$dest" "$stage"; fi
  fi
  mkdir -p "$stage"
  # In the background and waited for: a subshell in a condition (`if !`, `||`) would run with
  # errexit off, and a failed step would not stop the build.
  local rc=0
  (set -e; "$build" "$stage") &
  wait "$!" || rc=$?
  if ((rc != 0)); then
    echo "build of ${dest} failed (exit ${rc}); what was built is kept in ${stage}" >&2
    exec {fd}>&-
    return "$rc"
  fi
  if ! "$is_complete" "$stage"; then
    echo "build of ${dest} finished incomplete (in ${stage})" >&2
    exec {fd}>&-
    return 1
  fi
  mv -T "$stage" "$dest"
  exec {fd}>&-
}
