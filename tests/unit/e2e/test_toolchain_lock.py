"""The toolchain cache's lock (e2e/platform/cachelock.sh, used by e2e/platform/toolchain.sh).

Two builds started side by side wait for each other and never see a half-built directory.
Shown on a fake build step, and on toolchain.sh itself with a fake `go` on PATH that writes a
stub for each binary: no real build, no network, a few seconds.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CACHELOCK = REPO / "e2e" / "platform" / "cachelock.sh"
TOOLCHAIN = REPO / "e2e" / "platform" / "toolchain.sh"

# A build step that takes a while and writes its result in two parts: a reader that saw DEST
# between them would find `first` without `second`.
FAKE_BUILD = f"""
set -euo pipefail
source {CACHELOCK}
complete() {{ [[ -f "$1/second" ]]; }}
build() {{
  echo "$$" >> "$RUNS"
  echo one > "$1/first"
  sleep "${{BUILD_SECONDS:-1}}"
  [[ -z "${{FAIL:-}}" ]] || false
  echo two > "$1/second"
}}
locked_build "$DEST" complete build
"""


def _start(dest: Path, runs: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", "-c", FAKE_BUILD],
        env={**os.environ, "DEST": str(dest), "RUNS": str(runs), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _Watcher(threading.Thread):
    """Looks at DEST every few milliseconds; records anything it saw that was incomplete."""

    def __init__(self, dest: Path) -> None:
        super().__init__(daemon=True)
        self.dest = dest
        self.stop = threading.Event()
        self.partial: list[list[str]] = []
        self.looks = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                names = sorted(p.name for p in self.dest.iterdir())
            except FileNotFoundError:
                names = None
            if names is not None and names != ["first", "second"]:
                self.partial.append(names)
            self.looks += 1
            time.sleep(0.005)


def test_two_builds_side_by_side_build_once_and_never_show_half_a_result(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "cache" / "key"
    runs = tmp_path / "runs"
    watcher = _Watcher(dest)
    watcher.start()
    first = _start(dest, runs)
    time.sleep(0.2)
    second = _start(dest, runs)
    outs = [p.communicate(timeout=30) for p in (first, second)]
    watcher.stop.set()
    watcher.join()
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    # The second waited on the lock, then found the first one's result and built nothing.
    assert "waiting for another build" in outs[1][1]
    assert len(runs.read_text().split()) == 1
    assert sorted(p.name for p in dest.iterdir()) == ["first", "second"]
    assert not (tmp_path / "cache" / "key.partial").exists()
    assert watcher.looks > 50 and watcher.partial == []


def test_a_failed_build_leaves_no_result_and_the_next_one_resumes(tmp_path: Path) -> None:
    dest = tmp_path / "key"
    runs = tmp_path / "runs"
    failed = _start(dest, runs, FAIL="1", BUILD_SECONDS="0")
    _, err = failed.communicate(timeout=30)
    assert failed.returncode != 0
    assert "what was built is kept" in err
    assert not dest.exists()
    assert (tmp_path / "key.partial" / "first").is_file()
    retry = _start(dest, runs, BUILD_SECONDS="0")
    assert retry.communicate(timeout=30) and retry.returncode == 0
    assert sorted(p.name for p in dest.iterdir()) == ["first", "second"]
    assert len(runs.read_text().split()) == 2


def test_an_incomplete_cache_from_an_older_script_is_finished_not_trusted(tmp_path: Path) -> None:
    dest = tmp_path / "key"
    dest.mkdir()
    (dest / "first").write_text("old\n")
    runs = tmp_path / "runs"
    proc = _start(dest, runs, BUILD_SECONDS="0")
    assert proc.communicate(timeout=30) and proc.returncode == 0
    assert sorted(p.name for p in dest.iterdir()) == ["first", "second"]


# ---- toolchain.sh itself, with a fake `go` ------------------------------------------------

FAKE_GO = """#!/usr/bin/env bash
# Answers what toolchain.sh asks of go; `go build -o OUT` writes a stub after a pause.
set -euo pipefail
case "$1" in
  env) echo go1.26.0 ;;
  mod)
    if [[ "$2" == download ]]; then
      printf 'k8s.io/api => ./staging/src/k8s.io/api\\n' > "$FAKE_GO_DIR/kubernetes.mod"
      printf '{\\n\\t"GoMod": "%s",\\n}\\n' "$FAKE_GO_DIR/kubernetes.mod"
    fi ;;
  get) ;;
  build)
    while [[ "$1" != -o ]]; do shift; done
    echo "$2" >> "$FAKE_GO_DIR/builds"
    sleep 0.2
    printf '#!/bin/sh\\n' > "$2"; chmod +x "$2" ;;
  *) echo "fake go: unexpected $*" >&2; exit 1 ;;
esac
"""


def test_toolchain_sh_twice_at_once_builds_each_binary_once_with_progress(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "fakego"
    fake.mkdir()
    (fake / "go").write_text(FAKE_GO)
    (fake / "go").chmod(0o755)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PATH": f"{fake}:{os.environ['PATH']}",
        "FAKE_GO_DIR": str(fake),
    }
    bin_dir = subprocess.run(
        [TOOLCHAIN, "--print-bin-dir"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert bin_dir.startswith(str(tmp_path / "cache" / "pdfleet" / "toolchain"))
    procs = []
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                [TOOLCHAIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
        time.sleep(0.3)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    builds = (fake / "builds").read_text().split()
    assert len(builds) == 11 and len(set(builds)) == 11, builds
    # Built in the staging directory, renamed into place as a whole.
    assert all(".partial/bin/" in b for b in builds)
    assert "waiting for another build" in outs[1]
    for k, name in enumerate(["kwok", "kwokctl", "etcd"], start=1):
        assert f"step {k} of 11: building {name}" in outs[0]
    assert "step 11 of 11: built promtool" in outs[0]
    check = subprocess.run([TOOLCHAIN, "--check"], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    again = subprocess.run([TOOLCHAIN], env=env, capture_output=True, text=True, check=True)
    assert again.stdout.strip() == f"toolchain complete: {bin_dir}"
    assert len((fake / "builds").read_text().split()) == 11


def test_toolchain_check_reports_a_missing_cache(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    check = subprocess.run([TOOLCHAIN, "--check"], env=env, capture_output=True, text=True)
    assert check.returncode == 1
    assert "missing in" in check.stderr
    assert "kube-apiserver" in check.stderr
