"""A real Prometheus for tests, the e2e suite and the demo.

Runs the toolchain's ``prometheus`` (built by ``e2e/platform/toolchain.sh`` with Kubernetes service
discovery) as a child process with a generated configuration, a temporary TSDB and short
scrape and evaluation intervals (1 s by default), bound to one address: loopback, or an
address inside the private network namespace of ``e2e/platform/netns.sh``.

Two ways to find targets:

* **static targets** (:func:`static_job`): ``host:port`` plus labels, for simulators started
  on loopback; label them like the operator's pods (``namespace``, ``pdfleet_service``,
  ``pdfleet_role``) and the autoscaler's PromQL reads them as it would in a cluster;
* **Kubernetes service discovery** (:func:`kubernetes_sd_job`): the scrape job we ship to
  users, ``operator/src/pdfleet/autoscale/scrape/kubernetes_sd.yaml``, loaded from that file
  (one source) with only the API server access (``kubeconfig_file``), the namespaces and the
  interval filled in; its relabelling is used unchanged.

Configuration generation is pure (:func:`prometheus_config` and the job builders); the
process is :class:`Prometheus`. Typical use in the e2e suite::

    with start_for_cluster(cluster, workdir) as prom:  # or start_kubernetes_sd(kubeconfig, ...)
        prom.wait_for_targets(2, timeout_s=60)
        PrometheusSource(prom.url).window(...)

Command line (inside ``e2e/platform/netns.sh`` for Kubernetes SD)::

    python -m e2e.platform.prometheus --kubeconfig PATH [--host 127.0.0.1] [--port 9090]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from e2e.platform.cluster import REPO_ROOT, Cluster, free_port, toolchain_bin_dir

Manifest = dict[str, Any]

#: The scrape job shipped to users of plain Prometheus (no Prometheus Operator).
KUBERNETES_SD_FILE = REPO_ROOT / "operator/src/pdfleet/autoscale/scrape/kubernetes_sd.yaml"
#: Binaries this module needs from the toolchain.
PROMETHEUS_BINARIES = ("prometheus", "promtool")


class PrometheusError(RuntimeError):
    """Prometheus did not start, answered an error, or rejected its configuration."""


# ---------------------------------------------------------------------------------------
# Configuration (pure)
# ---------------------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``1s``, anything shorter as milliseconds."""
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {seconds}")
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True)
class StaticTarget:
    """One ``host:port`` to scrape and the labels every series from it gets."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def static_job(
    targets: Sequence[StaticTarget],
    job_name: str = "pdfleet-static",
    scrape_interval_s: float = 1.0,
    metrics_path: str = "/metrics",
    honor_labels: bool = False,
) -> Manifest:
    """A scrape job with fixed targets, one ``static_configs`` entry per target."""
    job: Manifest = {
        "job_name": job_name,
        "scrape_interval": duration(scrape_interval_s),
        "scrape_timeout": duration(scrape_interval_s),
        "metrics_path": metrics_path,
        "static_configs": [{"targets": [t.address], "labels": dict(t.labels)} for t in targets],
    }
    if honor_labels:
        job["honor_labels"] = True
    return job


def operator_job(
    address: str, release_namespace: str, pod: str, scrape_interval_s: float = 1.0
) -> Manifest:
    """The operator's own ``/metrics`` at ``address``, labelled as the chart's ServiceMonitor
    (or PodMonitor) has Prometheus label it: ``honor_labels``, so the per-service series keep
    the service's ``namespace``, while the process-level ones (``pdfleet_leader``, the
    reconcile series) get the release namespace, which the chart's alerts select on, and the
    ``pod`` the dashboard's leader panel shows."""
    target = StaticTarget(address, {"namespace": release_namespace, "pod": pod})
    return static_job([target], "pdfleet-operator", scrape_interval_s, honor_labels=True)


def shipped_kubernetes_sd_jobs(path: Path = KUBERNETES_SD_FILE) -> list[Manifest]:
    """The scrape jobs of the shipped file (a YAML list, pasted under ``scrape_configs:``)."""
    jobs = yaml.safe_load(path.read_text())
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise ValueError(f"{path} is not a list of scrape jobs")
    return jobs


