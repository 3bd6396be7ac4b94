"""The release workflow (.github/workflows/release.yml) against the repository it releases.

actionlint (`make lint`) checks that the workflow is valid; these tests check that it releases
what the repository defines: every Dockerfile, with provenance and an SBOM, under the image
names the chart and the renderer use; the chart to an OCI registry with the toolchain's Helm;
the Python distribution last; every action pinned to a commit, the tag named beside it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pdfleet.render import RenderConfig

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def workflow() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def triggers(wf: dict[Any, Any]) -> Any:
    # YAML 1.1 reads the key `on` as True.
    return wf["on"] if "on" in wf else wf[True]


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = job["steps"]
    return found


def step_using(job: dict[str, Any], action: str) -> dict[str, Any]:
    (step,) = [s for s in steps(job) if s.get("uses", "").startswith(f"{action}@")]
    return step


def makefile_dockerfiles() -> set[str]:
    found = re.search(r"^DOCKERFILES := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found
    return set(found.group(1).split())


def test_runs_on_version_tags_only_with_no_default_rights() -> None:
    wf = workflow()
    assert triggers(wf) == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}
    assert wf["permissions"] == {}
    # Only the PyPI upload gets an OIDC token.
    tokens = [name for name, job in wf["jobs"].items() if "id-token" in job["permissions"]]
    assert tokens == ["pypi"]


def test_every_action_is_pinned_to_a_commit() -> None:
    text = WORKFLOW.read_text()
    uses = re.findall(r"uses: (\S+)@(\S+)(.*)$", text, re.M)
    assert uses
    for action, ref, comment in uses:
        assert re.fullmatch(r"[0-9a-f]{40}", ref), f"{action}@{ref}"
        assert re.fullmatch(r" # v\d+\.\d+\.\d+", comment), f"{action}: name the tag"


def test_every_dockerfile_is_built_with_provenance_and_an_sbom() -> None:
    job = workflow()["jobs"]["images"]
    matrix = job["strategy"]["matrix"]["include"]
    assert {m["dockerfile"] for m in matrix} == makefile_dockerfiles()
    build = step_using(job, "docker/build-push-action")["with"]
    assert build["push"] is True
    assert build["provenance"] == "mode=max"
    assert build["sbom"] is True
    assert build["file"] == "${{ matrix.dockerfile }}"
    assert build["context"] == "."


def test_images_are_pushed_under_the_names_the_chart_and_the_renderer_use() -> None:
    wf = workflow()
    prefix = wf["env"]["IMAGE_PREFIX"]
    names = {m["image"] for m in wf["jobs"]["images"]["strategy"]["matrix"]["include"]}
    values = yaml.safe_load((ROOT / "charts" / "pdfleet" / "values.yaml").read_text())
    router_repository, _, router_tag = RenderConfig().router_image.rpartition(":")
    assert values["image"]["repository"] == f"{prefix}/operator"
    assert router_repository == f"{prefix}/vllm-router"
    # The engine image the README's example and the fault scenario use.
    assert re.search(rf"image: {re.escape(prefix)}/worker:\d", (ROOT / "README.md").read_text())
    assert names == {"operator", "vllm-router", "worker"}
    tagging = next(s for s in steps(wf["jobs"]["images"]) if s.get("id") == "tag")["run"]
    assert 'vllm-router) tag="$ROUTER"' in tagging
    pins = (ROOT / "router-image" / "requirements.txt").read_text()
    assert f"\nvllm-router=={router_tag}\n" in pins


def test_the_chart_goes_to_an_oci_registry_with_the_toolchains_helm() -> None:
    wf = workflow()
    toolchain = (ROOT / "e2e" / "platform" / "toolchain.sh").read_text()
    helm = re.search(r"^HELM_VERSION=(\S+)", toolchain, re.M)
    assert helm and wf["env"]["HELM_VERSION"] == helm.group(1)
    assert wf["env"]["CHART_REPOSITORY"].startswith("oci://")
    job = wf["jobs"]["chart"]
    script = "\n".join(s.get("run", "") for s in steps(job))
    assert "helm package charts/pdfleet" in script
    assert 'helm push "$RUNNER_TEMP/chart/pdfleet-${VERSION}.tgz" "$CHART_REPOSITORY"' in script
    # The chart is pushed after its images exist.
    assert "images" in job["needs"]


def test_the_distribution_is_published_last_by_trusted_publishing() -> None:
    jobs = workflow()["jobs"]
    pypi = jobs["pypi"]
    assert set(pypi["needs"]) == {"dist", "images", "chart"}
    assert pypi["permissions"] == {"id-token": "write"}
    assert pypi["environment"]["name"] == "pypi"
    step_using(pypi, "pypa/gh-action-pypi-publish")
    build = "\n".join(s.get("run", "") for s in steps(jobs["dist"]))
    assert "python -m build" in build and "twine check --strict" in build


def test_pre_commit_runs_the_actionlint_the_makefile_builds() -> None:
    makefile = (ROOT / "Makefile").read_text()
    version = re.search(r"^ACTIONLINT_VERSION := (\S+)$", makefile, re.M)
    assert version
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    assert f"/pdfleet/tools/actionlint-{version.group(1)}/actionlint" in hooks
    assert "$(ACTIONLINT) -shellcheck= -pyflakes= .github/workflows/*.yml" in makefile
