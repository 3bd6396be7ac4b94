"""Invariants of the repository layout that tools do not check by themselves."""

from __future__ import annotations

from tests.spec_cases import ROOT


def test_operator_folder_is_not_a_python_package() -> None:
    # A top-level package named `operator` would shadow the standard library's `operator`.
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_no_python_in_operator_outside_src() -> None:
    stray = [
        path.relative_to(ROOT)
        for path in (ROOT / "operator").rglob("*.py")
        if (ROOT / "operator" / "src") not in path.parents
    ]
    assert not stray


def test_required_top_level_layout() -> None:
    for name in (
        "pyproject.toml",
        "operator",
        "crds",
        "worker-image",
        "router-image",
        "charts",
        "e2e",
        "tests",
        "README.md",
        "Makefile",
    ):
        assert (ROOT / name).exists(), name