def kubernetes_sd_job(
    shipped: Manifest,
    kubeconfig: Path,
    namespaces: Sequence[str] = (),
    scrape_interval_s: float = 1.0,
) -> Manifest:
    """``shipped`` pointed at a cluster by kubeconfig, with a test scrape interval.

    Only the API server access (``kubeconfig_file``), the namespaces and the interval are
    added; ``relabel_configs`` and everything else stay exactly as users get them.
    """
    job = copy.deepcopy(shipped)
    job["scrape_interval"] = duration(scrape_interval_s)
    job["scrape_timeout"] = duration(scrape_interval_s)
    for sd in job["kubernetes_sd_configs"]:
        sd["kubeconfig_file"] = str(kubeconfig)
        if namespaces:
            sd["namespaces"] = {"names": list(namespaces)}
    return job


def prometheus_config(
    jobs: Sequence[Manifest],
    scrape_interval_s: float = 1.0,
    evaluation_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> Manifest:
    """A whole ``prometheus.yml``: global intervals, the given scrape jobs and rule files."""
    config: Manifest = {
        "global": {
            "scrape_interval": duration(scrape_interval_s),
            "scrape_timeout": duration(scrape_interval_s),
            "evaluation_interval": duration(evaluation_interval_s),
        },
        "scrape_configs": [copy.deepcopy(j) for j in jobs],
    }
    if rule_files:
        config["rule_files"] = [str(f) for f in rule_files]
    return config


def listen_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def command_line(binary: Path, config_file: Path, tsdb_dir: Path, address: str) -> list[str]:
    """The ``prometheus`` argv: our config, a throwaway TSDB, the HTTP API on ``address``."""
    return [
        str(binary),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={tsdb_dir}",
        "--storage.tsdb.retention.time=1h",
        f"--web.listen-address={address}",
        "--web.enable-lifecycle",
        "--log.level=info",
    ]


def parse_data(body: Mapping[str, Any]) -> Any:
    """The ``data`` of any API answer (a query's result, alerts, label values); raises on an
    API error."""
    if body.get("status") != "success":
        raise PrometheusError(f"request failed: {body.get('errorType')}: {body.get('error')}")
    return body.get("data")


def parse_vector(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The samples of an instant query's JSON answer; raises on an API error."""
    data = parse_data(body) or {}
    if data.get("resultType") == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    result: list[dict[str, Any]] = data.get("result") or []
    return result


# ---------------------------------------------------------------------------------------
# Binaries
# ---------------------------------------------------------------------------------------


def prometheus_bin_dir(bin_dir: Path | None = None) -> Path:
    """The toolchain dir holding ``prometheus`` and ``promtool``; raises if one is missing."""
    found = bin_dir or toolchain_bin_dir()
    missing = [n for n in PROMETHEUS_BINARIES if not os.access(found / n, os.X_OK)]
    if missing:
        raise PrometheusError(
            f"missing {', '.join(missing)} in {found}; "
            "run `make toolchain` (e2e/platform/toolchain.sh)"
        )
    return found


def check_config(
    config_file: Path, bin_dir: Path | None = None, syntax_only: bool = False, timeout_s: float = 60
) -> str:
    """``promtool check config``; returns its output, raises when the config is rejected.

    ``syntax_only`` skips checking the files the config refers to (e.g. a kubeconfig).
    """
    promtool = prometheus_bin_dir(bin_dir) / "promtool"
    flags = ["--syntax-only"] if syntax_only else []
    proc = subprocess.run(
        [str(promtool), "check", "config", *flags, str(config_file)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise PrometheusError(f"promtool rejected {config_file}:\n{out}")
    return out


# ---------------------------------------------------------------------------------------
# The process
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusSettings:
    """What to run: the scrape jobs, where to listen, where to keep config, TSDB and log."""

    workdir: Path
    jobs: Sequence[Manifest]
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port on host
    scrape_interval_s: float = 1.0
    evaluation_interval_s: float = 1.0
    bin_dir: Path | None = None
    start_timeout_s: float = 30.0
    rule_files: Sequence[Path] = ()


class Prometheus:
    """A running Prometheus child process; :meth:`stop` (or ``with``) always reaps it."""

    def __init__(self, settings: PrometheusSettings) -> None:
        self.settings = settings
        self.bin_dir = prometheus_bin_dir(settings.bin_dir)
        self.port = settings.port or free_port(settings.host)
        self.address = listen_address(settings.host, self.port)
        self.url = f"http://{self.address}"
        workdir = settings.workdir
        self.config_file = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self.tsdb_dir = workdir / "data"
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._http = httpx.Client(base_url=self.url, timeout=5.0)

    # ----- lifecycle ----------------------------------------------------------------------

    def start(self) -> Prometheus:
        """Write the config, check it with promtool, start the server, wait until ready."""
        s = self.settings
        s.workdir.mkdir(parents=True, exist_ok=True)
        config = prometheus_config(
            s.jobs, s.scrape_interval_s, s.evaluation_interval_s, s.rule_files
        )
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        check_config(self.config_file, self.bin_dir)
        self._launch("wb")
        return self

    def _launch(self, log_mode: str) -> None:
        argv = command_line(
            self.bin_dir / "prometheus", self.config_file, self.tsdb_dir, self.address
        )
        if self._http.is_closed:
            self._http = httpx.Client(base_url=self.url, timeout=5.0)
        self._log = open(self.log_path, log_mode)  # noqa: SIM115 - closed in stop()
        self._popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            self.wait_ready(self.settings.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def restart(self) -> Prometheus:
        """Start again after :meth:`stop`: same address, configuration and TSDB (the
        samples scraped before the stop stay queryable); the log is appended to."""
        self.stop()
        self._launch("ab")
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; idempotent."""
        with contextlib.suppress(Exception):
            self._http.close()
        p = self._popen
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def exit_code(self) -> int | None:
        """The process's exit status, None while it runs (or before it started)."""
        return None if self._popen is None else self._popen.poll()

    def log(self) -> str:
        """Everything Prometheus wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # ----- waiting --------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until ``/-/ready`` answers 200; fail early if the process exits."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if self._popen is not None and self._popen.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {self._popen.returncode}:\n{self.log()[-4000:]}"
                )
            try:
                r = self._http.get("/-/ready", timeout=1.0)
                if r.status_code == 200:
                    return
                last = r.status_code
            except httpx.HTTPError as err:
                last = err
            time.sleep(0.1)
        raise PrometheusError(f"{self.url} not ready after {timeout_s}s (last: {last!r})")

    def wait_for(
        self, probe: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.5
    ) -> None:
        """Poll ``probe`` until it is true; TimeoutError naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not probe():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(interval_s)

    def wait_for_targets(
        self, count: int, timeout_s: float = 60.0, job: str | None = None
    ) -> list[dict[str, Any]]:
        """Block until ``count`` active targets (of ``job``, if given) are up; return them."""
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            nonlocal found
            found = [
                t
                for t in self.active_targets()
                if t.get("health") == "up" and (job is None or t["labels"].get("job") == job)
            ]
            return len(found) >= count

        self.wait_for(enough, timeout_s, f"{count} healthy targets")
        return found

    # ----- HTTP API -------------------------------------------------------------------------

    def _get(self, path: str, params: Mapping[str, str | float] | None = None) -> Any:
        """The JSON answer of a GET of the HTTP API. A server error raises as HTTP; an API
        error comes as a 4xx with Prometheus' JSON error, which `parse_data` raises with
        its message."""
        r = self._http.get(path, params=params)
        if r.status_code >= 500:
            r.raise_for_status()
        return r.json()

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query, now or ``at`` (Unix seconds); the samples as
        ``[{"metric": {...}, "value": [t, "v"]}]``."""
        params: dict[str, str | float] = {"query": promql}
        if at is not None:
            params["time"] = at
        return parse_vector(self._get("/api/v1/query", params))

    def scalar(self, promql: str) -> float:
        """The value of a one-sample answer; NaN when there is none (or several)."""
        result = self.query(promql)
        if len(result) != 1:
            return math.nan
        return float(result[0]["value"][1])

    def query_range(
        self, promql: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        """A range query (what a Grafana time series panel sends); the series as
        ``[{"metric": {...}, "values": [[t, "v"], ...]}]``."""
        params: dict[str, str | float] = {
            "query": promql, "start": start, "end": end, "step": step_s
        }  # fmt: skip
        answer = self._get("/api/v1/query_range", params)
        result: list[dict[str, Any]] = parse_data(answer)["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """Values of ``label`` on the series ``match`` selects (Grafana's ``label_values``)."""
        path = f"/api/v1/label/{label}/values"
        values: list[str] = parse_data(self._get(path, {"match[]": match}))
        return values

    def alerts(self) -> list[dict[str, Any]]:
        """``/api/v1/alerts``: every pending or firing alert of the loaded rules."""
        found: list[dict[str, Any]] = parse_data(self._get("/api/v1/alerts"))["alerts"]
        return found

    def rule_groups(self) -> list[dict[str, Any]]:
        """``/api/v1/rules``: the loaded rule groups, with each rule's health and last error."""
        groups: list[dict[str, Any]] = parse_data(self._get("/api/v1/rules"))["groups"]
        return groups

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets``' active targets (labels after relabelling, health, lastError)."""
        answer = self._get("/api/v1/targets", {"state": "active"})
        targets: list[dict[str, Any]] = parse_data(answer)["activeTargets"]
        return targets


def start(settings: PrometheusSettings) -> Prometheus:
    """Start Prometheus with ``settings`` and return it once ready (stop it when done)."""
    return Prometheus(settings).start()


def start_static(
    targets: Sequence[StaticTarget],
    workdir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    scrape_interval_s: float = 1.0,
) -> Prometheus:
    """Prometheus scraping fixed ``targets`` (e.g. simulators on loopback)."""
    job = static_job(targets, scrape_interval_s=scrape_interval_s)
    return start(PrometheusSettings(workdir, [job], host, port, scrape_interval_s))


def start_kubernetes_sd(
    kubeconfig: Path,
    workdir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    namespaces: Sequence[str] = (),
    scrape_interval_s: float = 1.0,
    extra_jobs: Sequence[Manifest] = (),
    rule_files: Sequence[Path] = (),
) -> Prometheus:
    """Prometheus discovering pdfleet workers in the cluster of ``kubeconfig``.

    Uses the shipped ``kubernetes_sd.yaml`` job(s) with their relabelling unchanged; series
    carry ``namespace``, ``pdfleet_service``, ``pdfleet_role`` and ``pod``. Pod IPs must be
    reachable from here (inside ``e2e/platform/netns.sh``). ``extra_jobs`` (e.g.
    :func:`operator_job`) are scraped beside them; ``rule_files`` are evaluated.
    """
    jobs = [
        kubernetes_sd_job(j, kubeconfig.resolve(), namespaces, scrape_interval_s)
        for j in shipped_kubernetes_sd_jobs()
    ]
    settings = PrometheusSettings(
        workdir, [*jobs, *extra_jobs], host, port, scrape_interval_s, rule_files=rule_files
    )
    return start(settings)


def start_for_cluster(
    cluster: Cluster,
    workdir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    namespaces: Sequence[str] = (),
    extra_jobs: Sequence[Manifest] = (),
    rule_files: Sequence[Path] = (),
) -> Prometheus:
    """:func:`start_kubernetes_sd` against a running local cluster (``e2e.platform.cluster``)."""
    return start_kubernetes_sd(
        cluster.kubeconfig, workdir, host, port, namespaces,
        extra_jobs=extra_jobs, rule_files=rule_files,
    )  # fmt: skip


@contextlib.contextmanager
def running(settings: PrometheusSettings) -> Iterator[Prometheus]:
    """``with running(settings) as prom:``: started, and always stopped."""
    prom = Prometheus(settings)
    try:
        yield prom.start()
    finally:
        prom.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run Prometheus with Kubernetes SD against a kubeconfig until interrupted."""
    p = argparse.ArgumentParser(prog="python -m e2e.platform.prometheus", description=main.__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--workdir", type=Path, default=Path.home() / ".cache/pdfleet/prometheus")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--namespace", action="append", default=[], help="repeatable; default all")
    args = p.parse_args(argv)
    with start_kubernetes_sd(
        args.kubeconfig, args.workdir, args.host, args.port, args.namespace
    ) as prom:
        print(prom.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while prom.exit_code() is None:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
