"""Static checks of worker-image/Dockerfile (no image build here; hadolint-style rules)."""

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


def test_nixl_pinned_to_an_installable_wheel() -> None:
    # dataplane.md: nixl==1.5.2 depends on an unpublished nixl-cu12==1.5.2; pin 1.5.1.
    text = _text()
    assert re.search(r"^ARG NIXL_PACKAGE=nixl-cu12$", text, re.M)
    assert re.search(r"^ARG NIXL_VERSION=1\.5\.1$", text, re.M)


def test_hadolint_style_rules() -> None:
    text = _text()
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    assert runs
    for line in runs:
        if "pip install" in line:
            assert "--no-cache-dir" in line  # DL3042
    assert "apt-get install" not in text or "--no-install-recommends" in text  # DL3015
    assert not re.search(r"^ADD ", text, re.M)  # DL3020: COPY for local files
    assert re.search(r"^SHELL \[.*pipefail", text, re.M)  # DL4006


def test_entrypoint_is_the_agent() -> None:
    assert 'ENTRYPOINT ["pdfleet-agent", "launch"]' in _text()
