"""The operator and router images' Python environments, as far as a machine without Docker can
show them.

operator/Dockerfile and router-image/Dockerfile install a lock file (every distribution pinned)
with --no-deps. Here pip resolves each lock WITH dependencies from PyPI, as wheels for the
images' CPython 3.12 on both architectures the release builds (linux/amd64, linux/arm64;
the base is Debian bookworm, glibc 2.36): the resolution must be exactly the lock, so nothing
is missing and nothing conflicts. (pip evaluates environment markers for the interpreter
running it, not the target; none of the pinned requirements has a marker that tells 3.11
from 3.12.) Then the image's build steps run in a virtual environment: the lock with --no-deps,
`pip check`, and what the image runs (`vllm-router --help`; pdfleet built from operator/src
alone, `pdfleet --help` and the operator's modules imported). Needs PyPI.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[3]
LOCKS = {
    "operator": REPO / "operator" / "requirements.txt",
    "router": REPO / "router-image" / "requirements.txt",
}
IMAGE_PYTHON = "3.12"
#: manylinux tags a bookworm (glibc 2.36) image accepts.
GLIBC_MINORS = range(17, 37)

pytestmark = pytest.mark.timeout(900)


def pins(lock: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = version
    return found


def pip(*args: str, python: str = sys.executable, timeout: float = 600) -> str:
    proc = subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize("image", sorted(LOCKS))
def test_the_lock_resolves_to_itself_for_the_images_python(
    image: str, arch: str, tmp_path: Path
) -> None:
    platforms = [f"manylinux_2_{m}_{arch}" for m in GLIBC_MINORS]
    platforms += [f"manylinux2014_{arch}", f"linux_{arch}"]
    report = tmp_path / "report.json"
    args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--only-binary=:all:"]
    args += ["--python-version", IMAGE_PYTHON, "--implementation", "cp"]
    for platform in platforms:
        args += ["--platform", platform]
    pip(*args, "--report", str(report), "-r", str(LOCKS[image]))
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert resolved == pins(LOCKS[image])


def _venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


def test_the_router_image_environment_installs_and_runs(tmp_path: Path) -> None:
    python = str(_venv(tmp_path / "venv"))
    pip("install", "--quiet", "--only-binary=:all:", "--no-deps", "-r", str(LOCKS["router"]),
        python=python)  # fmt: skip
    pip("check", python=python)
    router = tmp_path / "venv" / "bin" / "vllm-router"
    proc = subprocess.run([router, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The flags the renderer passes (operator/src/pdfleet/render/router.py) exist.
    for flag in ("--vllm-pd-disaggregation", "--service-discovery", "--prefill-selector"):
        assert flag in proc.stdout


def test_the_operator_image_environment_installs_from_operator_src_alone(tmp_path: Path) -> None:
    # The image's build context: pyproject.toml, README.md and operator/src, nothing else.
    context = tmp_path / "src"
    (context / "operator").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, context / name)
    shutil.copytree(REPO / "operator" / "src", context / "operator" / "src")
    dockerfile = (REPO / "operator" / "Dockerfile").read_text()
    setuptools = re.search(r"^ARG SETUPTOOLS_VERSION=(\S+)$", dockerfile, re.M)
    assert setuptools
    python = str(_venv(tmp_path / "venv"))
    pip("install", "--quiet", "--only-binary=:all:", "--no-deps", "-r", str(LOCKS["operator"]),
        f"setuptools=={setuptools.group(1)}", python=python)  # fmt: skip
    pip("install", "--quiet", "--no-deps", "--no-build-isolation", str(context), python=python)
    pip("check", python=python)
    code = "import pdfleet.cli, pdfleet.handlers, pdfleet.controller, pdfleet_wire"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = tmp_path / "venv" / "bin" / "pdfleet"
    proc = subprocess.run([cli, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
