"""Static checks of worker-image/Dockerfile specific to the worker: vLLM and NIXL (no image build
here). The checks every Dockerfile gets (hadolint, a pinned base, pinned pip installs, the user)
are in tests/unit/images/test_dockerfiles.py."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[3] / "worker-image" / "Dockerfile"


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


def test_entrypoint_is_the_agent() -> None:
    assert 'ENTRYPOINT ["pdfleet-agent", "launch"]' in _text()
