"""The samples and the invalid-spec cases, shared by the unit and integration tiers."""

from __future__ import annotations

import copy
import pathlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLES_DIR = ROOT / "crds" / "samples"
CASES_FILE = ROOT / "tests" / "cases" / "invalid_specs.yaml"
HOSTILE_FILE = ROOT / "tests" / "cases" / "hostile_specs.yaml"


def sample(name: str) -> dict[str, Any]:
    """A sample InferenceService from crds/samples/ as a plain object."""
    loaded: dict[str, Any] = yaml.safe_load((SAMPLES_DIR / f"{name}.yaml").read_text())
    return loaded


def sample_names() -> list[str]:
    return sorted(path.stem for path in SAMPLES_DIR.glob("*.yaml"))


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def normalize_path(path: str) -> str:
    """Field paths as both validators spell them: "a[0].b" and "a.0.b" become "a.0.b"."""
    return re.sub(r"\[(\d+)\]", r".\1", path)


@dataclass(frozen=True)
class InvalidCase:
    id: str
    obj: dict[str, Any]
    field: str
    strict: bool
    message: str = ""
    """A part of the refusal's text, where the case says what it must be."""


def invalid_cases(path: pathlib.Path = CASES_FILE) -> list[InvalidCase]:
    cases = []
    for raw in yaml.safe_load(path.read_text()):
        obj = merge_patch(sample(raw.get("base", "minimal")), raw["patch"])
        strict = bool(raw.get("strict"))
        cases.append(InvalidCase(raw["id"], obj, raw["field"], strict, raw.get("message", "")))
    return cases
