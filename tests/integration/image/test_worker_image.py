"""The worker image's Python environment, as far as a machine without Docker can show it.

worker-image/Dockerfile installs NIXL as vLLM imports it: the `nixl` meta package and the
backend wheel matching the CUDA major of the torch in the image. Here pip resolves the
image's pins (vLLM, NIXL) from PyPI for the image's Python, which fixes the torch and so
the backend the build step selects; and the real-engine install (e2e/platform/engine.sh: PyPI's
torch, a CUDA 13 build, with the same NIXL pair) imports NIXL the way vLLM does. Needs
PyPI (outside the private network namespace) and `make engine`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.platform.real_engine import EngineMissingError, engine_root

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "worker-image" / "Dockerfile"
#: The vLLM 0.33 image's Python.
IMAGE_PYTHON = "3.12"

pytestmark = pytest.mark.timeout(900)


def dockerfile_arg(name: str) -> str:
    found = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert found, f"ARG {name} missing from {DOCKERFILE}"
    return found.group(1)


def cuda_major(requires_dist: list[str]) -> str | None:
    """The CUDA major a torch wheel is built for, from its requirements (cuda-toolkit or the
    nvidia-*-cuXX wheels)."""
    for req in requires_dist:
        found = re.match(r"cuda-toolkit\S*==(\d+)\.", req) or re.match(r"nvidia-\S+-cu(\d+)\b", req)
        if found:
            return found.group(1)
    return None


def test_the_images_pins_resolve_to_a_torch_whose_cuda_matches_the_nixl_backend(
    tmp_path: Path,
) -> None:
    vllm = dockerfile_arg("VLLM_VERSION").removeprefix("v")
    nixl = dockerfile_arg("NIXL_VERSION")
    report = tmp_path / "report.json"
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    pip += ["--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--report", str(report)]
    # The meta package offers the backends it knows; the image keeps the one torch asks for.
    wanted = [f"vllm=={vllm}", f"nixl=={nixl}"]
    proc = subprocess.run([*pip, *wanted], capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = {
        i["metadata"]["name"].lower(): i["metadata"]
        for i in json.loads(report.read_text())["install"]
    }
    torch = installed["torch"]
    major = cuda_major(torch.get("requires_dist", []))
    assert major is not None, torch.get("requires_dist")
    backend = installed.get(f"nixl-cu{major}")
    assert backend is not None and backend["version"] == nixl, sorted(installed)
    print(f"vllm {vllm} -> torch {torch['version']} (CUDA {major}) -> nixl-cu{major} {nixl}")


def test_nixl_imports_the_way_vllm_imports_it_beside_a_cuda_13_torch() -> None:
    try:
        root = engine_root()
    except EngineMissingError as err:
        pytest.fail(str(err), pytrace=False)
    code = (
        "import torch, nixl._api, importlib.metadata as m;"
        "print(torch.version.cuda, m.version('nixl'), m.version('nixl-cu13'))"
    )
    proc = subprocess.run(
        [str(root / "venv" / "bin" / "python"), "-c", code], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cuda, nixl, backend = proc.stdout.split()
    assert cuda.split(".")[0] == "13" and nixl == backend == dockerfile_arg("NIXL_VERSION")
