"""Static checks of operator/Dockerfile against the chart that runs it (no image build here)."""

from __future__ import annotations

import re

import yaml

from tests.spec_cases import ROOT

DOCKERFILE = ROOT / "operator" / "Dockerfile"
VALUES = ROOT / "charts" / "pdfleet" / "values.yaml"


def _text() -> str:
    return DOCKERFILE.read_text()


def _values() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load(VALUES.read_text())
    return loaded


def test_slim_python_base_matching_requires_python() -> None:
    match = re.search(r"^ARG PYTHON_IMAGE=python:3\.(\d+)-slim-\w+$", _text(), re.M)
    assert match and int(match.group(1)) >= 11
    assert ":latest" not in _text()


def test_installs_the_distribution_without_extras() -> None:
    # Its environment is the pinned lock (tests/unit/images checks the lock against
    # pyproject.toml), then the checkout alone with --no-deps.
    installs = re.findall(r"pip install ([^\n\\]*)", _text())
    assert installs == [
        "--no-compile --only-binary=:all: --no-deps ",
        "--no-compile --no-deps --no-build-isolation . ",
    ]
    assert "-r operator/requirements.txt" in _text()
    assert "[sim]" not in _text() and "[dev]" not in _text()


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    users = re.findall(r"^USER (\d+):(\d+)$", _text(), re.M)
    assert users, "the final stage sets a numeric user"
    uid, gid = map(int, users[-1])
    pod = _values()["podSecurityContext"]
    assert isinstance(pod, dict)
    assert uid == pod["runAsUser"] != 0 and gid == pod["runAsGroup"]


def test_entrypoint_and_ports_match_the_chart() -> None:
    text = _text()
    assert re.search(r'^ENTRYPOINT \["pdfleet"\]$', text, re.M)
    operator = _values()["operator"]
    assert isinstance(operator, dict)
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.*)$", text, re.M) for p in line.split()}
    assert exposed == {operator["metricsPort"], operator["healthPort"]}


def test_no_bytecode_writes_at_run_time() -> None:
    # The root filesystem is read-only in the chart: compile at build time, never at start.
    text = _text()
    assert "PYTHONDONTWRITEBYTECODE=1" in text and "compileall" in text
    assert not re.search(r"^ADD ", text, re.M)
