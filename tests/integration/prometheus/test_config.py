"""Prometheus configuration: the shipped scrape job and the generated test configs.

The pure builders of ``e2e.platform.prometheus`` are table-tested; the shipped
``kubernetes_sd.yaml`` and every generated config go through the toolchain's
``promtool check config`` (a missing promtool is a failure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.platform import prometheus as p
from e2e.platform.cluster import REPO_ROOT

PODMONITOR = REPO_ROOT / "operator/src/pdfleet/autoscale/scrape/podmonitor.yaml"


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("seconds", "expected"), [(1, "1s"), (15, "15s"), (0.5, "500ms"), (2.25, "2250ms")]
)
def test_duration(seconds: float, expected: str) -> None:
    assert p.duration(seconds) == expected


def test_duration_must_be_positive() -> None:
    with pytest.raises(ValueError):
        p.duration(0)


@pytest.mark.parametrize(
    ("host", "expected"), [("127.0.0.1", "127.0.0.1:9090"), ("::1", "[::1]:9090")]
)
def test_listen_address(host: str, expected: str) -> None:
    assert p.listen_address(host, 9090) == expected


def test_static_job_labels_each_target() -> None:
    targets = [
        p.StaticTarget("127.0.0.1:8001", {"pdfleet_role": "prefill"}),
        p.StaticTarget("127.0.0.1:8002", {"pdfleet_role": "decode"}),
    ]
    job = p.static_job(targets, scrape_interval_s=1)
    assert job["scrape_interval"] == job["scrape_timeout"] == "1s"
    assert job["static_configs"] == [
        {"targets": ["127.0.0.1:8001"], "labels": {"pdfleet_role": "prefill"}},
        {"targets": ["127.0.0.1:8002"], "labels": {"pdfleet_role": "decode"}},
    ]


def test_kubernetes_sd_job_keeps_the_shipped_relabelling() -> None:
    (shipped,) = p.shipped_kubernetes_sd_jobs()
    job = p.kubernetes_sd_job(shipped, Path("/x/kubeconfig"), ["a", "b"], scrape_interval_s=1)
    assert job["relabel_configs"] == shipped["relabel_configs"]
    assert job["job_name"] == shipped["job_name"]
    assert job["kubernetes_sd_configs"] == [
        {"role": "pod", "kubeconfig_file": "/x/kubeconfig", "namespaces": {"names": ["a", "b"]}}
    ]
    assert job["scrape_interval"] == "1s"
    assert shipped["scrape_interval"] == "15s", "the shipped job itself is not modified"
    assert "kubeconfig_file" not in shipped["kubernetes_sd_configs"][0]


def test_kubernetes_sd_job_without_namespaces_watches_all() -> None:
    (shipped,) = p.shipped_kubernetes_sd_jobs()
    job = p.kubernetes_sd_job(shipped, Path("/k"))
    assert "namespaces" not in job["kubernetes_sd_configs"][0]


def test_the_shipped_job_yields_the_labels_the_promql_selects_on() -> None:
    from pdfleet.autoscale import promql

    (shipped,) = p.shipped_kubernetes_sd_jobs()
    targets = {r.get("target_label") for r in shipped["relabel_configs"]}
    assert {promql.SERVICE_LABEL, promql.ROLE_LABEL, promql.NAMESPACE_LABEL} <= targets


def test_podmonitor_relabels_like_the_plain_job() -> None:
    """Both shipped ways to scrape produce the same labels from the same sources."""
    (shipped,) = p.shipped_kubernetes_sd_jobs()
    plain = {
        (tuple(r["source_labels"]), r["target_label"])
        for r in shipped["relabel_configs"]
        if "target_label" in r
    }
    monitor = yaml.safe_load(PODMONITOR.read_text())
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    operator = {(tuple(r["sourceLabels"]), r["targetLabel"]) for r in endpoint["relabelings"]}
    assert operator == plain


def test_prometheus_config_globals() -> None:
    config = p.prometheus_config([p.static_job([])], scrape_interval_s=1, evaluation_interval_s=2)
    assert config["global"] == {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "2s",
    }
    assert [j["job_name"] for j in config["scrape_configs"]] == ["pdfleet-static"]


def test_command_line_binds_one_address(tmp_path: Path) -> None:
    argv = p.command_line(Path("/b/prometheus"), tmp_path / "c.yml", tmp_path / "d", "10.244.1.5:9")
    assert argv[0] == "/b/prometheus"
    assert "--web.listen-address=10.244.1.5:9" in argv
    assert f"--storage.tsdb.path={tmp_path / 'd'}" in argv


def test_parse_vector() -> None:
    ok = {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "2"]}]}}
    assert p.parse_vector(ok) == [{"value": [1, "2"]}]
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}}
    assert p.parse_vector(scalar) == [{"metric": {}, "value": [1, "3"]}]
    with pytest.raises(p.PrometheusError, match="bad_data"):
        p.parse_vector({"status": "error", "errorType": "bad_data", "error": "parse error"})


# ----- promtool ---------------------------------------------------------------------------


def test_promtool_accepts_the_shipped_kubernetes_sd_job(tmp_path: Path) -> None:
    """The file is pasted under ``scrape_configs:`` as it is: check exactly that."""
    text = p.KUBERNETES_SD_FILE.read_text()
    indented = "".join(f"  {line}" if line.strip() else line for line in text.splitlines(True))
    path = tmp_path / "prometheus.yml"
    path.write_text("scrape_configs:\n" + indented)
    assert "SUCCESS" in p.check_config(path)


def test_promtool_accepts_the_generated_kubernetes_sd_config(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    jobs = [p.kubernetes_sd_job(j, kubeconfig, ["ns"]) for j in p.shipped_kubernetes_sd_jobs()]
    assert "SUCCESS" in p.check_config(_write(tmp_path, p.prometheus_config(jobs)))


def test_promtool_accepts_the_generated_static_config(tmp_path: Path) -> None:
    job = p.static_job([p.StaticTarget("127.0.0.1:8000", {"pdfleet_role": "decode"})])
    assert "SUCCESS" in p.check_config(_write(tmp_path, p.prometheus_config([job])))


def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    """The check has teeth: a relabel rule with a bad regex is refused."""
    job = p.static_job([])
    job["relabel_configs"] = [{"source_labels": ["a"], "regex": "(", "target_label": "b"}]
    with pytest.raises(p.PrometheusError, match="promtool rejected"):
        p.check_config(_write(tmp_path, p.prometheus_config([job])))
